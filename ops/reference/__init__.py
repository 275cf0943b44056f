"""The reference domain: a document-amendments ledger used by the demo, the simulator
and the benchmarks.

Specification (the handler in ``domain``/``pg``/``memory`` and the independent
``oracle`` both implement it)
- Record key: the document id (UTF-8, 1..256 bytes, no NUL). Documents are keyed by
  (topic, doc id); all records of a document are in one partition.
- Record value: UTF-8 JSON object ``{"kind": "put"|"correct"|"withdraw", "rev": R,
  "body": "..."}``; ``rev`` a positive integer (not a boolean); ``body`` a string without
  NUL (required for put and correct, ignored for withdraw); other fields ignored.
- put: creates the document at rev 1. correct: replaces the body at rev current + 1.
  withdraw: marks it withdrawn at rev current + 1, keeping the last body.
- Rejection reasons (the Reject reason string, stored in quarantine):
  ``malformed: <what>`` (no key / key is not UTF-8 / key is empty, longer than 256
  bytes or contains NUL / no value / value is not UTF-8 / value is not JSON / value is
  not a JSON object / kind is missing or unknown / rev is missing or not a positive
  integer / body is missing, not a string or not storable);
  ``document-exists`` (put of an existing document); ``put-revision-not-1: rev R``;
  ``missing-document`` (correct/withdraw of an unknown document);
  ``withdrawn-document`` (any change after withdrawal);
  ``stale-revision: rev R, current C`` (R <= C);
  ``skipped-revision: rev R, current C`` (R > C + 1).
  Checks apply in that order: malformed, then existence/withdrawal, then revision.
- Accepted: the document row takes the new revision, body, withdrawn flag and the
  record's partition/offset; an outbox row (topic, doc_id, seq) is appended with
  seq = number of accepted changes of the document (1, 2, 3, ...; equal to the
  revision), version = rev, kind, body (null for withdraw), source partition/offset.
"""

from ops.reference.domain import decide_batch, parse_record
from ops.reference.generate import (
    CLASSES,
    GeneratedRecord,
    generate,
    partition_for,
    to_source_records,
)
from ops.reference.memory import memory_ref_handler
from ops.reference.oracle import Expected, check, diff, fold, fold_prefix
from ops.reference.pg import ddl, ensure_tables, grant_sql, make_pg_handler, reference

__all__ = [
    "CLASSES",
    "Expected",
    "GeneratedRecord",
    "check",
    "ddl",
    "decide_batch",
    "diff",
    "ensure_tables",
    "fold",
    "fold_prefix",
    "generate",
    "grant_sql",
    "make_pg_handler",
    "memory_ref_handler",
    "parse_record",
    "partition_for",
    "reference",
    "to_source_records",
]
