"""The webhook bridge's HTTP server, hardened against senders that hold it.

aiohttp's own sites accept every connection and its server keeps what a request announced;
an attacker that opens connections, sends most of a body and stalls would hold memory for as
long as it likes (issue 13). What bounds that, one piece each:

* `BoundedSite`: at most `max_connections` open on the public port, counted at accept; one
  more is answered 503 and closed.
* `BodyBudget`: body bytes held at once across requests (beyond each body's first bytes,
  which the connection cap bounds), so that the bodies in flight cannot outgrow the pod.
* `RedactedAccessLogger`: the access log without query values (Azure's `?code=`, GCS's
  `?token=` are secrets).
* `OneLine`: requests aiohttp cannot parse are logged as one line, not a traceback each.
* The per-connection limits of aiohttp's parser (`MAX_HEADERS`, `MAX_FIELD_BYTES`,
  `READ_BUFFER_BYTES`, `LINGER_S`), applied by `connectors.webhook.server_options`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import quote

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from prometheus_client import Gauge
from yarl import URL

from streams.logs import printable

BODIES_HELD = Gauge(
    "bridge_webhook_bodies_held_bytes",
    "Body bytes held against webhook.max_bodies_bytes (beyond each body's first 64 KiB)",
)

CONNECTIONS = Gauge("bridge_webhook_connections", "Connections open on the public port")

MAX_HEADERS = 64
"""Header lines a request may have (aiohttp answers 400 past it): providers send about 10-20,
proxies add a few. With aiohttp's 8,190 bytes per line it bounds what one connection's head
can hold while it is parsed (about 520 KB)."""
MAX_FIELD_BYTES = 8190
LINGER_S = 2.0
"""After an answer sent before the body was read whole (401, 408, 503, 413), how long the
rest of the body is read and discarded before the connection is closed: enough for a client
to see the answer instead of a reset, short enough that a stalled sender goes soon."""
READ_BUFFER_BYTES = 64 * 1024
"""aiohttp buffers up to twice this per connection before it stops reading the socket
(default 256 KiB: 512 KiB a connection, outside any budget); with 64 KiB, what a connection
holds besides its counted body is about 128 KiB."""
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n"
)
"""What a connection over `webhook.max_connections` gets before it is closed."""


@dataclass
class BodyBudget:
    """Body bytes held at once across requests, beyond each body's first `free` bytes (those
    are bounded by the connection cap instead). Bytes are held from when a body is read (or
    announced by Content-Length) until Kafka acknowledged it or it was refused."""

    limit: int
    free: int
    held: int = 0

    def hold(self) -> BodyHold:
        return BodyHold(self)


@dataclass
class BodyHold:
    """One request's share of a BodyBudget; given back when the `with` block ends."""

    budget: BodyBudget
    taken: int = 0

    def cover(self, size: int) -> bool:
        """Hold what a body of `size` bytes needs; False when the budget cannot."""
        need = max(size - self.budget.free, 0) - self.taken
        if need <= 0:
            return True
        if self.budget.held + need > self.budget.limit:
            return False
        self.budget.held += need
        self.taken += need
        BODIES_HELD.set(self.budget.held)
        return True

    def __enter__(self) -> BodyHold:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.budget.held -= self.taken
        self.taken = 0
        BODIES_HELD.set(self.budget.held)


def redacted_target(url: URL) -> str:
    """The request target for the access log: the path as received, and the query string's
    parameter names only (`?code=***`): Azure's `code`, a GCS `token` or any route's
    `secret_query_param` carry the route's secret."""
    target = url.raw_path
    if url.query:
        target += "?" + "&".join(f"{quote(name, safe='')}=***" for name in url.query)
    return target


class RedactedAccessLogger(AbstractAccessLogger):
    """One line per request (client, method, target, status, bytes, seconds), query values
    redacted; aiohttp's default logs the request line, secrets included."""

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.info(
            '%s "%s %s" %d %d %.3fs',
            request.remote,
            printable(request.method),
            printable(redacted_target(request.rel_url)),
            response.status,
            response.body_length,
            time,
        )


class _Refuse(asyncio.Protocol):
    """A connection over the cap: 503, closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(REFUSAL)
        transport.close()


@dataclass
class ConnectionGate:
    """Connections open on a site, counted from accept to close: asyncio calls the protocol
    factory for a whole burst of accepts before any `connection_made`, so the count must be
    taken in the factory, not from the server's registered connections."""

    limit: int
    open: int = 0


class _Counted(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the gate's count given back on close."""

    __slots__ = ("_gate", "_inner")

    def __init__(self, inner: asyncio.Protocol, gate: ConnectionGate) -> None:
        self._inner, self._gate = inner, gate

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._gate.open -= 1
        CONNECTIONS.set(self._gate.open)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class BoundedSite(web.BaseSite):
    """A TCP site that serves at most `max_connections` connections at once; one more is
    answered 503 and closed (aiohttp's own sites accept every connection)."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        max_connections: int,
        on_refused: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(runner)
        self._host, self._port = host, port
        self.gate = ConnectionGate(max_connections)
        self.on_refused = on_refused
        """Called for each connection refused over the cap (the bridge counts it)."""
        self._listening: asyncio.Server | None = None

    @property
    def name(self) -> str:
        return str(URL.build(scheme="http", host=self._host, port=self.port))

    @property
    def port(self) -> int:
        """The bound port (the configured one, or the one the OS chose for 0)."""
        if self._listening is not None and self._listening.sockets:
            bound: int = self._listening.sockets[0].getsockname()[1]
            return bound
        return self._port

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        gate = self.gate

        def protocol() -> asyncio.BaseProtocol:
            if gate.open >= gate.limit:
                self.on_refused()
                return _Refuse()
            gate.open += 1
            CONNECTIONS.set(gate.open)
            return _Counted(server(), gate)

        self._listening = await asyncio.get_running_loop().create_server(
            protocol, self._host, self._port, backlog=self._backlog, reuse_address=True
        )
        self._server = self._listening


class OneLine(logging.Filter):
    """Requests aiohttp cannot parse (too many headers, a bad request line) are logged by
    aiohttp with a traceback each: an attacker's flood of them would be a flood of
    tracebacks. Keep the line and the error, drop the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            record.msg = f"{record.getMessage()}: {type(error).__name__}: {error}".replace(
                "\n", " "
            )
            record.args = None
            record.exc_info = record.exc_text = None
        return True


def server_logger() -> logging.Logger:
    logger = logging.getLogger("connectors.webhook.http")
    if not any(isinstance(existing, OneLine) for existing in logger.filters):
        logger.addFilter(OneLine())
    return logger
