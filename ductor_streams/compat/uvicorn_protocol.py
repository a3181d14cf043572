"""Connection hygiene at the HTTP protocol, before any routing: a deadline for each
request's head, a cap on its size, and a cap on open connections that keeps the health
routes reachable and shares the connections out fairly between tenants.

uvicorn alone waits forever for a request's head (1,000 silent connections stay open),
buffers a header of any size before rejecting it, and accepts connections until the
process runs out of file descriptors, when ``/healthz`` fails too. Here:

- **Head deadline.** From a connection's start, and from the first byte of each later
  request, the request line and headers must arrive within ``head_timeout`` seconds;
  otherwise the connection is closed (with ``408`` when part of a head came).
- **Head size.** A head over ``max_head_bytes`` is answered ``431`` at once, counted in
  raw bytes as they arrive (so a 128 MiB header is cut after the first 64 KiB, not
  parsed whole), on every route, health included.
- **Connection cap.** ``max_connections`` connections are admitted; up to
  ``PROVISIONAL_RESERVE`` more are accepted provisionally, and decided when their
  request head arrives (compat/connection_table.py keeps the places):

  - a health probe (``PROBE_PATHS``) is answered in its provisional place, however many
    connections are open: it never evicts anything, and nothing evicts it while it is
    answered;
  - any other request takes an admitted place: a free one, else the place of the
    connection that has waited longest for a request head (a silent or trickling
    client, or an idle keep-alive one; not an idle one of another tenant at or below
    its fair share), else, when its bearer token is valid and its tenant below its
    fair share, the place of the newest connection of the tenant holding the most
    connections, if that tenant is above its own share (the evicted connection is cut,
    whatever it was doing); else it is answered ``503`` and closed.

  A new connection beyond the reserve evicts the one waiting longest for a head (as
  above, its tenant not known yet); only when none may go is it answered ``503`` at
  once. So a probe of ``/healthz`` gets in
  however many stalled connections an attacker holds and whatever one tenant holds.
  The app names each connection's tenant once a request on it is authenticated
  (``note_tenant``).

The answers are RFC 9457 problems, like every other error of the server.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import resource
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

# uvicorn's httptools protocol is not a public API: pyproject.toml bounds uvicorn and
# tests/foundation/test_private_apis.py names what this subclass relies on.
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ductor_streams.compat.connection_table import ConnectionTable
from ductor_streams.foundation import metrics

# The scope extension that lets the app act on the request's connection:
# ``scope["extensions"][CONNECTION_EXTENSION]["abort"]()`` cuts it,
# ``...["closing"]()`` says whether it is closing or gone (http/middleware/write_budget.py),
# ``...["body_writer"](scope)`` is a ``ChunkWriter`` for that request's response, and
# ``...["tenant"](tenant)`` names the tenant whose request it serves (``note_tenant``).
CONNECTION_EXTENSION = "ductor.connection"

# The health routes (http/routes/health.py): answered at any connection count.
PROBE_PATHS = frozenset({"/healthz", "/readyz"})
_PROBE_RAW_PATHS = frozenset(path.encode() for path in PROBE_PATHS)

# Connections accepted above the cap until their request head shows what they are: a
# probe is answered in one of these places. They come out of the descriptors kept free
# (``RESERVED_DESCRIPTORS``), and are taken only at the cap.
PROVISIONAL_RESERVE = 16

# At the cap, how many of the connections waiting longest for a head are looked at for
# one that may be evicted: a bound on the work of each request there.
IDLE_SCAN = 64

# After a refusal the connection reads (and drops) what the client is still sending,
# for up to this long or this many bytes, before it closes: closing a socket with
# unread data resets it, and the reset can destroy the answer before the client reads it.
LINGER_SECONDS = 2.0
LINGER_BYTES = 8 * 1024 * 1024

# File descriptors kept free for everything that is not a client connection: the
# database pool, the LISTEN connection, Temporal, logs, object files, the reserve above.
RESERVED_DESCRIPTORS = 64

Headers = Sequence[tuple[bytes, bytes]]


@dataclass(frozen=True)
class ConnectionLimits:
    """The limits of one server (docs/security.md, "Connections")."""

    head_timeout: float = 10.0
    max_head_bytes: int = 64 * 1024
    max_connections: int = 1024
    # The tenant of a request's bearer token (verified), None without a valid one: at
    # the cap it decides whether the request may take a busier tenant's place.
    tenant_of: Callable[[Headers], str | None] | None = None


def default_max_connections() -> int:
    """The file-descriptor limit less what the process needs for itself."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 65536
    return max(16, soft - RESERVED_DESCRIPTORS)


