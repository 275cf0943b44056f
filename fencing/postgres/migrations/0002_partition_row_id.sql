-- 0002: a surrogate id per partition row. The fence statement of `process` names the row
-- by this integer so it can travel in the same round trip as BEGIN (see fencing/pgsql.py).
ALTER TABLE partitions ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY;
ALTER TABLE partitions ADD CONSTRAINT partitions_id_key UNIQUE (id);
