"""``fencectl sink plan``: the ``ALTER TABLE`` statements a topic's Avro schema versions need
of its table, against the real schema registry and PostgreSQL: a v2 that adds fields gets one
``ADD COLUMN IF NOT EXISTS`` each (applied, the plan is empty: exit 0), and a column whose
type cannot hold its field is named as a problem no statement fixes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from typing import Any

import pytest

from tests.integration.pg_helpers import execute
from tests.integration.registry_support import avro
from tests.integration.workers import FENCECTL, ROOT, fresh_schema, unique

pytestmark = pytest.mark.integration

V1 = {"type": "record", "name": "Acct", "fields": [{"name": "id", "type": "long"},
                                                   {"name": "name", "type": "string"}]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"],
                                       "default": None},
                       {"name": "score", "type": "double", "default": 0.0}]}


def _plan(services: Any, schema: str, topic: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FENCE_DSN": services.dsn,
           "SCHEMA_REGISTRY_URL": services.schema_registry_url}
    return subprocess.run([*FENCECTL, "sink", "plan", "--topic", topic, "--sink",
                           f"table={schema}.{{topic}}", "--sink-key", "id", "--sink-format",
                           "avro", "--json"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def test_plan_adds_a_column_per_new_field_and_names_type_changes(services: Any) -> None:
    topic = unique("plan")
    schema = asyncio.run(fresh_schema(services.dsn))
    asyncio.run(execute(services.dsn, f'CREATE TABLE "{schema}"."{topic}" (id bigint PRIMARY '
                                   "KEY, name text NOT NULL)"))
    avro(services.schema_registry_url, topic, json.dumps(V1))({"id": 1, "name": "a"})
    empty = _plan(services, schema, topic)
    assert empty.returncode == 0, empty.stderr
    assert json.loads(empty.stdout) == {"statements": [], "problems": []}
    avro(services.schema_registry_url, topic, json.dumps(V2))(
        {"id": 1, "name": "a", "note": None, "score": 1.0})
    got = _plan(services, schema, topic)
    assert got.returncode == 1, got.stderr
    statements = json.loads(got.stdout)["statements"]
    assert statements == [
        f'ALTER TABLE "{schema}"."{topic}" ADD COLUMN IF NOT EXISTS "note" text;',
        f'ALTER TABLE "{schema}"."{topic}" ADD COLUMN IF NOT EXISTS "score" float8;']
    asyncio.run(execute(services.dsn, *statements))
    again = _plan(services, schema, topic)
    assert again.returncode == 0 and json.loads(again.stdout)["statements"] == []
    asyncio.run(execute(services.dsn, f'ALTER TABLE "{schema}"."{topic}" ALTER score TYPE bool '
                                   "USING false"))
    bad = _plan(services, schema, topic)
    assert bad.returncode == 1
    problems = json.loads(bad.stdout)["problems"]
    assert len(problems) == 1 and problems[0].startswith("column score (bool) cannot hold "
                                                         "field score (float8 in Avro")
