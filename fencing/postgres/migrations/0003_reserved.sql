-- 0003: reserved. The handler-failures work (another branch) owns migration 0003 (quarantine
-- columns for the exception, an attempts table). This placeholder only keeps the numbering
-- without gaps on this branch; at merge the real 0003 replaces it. 0004 does not depend on
-- anything 0003 creates.
SELECT 1;
