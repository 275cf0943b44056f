"""Handlers built by a factory with a context: nothing read from the environment, no
special-cased names (no services)."""

from __future__ import annotations

import sys
import types
from collections.abc import Sequence
from typing import Any

import pytest

from fencing.errors import ConfigError
from fencing.handler import (
    ENSURE_LOCK_PREFIX,
    HandlerContext,
    build_handler,
    handler,
    handler_factory,
    load_handler,
)
from fencing.types import ACCEPT, SourceRecord, Verdict

CTX = HandlerContext(schema="billing", group_id="g", topics=("orders",),
                     settings={"table": "orders_sink"})


def _module(**attrs: Any) -> str:
    name = f"fw_test_handlers_{len(sys.modules)}"
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return name


async def _accept(conn: Any, records: Sequence[SourceRecord]) -> list[Verdict]:
    return [ACCEPT] * len(records)


async def test_a_factory_gets_the_context_and_its_tables_are_ensured_with_it() -> None:
    seen: list[tuple[str, HandlerContext]] = []

    async def ensure(conn: Any, context: HandlerContext) -> None:
        seen.append((conn, context))

    @handler_factory(ensure_tables=ensure)
    def build(context: HandlerContext) -> Any:
        seen.append(("built", context))
        return handler(durability="durable-critical", effects="transactional")(_accept)

    loaded = build_handler(f"{_module(build=build)}:build", CTX)
    assert loaded.fn is _accept and seen == [("built", CTX)]
    assert loaded.ensure_tables is not None
    conn = _LockConn()
    await loaded.ensure_tables(conn)
    assert seen[-1] == (conn, CTX)


class _LockConn:
    """Records the statements ``ensure_tables``'s wrapper sends around the factory's set-up."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, tuple[Any, ...]]] = []
        self.closed = False

    async def execute(self, sql: str, *args: Any) -> str:
        self.sent.append((sql, args))
        return "SELECT 1"

    def is_closed(self) -> bool:
        return self.closed


async def test_a_factorys_set_up_runs_inside_the_schemas_session_lock_even_when_it_fails(
        ) -> None:
    order: list[str] = []

    async def ensure(conn: Any, context: HandlerContext) -> None:
        order.append(f"ensure after {len(conn.sent)} statement(s)")
        raise RuntimeError("no CREATE right")

    @handler_factory(ensure_tables=ensure)
    def build(context: HandlerContext) -> Any:
        return handler(durability="durable-critical", effects="transactional")(_accept)

    loaded = build_handler(f"{_module(build=build)}:build", CTX)
    assert loaded.ensure_tables is not None
    conn = _LockConn()
    with pytest.raises(RuntimeError, match="no CREATE right"):  # the set-up's own error
        await loaded.ensure_tables(conn)
    lock = f"{ENSURE_LOCK_PREFIX}{CTX.schema}"
    assert conn.sent == [("SELECT pg_advisory_lock(hashtext($1))", (lock,)),
                         ("SELECT pg_advisory_unlock(hashtext($1))", (lock,))]
    assert order == ["ensure after 1 statement(s)"]  # locked before, unlocked after


def test_a_plain_handler_loads_as_before_and_has_no_table_setup() -> None:
    spec = f"{_module(h=_accept)}:h"
    assert build_handler(spec, CTX).fn is _accept
    assert build_handler(spec, CTX).ensure_tables is None
    assert load_handler(spec) is _accept


def test_an_incoherent_handler_built_by_a_factory_is_refused_naming_it() -> None:
    @handler_factory()
    def build(context: HandlerContext) -> Any:
        return handler(durability="durable-critical", effects="loss-tolerant")(_accept)

    spec = f"{_module(build=build)}:build"
    with pytest.raises(ConfigError, match=rf"--handler {spec}: refused: .*loss-tolerant"):
        build_handler(spec, CTX)


def test_a_factory_is_not_a_handler() -> None:
    @handler_factory()
    def build(context: HandlerContext) -> Any:
        return _accept

    spec = f"{_module(build=build)}:build"
    with pytest.raises(ConfigError, match="factory"):
        load_handler(spec)

    @handler_factory()
    def broken(context: HandlerContext) -> Any:
        return None

    with pytest.raises(ConfigError, match="not a handler"):
        build_handler(f"{_module(broken=broken)}:broken", CTX)


def test_the_reference_handler_is_a_factory_following_the_schema() -> None:
    loaded = build_handler("ops.reference.pg:reference", CTX)
    assert "billing" in loaded.fn.__qualname__ and loaded.ensure_tables is not None
