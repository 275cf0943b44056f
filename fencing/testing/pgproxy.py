"""A PostgreSQL wire-protocol TCP proxy that loses replies on purpose (for adversity tests and
the handler test kit, ``fencing.testing``).

Rules
- It follows the protocol's framing in both directions: after the startup packet (no type
  byte; an SSLRequest/GSSENCRequest first is answered ``N`` by the proxy, so clients fall
  back to plaintext), every message is a type byte plus an int32 length.
- A ``Rule`` matches a case-insensitive substring of the SQL of a simple ``Query`` or of a
  ``Parse`` (with ``exact``: the whole statement); for the extended protocol it fires on the
  ``Bind`` that executes the matched statement (so prepared, cached statements match on
  every execution, also when they were parsed before the rule was added).
- Actions: ``CUT_BEFORE`` closes both sides instead of forwarding the message (the server
  never sees it); ``CUT_AFTER`` forwards it, drops every server byte from then on, and closes
  both sides once the server sent ReadyForQuery (the server finished the command; the client
  never learns how); ``CUT_SENT`` forwards it and closes both sides at once, without waiting
  for the server (it is still executing the command; a COMMIT then completes server-side
  while the client already saw the connection drop); ``HOLD_REPLY`` forwards it and holds
  the server's reply until ``release()`` (for timeouts and cancellation while a reply is
  awaited).
- ``Rule.fired`` is set once the action took effect: ``CUT_BEFORE`` when both sides are
  closed, ``CUT_AFTER`` after the server finished and both sides are closed, ``CUT_SENT``
  once the message was written and both sides are closed, ``HOLD_REPLY``
  when the server's first reply byte is held. A rule fires ``times`` times (default once).
- ``statements`` lists every statement the server was asked to execute, in order, as
  (``time.monotonic()``, SQL text): each simple ``Query``, and each ``Bind`` resolved to the
  SQL of its ``Parse`` (so a cached prepared statement counts once per execution).
- ``refuse(True)`` closes the listener (connections are refused) and drops every open
  connection; ``refuse(False)`` listens again on the same port.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import struct
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

__all__ = ["Action", "PgProxy", "Rule", "rewrite_dsn"]

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104


class Action(enum.Enum):
    CUT_BEFORE = "cut-before"
    CUT_AFTER = "cut-after"
    CUT_SENT = "cut-sent"
    HOLD_REPLY = "hold-reply"


@dataclass(eq=False)
class Rule:
    """Match ``needle`` (case-insensitive) in SQL and apply ``action`` ``times`` times."""

    needle: str
    action: Action
    times: int = 1
    count: int = 0
    fired: asyncio.Event = field(default_factory=asyncio.Event)
    exact: bool = False  # the whole statement is the needle (``COMMIT``, not ``COMMIT;``)

    def matches(self, payload: bytes) -> bool:
        if self.count >= self.times:
            return False
        if self.exact:
            return payload.rstrip(b"\0").strip().lower() == self.needle.lower().encode()
        return self.needle.lower().encode() in payload.lower()


def rewrite_dsn(dsn: str, host: str, port: int) -> str:
    """``dsn`` with its host and port replaced (URL form: postgresql://user@host:port/db)."""
    parts = urlsplit(dsn)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class _Conn:
    def __init__(self, cw: asyncio.StreamWriter, sw: asyncio.StreamWriter) -> None:
        self.cw, self.sw = cw, sw
        self.parsed: dict[bytes, str] = {}  # prepared statement name -> SQL
        self.sql: dict[bytes, bytes] = {}  # prepared statement name -> SQL as sent
        self.cut_after: Rule | None = None
        self.hold: Rule | None = None
        self.tasks: list[asyncio.Task[None]] = []

    def close(self) -> None:
        for w in (self.cw, self.sw):
            with contextlib.suppress(Exception):
                w.close()
        try:
            me = asyncio.current_task()
        except RuntimeError:  # closed by the garbage collector after its loop stopped
            me = None
        for t in self.tasks:
            if t is not me:
                t.cancel()


class PgProxy:
    """Listen on ``listen_host``:``listen_port`` (0 = any free port); forward to ``upstream``."""

    def __init__(self, upstream_host: str, upstream_port: int, *,
                 listen_host: str = "127.0.0.1", listen_port: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.host = listen_host
        self.port = listen_port
        self.rules: list[Rule] = []
        # client messages by type after startup; ``round_trips()`` counts Query + Sync
        self.client_messages: collections.Counter[str] = collections.Counter()
        self.statements: list[tuple[float, str]] = []  # (monotonic time, SQL) per execution
        self._server: asyncio.Server | None = None
        self._conns: set[_Conn] = set()
        self._release = asyncio.Event()

    async def start(self) -> PgProxy:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        await self.refuse(True)

    async def __aenter__(self) -> PgProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def dsn(self, upstream_dsn: str) -> str:
        return rewrite_dsn(upstream_dsn, self.host, self.port)

    def add_rule(self, needle: str, action: Action, *, times: int = 1,
                 exact: bool = False) -> Rule:
        rule = Rule(needle, action, times, exact=exact)
        self.rules.append(rule)
        return rule

    def round_trips(self) -> int:
        """Client round trips so far: each simple Query and each extended-protocol Sync."""
        return self.client_messages["Q"] + self.client_messages["S"]

    def release(self) -> None:
        """Deliver held replies (and every later one) to the clients."""
        self._release.set()

    def drop_all(self) -> None:
        for conn in list(self._conns):
            conn.close()
        self._conns.clear()

    async def refuse(self, refusing: bool) -> None:
        if refusing:
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()
                self._server = None
            self.drop_all()
        elif self._server is None:
            self._server = await asyncio.start_server(self._handle, self.host, self.port)

    def _match(self, payload: bytes) -> Rule | None:
        for rule in self.rules:
            if rule.matches(payload):
                return rule
        return None

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            sr, sw = await asyncio.open_connection(*self.upstream)
        except OSError:
            cw.close()
            return
        conn = _Conn(cw, sw)
        self._conns.add(conn)
        try:
            while True:  # startup: int32 length, int32 code, no type byte
                head = await cr.readexactly(8)
                length, code = struct.unpack("!ii", head)
                body = await cr.readexactly(length - 8)
                if code in (_SSL_REQUEST, _GSSENC_REQUEST):
                    cw.write(b"N")
                    await cw.drain()
                    continue
                sw.write(head + body)
                await sw.drain()
                break
            conn.tasks = [asyncio.ensure_future(self._client_to_server(conn, cr)),
                          asyncio.ensure_future(self._server_to_client(conn, sr))]
            await asyncio.gather(*conn.tasks, return_exceptions=True)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            conn.close()
            self._conns.discard(conn)

    async def _client_to_server(self, conn: _Conn, cr: asyncio.StreamReader) -> None:
        try:
            while True:
                head = await cr.readexactly(5)
                body = await cr.readexactly(struct.unpack("!i", head[1:])[0] - 4)
                self.client_messages[head[:1].decode("latin-1")] += 1
                rule = self._rule_for(conn, head[:1], body)
                if rule is not None:
                    rule.count += 1
                    if rule.action is Action.CUT_BEFORE:
                        conn.close()
                        rule.fired.set()
                        return
                    if rule.action is Action.CUT_SENT:
                        conn.sw.write(head + body)
                        await conn.sw.drain()
                        conn.close()
                        rule.fired.set()
                        return
                    if rule.action is Action.CUT_AFTER:
                        conn.cut_after = rule
                    else:
                        conn.hold = rule
                conn.sw.write(head + body)
                await conn.sw.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if conn.cut_after is None and conn.hold is None:
                conn.close()

    def _record(self, conn: _Conn, kind: bytes, body: bytes) -> None:
        if kind == b"Q":
            self.statements.append((time.monotonic(), body.rstrip(b"\0").decode(errors="replace")))
        elif kind == b"P":
            name, _, rest = body.partition(b"\0")
            conn.parsed[name] = rest.partition(b"\0")[0].decode(errors="replace")
        elif kind == b"B":
            stmt = body.split(b"\0", 2)[1]
            self.statements.append((time.monotonic(), conn.parsed.get(stmt, "?")))

    def _rule_for(self, conn: _Conn, kind: bytes, body: bytes) -> Rule | None:
        self._record(conn, kind, body)
        if kind == b"Q":
            return self._match(body)
        if kind == b"P":
            name, _, rest = body.partition(b"\0")
            conn.sql[name] = rest.partition(b"\0")[0]
            return None
        if kind == b"B":
            stmt = body.split(b"\0", 2)[1]
            sql = conn.sql.get(stmt)
            return None if sql is None else self._match(sql)
        return None

    async def _server_to_client(self, conn: _Conn, sr: asyncio.StreamReader) -> None:
        try:
            while True:
                head = await sr.readexactly(5)
                body = await sr.readexactly(struct.unpack("!i", head[1:])[0] - 4)
                if conn.cut_after is not None:
                    if head[:1] == b"Z":  # the server finished the command: cut, drop the reply
                        rule = conn.cut_after
                        conn.close()
                        rule.fired.set()
                        return
                    continue
                if conn.hold is not None and not self._release.is_set():
                    conn.hold.fired.set()  # the server answered; the client waits
                    await self._release.wait()
                conn.cw.write(head + body)
                await conn.cw.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            conn.close()
