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
    await loaded.ensure_tables("conn")
    assert seen[-1] == ("conn", CTX)


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
