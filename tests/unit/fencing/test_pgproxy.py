"""fencing.testing.pgproxy framing and actions, against a tiny loopback upstream that speaks
the framing."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator

import pytest

from fencing.testing.pgproxy import Action, PgProxy, Rule, rewrite_dsn


def msg(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


class Upstream:
    """Reads the startup packet, then answers every Sync or Query with CommandComplete+Ready."""

    def __init__(self) -> None:
        self.seen: list[tuple[bytes, bytes]] = []
        self.server: asyncio.Server | None = None

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            n = struct.unpack("!i", await r.readexactly(4))[0]
            self.seen.append((b"startup", await r.readexactly(n - 4)))
            while True:
                head = await r.readexactly(5)
                body = await r.readexactly(struct.unpack("!i", head[1:])[0] - 4)
                self.seen.append((head[:1], body))
                if head[:1] in (b"Q", b"S"):
                    w.write(msg(b"C", b"OK\0") + msg(b"Z", b"I"))
                    await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            w.close()


@pytest.fixture
async def setup() -> AsyncIterator[tuple[Upstream, PgProxy]]:
    up = Upstream()
    up.server = await asyncio.start_server(up.handle, "127.0.0.1", 0)
    port = up.server.sockets[0].getsockname()[1]
    async with PgProxy("127.0.0.1", port) as proxy:
        yield up, proxy
    up.server.close()


async def connect(proxy: PgProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
    w.write(struct.pack("!ii", 8, 80877103))  # SSLRequest
    await w.drain()
    assert await r.readexactly(1) == b"N"
    startup = struct.pack("!i", 196608) + b"user\0u\0\0"
    w.write(struct.pack("!i", len(startup) + 4) + startup)
    await w.drain()
    return r, w


async def closed(r: asyncio.StreamReader) -> bool:
    """True when the proxy closed the connection (EOF or reset) without sending anything."""
    try:
        return await asyncio.wait_for(r.read(), 5) == b""
    except ConnectionResetError:
        return True


async def reply(r: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(r.readexactly(len(msg(b"C", b"OK\0") + msg(b"Z", b"I"))), 5)


async def test_passes_through_and_answers_ssl(setup: tuple[Upstream, PgProxy]) -> None:
    up, proxy = setup
    r, w = await connect(proxy)
    w.write(msg(b"Q", b"SELECT 1\0"))
    assert (await reply(r)).endswith(b"Z\0\0\0\x05I")
    assert up.seen[0][0] == b"startup" and up.seen[1] == (b"Q", b"SELECT 1\0")
    w.close()


@pytest.mark.parametrize("action", [Action.CUT_BEFORE, Action.CUT_AFTER])
async def test_cut_before_and_after(setup: tuple[Upstream, PgProxy], action: Action) -> None:
    up, proxy = setup
    rule = proxy.add_rule("commit", action)
    r, w = await connect(proxy)
    w.write(msg(b"Q", b"COMMIT;\0"))
    await asyncio.wait_for(rule.fired.wait(), 5)
    assert await closed(r)  # cut, no reply
    forwarded = (b"Q", b"COMMIT;\0") in up.seen
    assert forwarded is (action is Action.CUT_AFTER)
    r2, w2 = await connect(proxy)  # fired once: the next COMMIT passes
    w2.write(msg(b"Q", b"COMMIT;\0"))
    await reply(r2)
    w2.close()


async def test_extended_protocol_matches_bind_of_cached_statement(
        setup: tuple[Upstream, PgProxy]) -> None:
    up, proxy = setup
    rule = proxy.add_rule("insert into claims", Action.CUT_BEFORE, times=1)
    r, w = await connect(proxy)
    w.write(msg(b"P", b"s1\0INSERT INTO claims VALUES ($1)\0\0\0") + msg(b"S", b""))
    await reply(r)  # prepared: Parse alone does not fire
    w.write(msg(b"B", b"\0s2\0") + msg(b"S", b""))  # another statement passes
    await reply(r)
    w.write(msg(b"B", b"\0s1\0") + msg(b"E", b"\0\0\0\0\0") + msg(b"S", b""))
    await asyncio.wait_for(rule.fired.wait(), 5)
    assert await closed(r)
    assert (b"B", b"\0s1\0") not in up.seen


async def test_hold_reply_until_release(setup: tuple[Upstream, PgProxy]) -> None:
    _, proxy = setup
    rule = proxy.add_rule("commit", Action.HOLD_REPLY)
    r, w = await connect(proxy)
    w.write(msg(b"Q", b"COMMIT\0"))
    await asyncio.wait_for(rule.fired.wait(), 5)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(r.readexactly(1), 0.2)
    proxy.release()
    assert (await reply(r)).startswith(b"C")
    w.close()


async def test_refuse_and_accept_again(setup: tuple[Upstream, PgProxy]) -> None:
    _, proxy = setup
    r, w = await connect(proxy)
    await proxy.refuse(True)
    assert await closed(r)  # open connections dropped
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", proxy.port)
    await proxy.refuse(False)
    r, w = await connect(proxy)
    w.write(msg(b"Q", b"SELECT 1\0"))
    await reply(r)
    w.close()


def test_rewrite_dsn() -> None:
    assert rewrite_dsn("postgresql://u:p@db:5432/x?sslmode=disable", "127.0.0.1", 7) == (
        "postgresql://u:p@127.0.0.1:7/x?sslmode=disable")
    assert rewrite_dsn("postgresql://db/x", "h", 1) == "postgresql://h:1/x"


def test_exact_rule_matches_the_whole_statement_only() -> None:
    exact = Rule("COMMIT", Action.HOLD_REPLY, exact=True)
    assert exact.matches(b"commit\0") and exact.matches(b" COMMIT \0")
    assert not exact.matches(b"COMMIT;\0") and not exact.matches(b"SELECT 'commit'\0")
    assert Rule("COMMIT", Action.HOLD_REPLY).matches(b"COMMIT;\0")


async def test_statements_lists_every_query_and_every_bind_of_a_parsed_statement(
        setup: tuple[Upstream, PgProxy]) -> None:
    _up, proxy = setup
    r, w = await connect(proxy)
    w.write(msg(b"Q", b"SELECT 1\0"))
    w.write(msg(b"P", b"s1\0INSERT INTO members VALUES ($1)\0\0\0") + msg(b"S", b""))
    for _ in range(2):  # a cached prepared statement: one entry per execution
        w.write(msg(b"B", b"\0s1\0") + msg(b"E", b"\0\0\0\0\0") + msg(b"S", b""))
    await w.drain()
    for _ in range(4):  # Query + three Syncs answered
        await r.readuntil(b"Z\0\0\0\x05I")
    assert [sql for _at, sql in proxy.statements] == [
        "SELECT 1", "INSERT INTO members VALUES ($1)", "INSERT INTO members VALUES ($1)"]
    w.close()