def note_tenant(scope: Any, tenant: str) -> None:
    """Tell the server that ``scope``'s connection serves ``tenant`` (its request was
    authenticated); a no-op under another server."""
    connection = scope.get("extensions", {}).get(CONNECTION_EXTENSION)
    if connection is not None:
        connection["tenant"](tenant)


def _problem(status: int, code: str, title: str, detail: str, *extra: bytes) -> bytes:
    body = json.dumps(
        {
            "type": f"https://ductor.dev/problems/{code}",
            "title": title,
            "status": status,
            "detail": detail,
            "code": code,
        },
        separators=(",", ":"),
    ).encode()
    return b"".join(
        [
            b"HTTP/1.1 %d %s\r\n" % (status, title.encode()),
            b"content-type: application/problem+json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"cache-control: no-store\r\n",
            b"x-content-type-options: nosniff\r\n",
            *extra,
            b"connection: close\r\n\r\n",
            body,
        ]
    )


HEAD_TOO_LARGE = _problem(
    431,
    "request_header_too_large",
    "Request Header Fields Too Large",
    "the request line and headers exceed the server's limit",
)
HEAD_TIMEOUT = _problem(
    408, "request_timeout", "Request Timeout", "the request's headers did not arrive in time"
)
TOO_MANY_CONNECTIONS = _problem(
    503,
    "too_many_connections",
    "Service Unavailable",
    "the server has too many open connections",
    b"retry-after: 1\r\n",
)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """The server's protocol with the limits above. Made per server by ``guarded``."""

    limits: ClassVar[ConnectionLimits]
    # The places of the server's connections and the tenant of each.
    table: ClassVar[ConnectionTable[GuardedHttpToolsProtocol]]
    # Connections waiting for a request head, oldest first (dicts keep order).
    waiting: ClassVar[dict[GuardedHttpToolsProtocol, None]]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_bytes = 0
        self._in_head = True
        self._head_timer: asyncio.TimerHandle | None = None
        self._discard_left = -1  # >= 0 while lingering after a refusal
        # The ASGI scope's extension that lets the app cut this connection (a stalled
        # SSE reader: http/codecs/sse_response.py; a stalled catch-up:
        # http/middleware/write_budget.py) and name its tenant (``note_tenant``).
        self._extensions: dict[str, dict[object, object]] = {
            CONNECTION_EXTENSION: {
                "abort": self.transport.abort,
                "closing": self.transport.is_closing,
                "body_writer": self.body_writer,
                "tenant": self._note_tenant,
            }
        }
        table = self.table
        if table.has_room():
            table.admit(self)
        elif table.has_reserve():
            table.hold_provisionally(self)  # decided when its head comes (_place_at_head)
        else:
            victim = self._oldest_waiting(admitted_only=False, tenant=None)
            if victim is None:
                metrics.CONNECTIONS_REFUSED.labels("too_many").inc()
                self._answer_and_close(TOO_MANY_CONNECTIONS)
                return
            admitted = table.is_admitted(victim)
            victim._evict("evicted")
            if admitted:
                table.admit(self)
            else:
                table.hold_provisionally(self)
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_done()
        self.table.remove(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._discard_left >= 0:
            self._discard_left -= len(data)
            if self._discard_left < 0:
                self.transport.close()
            return
        if self._in_head:
            if self._head_timer is None:
                self._await_head()
            self._head_bytes += len(data)
        super().data_received(data)
        # Still in the same head after its bytes were parsed: check its size. (Body
        # bytes that came with the end of a head are not counted: the head ended.)
        if (
            self._in_head
            and self._head_bytes > self.limits.max_head_bytes
            and not self.transport.is_closing()
        ):
            metrics.CONNECTIONS_REFUSED.labels("head_too_large").inc()
            self._answer_and_close(HEAD_TOO_LARGE)

    # A refusal from within the parser's callbacks (``_place_at_head``) leaves the parser
    # going through the rest of the bytes it was given: every callback that would act on
    # them does nothing once the connection lingers.

    def on_message_begin(self) -> None:
        if self._discard_left >= 0:
            return
        super().on_message_begin()
        self.scope["extensions"] = self._extensions

    def on_headers_complete(self) -> None:
        if self._discard_left >= 0:
            return
        self._head_done()
        table = self.table
        if not table.is_admitted(self) and not self._place_at_head():
            return
        super().on_headers_complete()
        if table.tenant_of(self) is not None and self.scope.get("path") in PROBE_PATHS:
            table.untag(self)  # a probe is nobody's: never evicted for a tenant

    def on_body(self, body: bytes) -> None:
        if self._discard_left >= 0:
            return
        super().on_body(body)

    def body_writer(self, scope: Any) -> ChunkWriter | None:
        """A writer of body chunks straight to this connection's transport for the
        response to the request of ``scope``, while it is the one being sent and uvicorn
        itself frames its body in chunks (started, not complete, chunked, not HEAD);
        None otherwise."""
        cycle = self.cycle
        if (
            cycle is None
            or cycle.scope is not scope
            or not cycle.response_started
            or cycle.response_complete
            or cycle.chunked_encoding is not True
            or cycle.scope["method"] == "HEAD"
        ):
            return None
        return ChunkWriter(self.transport, self.flow, cycle)

    def on_message_complete(self) -> None:
        if self._discard_left >= 0:
            return
        super().on_message_complete()
        # The next request's head starts with the next byte; its deadline then.
        self._in_head = True
        self._head_bytes = 0

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._in_head and not self.transport.is_closing():
            # Idle keep-alive: uvicorn's own keep-alive timeout closes it; meanwhile
            # it is the first to go when the connection cap is reached.
            self.waiting[self] = None

    # -- the connection cap ------------------------------------------------------------

    def _place_at_head(self) -> bool:
        """A provisional connection's request head has come: answer a probe where it is,
        give anything else an admitted place (free, a waiting connection's, or a busier
        tenant's), or refuse it. False when refused."""
        table = self.table
        if table.has_room():
            table.admit(self)
            return True
        if self.url.partition(b"?")[0] in _PROBE_RAW_PATHS:
            return True
        tenant_of = self.limits.tenant_of
        tenant = None if tenant_of is None else tenant_of(self.headers)
        reason = "evicted"
        victim = self._oldest_waiting(admitted_only=True, tenant=tenant)
        if victim is None and tenant is not None:
            victim = table.fair_victim(tenant)
            reason = "evicted_tenant"
        if victim is None:
            metrics.CONNECTIONS_REFUSED.labels("too_many").inc()
            # Its provisional place is free at once, while it lingers to be read.
            table.remove(self)
            self._answer_and_close(TOO_MANY_CONNECTIONS)
            return False
        victim._evict(reason)
        table.admit(self)
        if tenant is not None:
            table.tag(self, tenant)
        return True

    def _note_tenant(self, tenant: str) -> None:
        self.table.tag(self, tenant)

    def _oldest_waiting(
        self, *, admitted_only: bool, tenant: str | None
    ) -> GuardedHttpToolsProtocol | None:
        """The connection that has waited longest for a head (an admitted one only, if
        asked), other than this one, whose place a request of ``tenant`` may take."""
        table = self.table
        for victim in itertools.islice(self.waiting, IDLE_SCAN):
            if (
                victim is not self
                and (not admitted_only or table.is_admitted(victim))
                and table.may_take_idle(victim, tenant)
            ):
                return victim
        return None

    def _evict(self, reason: str) -> None:
        """Close this connection for another's sake; its place is free at once."""
        metrics.CONNECTIONS_REFUSED.labels(reason).inc()
        self._head_done()
        self.table.remove(self)
        if reason == "evicted":
            self.transport.close()
        else:
            # Cut mid-response: what is still buffered for the client is dropped, so
            # the descriptor is free now, not once a slow reader has read it.
            self.transport.abort()

    # -- the head's deadline ---------------------------------------------------------

    def _await_head(self) -> None:
        self.waiting.pop(self, None)
        self.waiting[self] = None
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.limits.head_timeout, self._head_timed_out)

    def _head_done(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        self.waiting.pop(self, None)
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._in_head or self.transport.is_closing():
            return
        metrics.CONNECTIONS_REFUSED.labels("head_timeout").inc()
        if self._head_bytes:
            self._answer_and_close(HEAD_TIMEOUT)
        else:
            self._head_done()
            self.transport.close()

    def _answer_and_close(self, answer: bytes) -> None:
        self._head_done()
        self.transport.write(answer)
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        # Half-close: the answer and then EOF reach the client, which may still be
        # sending; what it sends is read and dropped until it stops or the linger ends.
        self.transport.write_eof()
        self._discard_left = LINGER_BYTES
        self.loop.call_later(LINGER_SECONDS, self.transport.close)


def chunk_frame(body: bytes) -> bytes:
    """``body`` framed as one HTTP/1.1 chunk, the bytes uvicorn's ``send`` writes for a
    body message with ``more_body``."""
    if not body:
        raise ValueError("an empty chunk would end the chunked body")
    return b"%x\r\n%b\r\n" % (len(body), body)


class ChunkWriter:
    """Writes pre-framed chunks (``chunk_frame``) of one response's body to the transport
    at once, as uvicorn's ``send`` would, without the ASGI ``send`` chain.

    A fan-out to a thousand SSE subscribers writes one batch to each; through ``send``
    every write passed the app's wrappers of ``send`` and a coroutine, and was framed
    again (docs/speed.md, "Chunk writes"). Those wrappers only look at a response's
    start message, so a body chunk written here is the same on the wire.
    ``write`` refuses (returns False, writing nothing) whenever ``send`` would not
    write at once: flow control holds writes back (the client reads slowly), the client
    went away, the connection is closing or the response ended. The caller then sends
    that chunk, and everything after it, through ``send``.
    """

    __slots__ = ("_cycle", "_flow", "_transport")

    def __init__(self, transport: asyncio.Transport, flow: Any, cycle: Any) -> None:
        self._transport = transport
        self._flow = flow
        self._cycle = cycle

    def write(self, chunk: bytes) -> bool:
        """Write one framed chunk now, or refuse (see the class docstring)."""
        cycle = self._cycle
        if (
            self._flow.write_paused
            or cycle.disconnected
            or cycle.response_complete
            or self._transport.is_closing()
        ):
            return False
        self._transport.write(chunk)
        return True


def guarded(limits: ConnectionLimits) -> Any:
    """A protocol class for one server with these limits (uvicorn's ``http=``)."""
    return type(
        "GuardedHttpToolsProtocol",
        (GuardedHttpToolsProtocol,),
        {
            "limits": limits,
            "waiting": {},
            "table": ConnectionTable(limits.max_connections, PROVISIONAL_RESERVE),
        },
    )
