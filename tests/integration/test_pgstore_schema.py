"""Migrations (`fencectl migrate`), upgrades, and a least-privilege worker role."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from fencing.errors import Fenced
from fencing.postgres.schema import (
    SCHEMA_VERSION,
    current_version,
    grant_worker_sql,
    load_migrations,
    migrate,
)
from fencing.postgres.store import PgFenceStore
from fencing.store import BatchCall
from fencing.types import ClaimRequest, SourceCheck, SourceFacts, Token, TopicPartition
from tests.integration.pg_helpers import (
    count_effects,
    drop_schema,
    effect_handler,
    make_records,
)

pytestmark = pytest.mark.integration

TP = TopicPartition("schema", 0)
FENCECTL = os.path.join(os.path.dirname(sys.executable), "fencectl")


def _migrate_cli(dsn: str, schema: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FENCE_DSN": dsn}
    return subprocess.run([FENCECTL, "migrate", "--schema", schema], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


async def test_fencectl_migrate_twice_is_a_no_op(pg_dsn: str) -> None:
    schema = f"fence_m_{uuid.uuid4().hex[:8]}"
    try:
        first = await asyncio.to_thread(_migrate_cli, pg_dsn, schema)
        assert first.returncode == 0, first.stderr
        assert f"now at version {SCHEMA_VERSION}" in first.stdout
        second = await asyncio.to_thread(_migrate_cli, pg_dsn, schema)
        assert second.returncode == 0, second.stderr
        assert "nothing to do" in second.stdout
        conn = await asyncpg.connect(pg_dsn)
        try:
            assert await current_version(conn, schema) == SCHEMA_VERSION
            versions = [r[0] for r in await conn.fetch(
                f'SELECT version FROM "{schema}".schema_version ORDER BY 1')]
        finally:
            await conn.close()
        assert versions == list(range(1, SCHEMA_VERSION + 1))
        bad = await asyncio.to_thread(_migrate_cli, pg_dsn, "Not-An-Identifier")
        assert bad.returncode == 2 and "schema" in bad.stderr
        assert pg_dsn not in bad.stderr + bad.stdout
    finally:
        await drop_schema(pg_dsn, schema)


async def test_concurrent_migrations_serialize(pg_dsn: str) -> None:
    schema = f"fence_m_{uuid.uuid4().hex[:8]}"
    conns = [await asyncpg.connect(pg_dsn) for _ in range(3)]
    try:
        applied = await asyncio.gather(*(migrate(c, schema) for c in conns))
        assert sorted(v for a in applied for v in a) == list(range(1, SCHEMA_VERSION + 1))
    finally:
        for c in conns:
            await c.close()
        await drop_schema(pg_dsn, schema)


async def test_upgrade_from_version_1_keeps_rows(pg_dsn: str) -> None:
    schema = f"fence_m_{uuid.uuid4().hex[:8]}"
    first = load_migrations()[0]
    conn = await asyncpg.connect(pg_dsn)
    try:
        async with conn.transaction():
            await conn.execute(f'CREATE SCHEMA "{schema}"')
            await conn.execute(f'CREATE TABLE "{schema}".schema_version (version integer PRIMARY'
                               " KEY, name text NOT NULL, applied_at timestamptz DEFAULT now())")
            await conn.execute(f'SET LOCAL search_path TO "{schema}"')
            await conn.execute(first.sql)
            await conn.execute(f'INSERT INTO "{schema}".schema_version VALUES (1, $1)', first.name)
            await conn.execute(f'INSERT INTO "{schema}".partitions (group_id, topic, partition,'
                               " epoch, frontier) VALUES ('g', 'schema', 0, 4, 40)")
        assert await migrate(conn, schema) == list(range(2, SCHEMA_VERSION + 1))
        await conn.execute(f'CREATE TABLE "{schema}".effects (topic text, partition int,'
                           ' "offset" bigint, value bytea)')
    finally:
        await conn.close()
    store = await PgFenceStore.connect(pg_dsn, group_id="g", schema=schema)
    try:
        assert await store.observe([TP]) == {TP: Token(4, 40)}
        assert await store.process(BatchCall(TP, make_records(TP, [40, 41]),
                                             effect_handler(schema)), Token(4, 40)) == Token(4, 42)
    finally:
        await store.close()
        await drop_schema(pg_dsn, schema)


def _as_role(dsn: str, role: str, password: str) -> str:
    parts = urlsplit(dsn)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, f"{role}:{password}@{host}", parts.path, parts.query, ""))


async def test_least_privilege_worker_role(pg_dsn: str, fence_schema: str) -> None:
    role, password = f"fence_w_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin = await asyncpg.connect(pg_dsn)
    may = await admin.fetchval(
        "SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user")
    if not may:
        await admin.close()
        pytest.skip("the FENCE_DSN user may not CREATE ROLE (give it CREATEROLE to run this)")
    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        for stmt in grant_worker_sql(fence_schema, role):
            await admin.execute(stmt)
        await admin.execute(f'GRANT SELECT, INSERT ON "{fence_schema}".effects TO {role}')
        worker_dsn = _as_role(pg_dsn, role, password)
        store = await PgFenceStore.connect(worker_dsn, group_id="gw", schema=fence_schema)
        try:
            tok = (await store.claim([ClaimRequest(TP, 0, "tid")], lifetime="W"))[TP]
            tok = await store.process(BatchCall(TP, make_records(TP, [0, 1, 2], bad=[1]),
                                                effect_handler(fence_schema)), tok)
            assert tok == Token(1, 3)
            assert (await store.validate([SourceCheck(TP, SourceFacts("tid", 0, 9))]))[TP].ok
            assert await store.skip(TP, tok, to_offset=5, reason="gap") == Token(1, 5)
            await store.journal([TP], lifetime="W", event="release", epoch=1)
            await store.heartbeat(lifetime="W", member_id=None, host="h", pid=1, state="up")
            with pytest.raises(Fenced):
                await store.process(BatchCall(TP, make_records(TP, [9]),
                                              effect_handler(fence_schema)), tok)
        finally:
            await store.close()
        counts = await count_effects(pg_dsn, fence_schema)
        assert (counts["effects"], counts["quarantine"]) == (2, 1)
        worker = await asyncpg.connect(worker_dsn)
        try:
            for sql in (f'DELETE FROM "{fence_schema}".journal',
                        f'UPDATE "{fence_schema}".journal SET detail = $$x$$',
                        f'DELETE FROM "{fence_schema}".partitions',
                        f'DROP TABLE "{fence_schema}".quarantine',
                        f'CREATE TABLE "{fence_schema}".mine (x int)'):
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await worker.execute(sql)
        finally:
            await worker.close()
    finally:
        await admin.execute(f'REVOKE ALL ON ALL TABLES IN SCHEMA "{fence_schema}" FROM {role}')
        await admin.execute(f'REVOKE ALL ON ALL SEQUENCES IN SCHEMA "{fence_schema}" FROM {role}')
        await admin.execute(f'REVOKE ALL ON SCHEMA "{fence_schema}" FROM {role}')
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()
