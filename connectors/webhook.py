"""The webhook bridge: one HTTP route per push source, `POST /hooks/<source>`.

A delivery is published to the raw topic (`webhook.raw_topic`) only if its route is on and
the request is authentic, and it is answered 202 only once Kafka acknowledged the write
(idempotent producer, acks=all); otherwise 503, so that the provider delivers again. An
authenticated body that is not valid JSON is still published (the stream dead-letters it):
nothing is lost. Handshakes are answered as each provider expects and are never published.

Routes: one per source of `PUSH_SOURCES`, configured under `[webhook.routes.<source>]`
(`streams.config.WebhookRouteConfig`), authenticated by `connectors.webhook_auth.<source>`
(`build_routes`); on when its credentials are configured, or when it is insecure (local
development only, a warning at start-up); else 404. Secrets are never in the file: the route
names the environment variables that hold them.

A request is checked cheapest first, each check refusing before the next costs anything:
route, method, encoding, announced length, repeated headers a decision reads
(`Route.single`), header budget, what the scheme can check from the head alone
(`before_body`), and only then the body is read (bounded in time and bytes held, by
`connectors.http_server`) and its signature checked. The published record is the body as
received, with the raw-topic contract's headers (`connectors.publisher.raw_headers`; no
credential header, no query string).

Every route's scheme and config fields, the example configuration, the order of checks, every
answer, the resource bounds, `/healthz`, `/ready`, `/metrics` and the `rejected` reasons:
docs/bridges.md, "The webhook bridge in detail"; `python -m connectors webhook --help` lists
the routes and the variables.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiokafka.errors import MessageSizeTooLargeError
from multidict import CIMultiDictProxy
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest

from connectors.command import BridgeCommand
from connectors.http_server import (
    LINGER_S,
    MAX_FIELD_BYTES,
    MAX_HEADERS,
    READ_BUFFER_BYTES,
    BodyBudget,
    BodyHold,
    BoundedSite,
    RedactedAccessLogger,
    server_logger,
)
from connectors.publisher import (
    PublishFailed,
    RawPublisher,
    RecordTooLarge,
    headers_size,
    raw_headers,
)
from connectors.webhook_auth import Authenticator, RequestFacts, Services, build_authenticator
from connectors.webhook_auth.base import PUBLISH, REJECT, ChecksBeforeBody, Verdict
from streams.config import ConfigError, Settings, WebhookConfig, WebhookRouteConfig
from streams.core.normalizers import HEADERS_READ, SOURCES
from streams.kafka_settings import KafkaAccessError, check_access
from streams.logs import printable

# Reconcile deliveries come from our own command, which publishes to Kafka directly.
PUSH_SOURCES = tuple(source for source in SOURCES if source != "reconcile")

log = logging.getLogger(__name__)

ACCEPTED = Counter("bridge_webhook_accepted", "Deliveries published and acknowledged", ["source"])
REJECTED = Counter("bridge_webhook_rejected", "Deliveries refused", ["source", "reason"])
HANDSHAKES = Counter("bridge_webhook_handshakes", "Handshakes answered", ["source", "kind"])
PUBLISH_SECONDS = Histogram(
    "bridge_webhook_publish_seconds", "From request to Kafka acknowledgement", ["source"]
)
RETRY_AFTER_S = "5"

# What `web.json_response({"accepted": True}, status=202)` sends, serialised once.
ACCEPTED_TEXT = json.dumps({"accepted": True})


@functools.cache
def _accepted(source: str) -> Counter:
    """The source's child of ACCEPTED, looked up once (labels() takes a lock every call)."""
    return ACCEPTED.labels(source)


@functools.cache
def _publish_seconds(source: str) -> Histogram:
    return PUBLISH_SECONDS.labels(source)


@dataclass(frozen=True)
class Limits:
    """What one request may take (webhook settings, see streams.config.WebhookConfig)."""

    max_body_bytes: int
    max_header_bytes: int
    body_timeout_s: float
    publish_timeout_s: float


PUBLISHER_KEY = web.AppKey("publisher", RawPublisher)
SERVICES_KEY = web.AppKey("services", Services)
READY_KEY = web.AppKey("kafka_ready", asyncio.Event)
LIMITS_KEY = web.AppKey("limits", Limits)
BUDGET_KEY = web.AppKey("bodies", BodyBudget)

Precheck = Callable[[RequestFacts], Awaitable[Verdict | None]]


@dataclass(frozen=True)
class Route:
    source: str
    authenticator: Authenticator
    insecure: bool
    precheck: Precheck | None = None
    """The authenticator's `before_body`, when its scheme can refuse from the head."""
    single: frozenset[str] = frozenset()
    """Lower-case header names that must come at most once: what the authenticator or the
    source's normalizer reads (one header line each, or two readers may see two values)."""


ROUTES_KEY: web.AppKey[dict[str, Route]] = web.AppKey("routes")


def build_routes(
    config: WebhookConfig,
    environ: Mapping[str, str] | None = None,
    services: Services | None = None,
) -> dict[str, Route]:
    """The routes that are on, from configuration and the environment."""
    environ = dict(os.environ) if environ is None else environ
    services = services or Services()
    routes: dict[str, Route] = {}
    for source in PUSH_SOURCES:
        route_config = config.routes.get(source, WebhookRouteConfig())
        insecure = source in config.insecure_sources or route_config.insecure
        built = build_authenticator(source, route_config, environ, services, insecure)
        if built is None:
            continue
        authenticator, authenticated = built
        if not authenticated:
            log.warning(
                "webhook route /hooks/%s accepts UNAUTHENTICATED deliveries "
                "(configured as insecure: local development only)",
                source,
            )
        precheck = (
            authenticator.before_body if isinstance(authenticator, ChecksBeforeBody) else None
        )
        single = authenticator.read_headers | HEADERS_READ.get(source, frozenset())
        routes[source] = Route(source, authenticator, not authenticated, precheck, single)
    return routes


def forwarded_headers(received: CIMultiDictProxy[str], hidden: frozenset[str]) -> dict[str, str]:
    """What the raw record carries of the request's headers: one value per lower-case name
    (the lines of a repeated header joined with `, `, as HTTP reads them), credentials
    (`hidden`) left out. One Kafka header per name: readers that keep the first or the last
    of a repeated one see the same value (a header a check reads is never repeated here)."""
    forwarded: dict[str, str] = {}
    for name, value in received.items():
        lower = name.lower()
        if lower in hidden:
            continue
        forwarded[lower] = f"{forwarded[lower]}, {value}" if lower in forwarded else value
    return forwarded


def _request_facts(request: web.Request, body: bytes, now: float) -> RequestFacts:
    headers: dict[str, str] = {}
    for name, value in request.headers.items():
        headers.setdefault(name.lower(), value)
    query: dict[str, str] = {}
    for name, value in request.query.items():
        query.setdefault(name, value)
    return RequestFacts(request.method, str(request.url), query, headers, body, now)


def _busy(source: str, reason: str, detail: str) -> web.Response:
    REJECTED.labels(source, reason).inc()
    log.warning("refused delivery to /hooks/%s (503 %s): %s", source, reason, detail)
    return web.Response(
        status=503, text="busy; deliver again later\n", headers={"Retry-After": RETRY_AFTER_S}
    )


async def _read_body(
    request: web.Request, source: str, limits: Limits, hold: BodyHold
) -> bytes | web.Response:
    """The whole body within `body_timeout_s`, its bytes held in `hold`; else the answer
    (408, 413, 503, 400).

    Answers are returned, not raised: a raised HTTPException keeps its traceback, whose
    frames hold the body read so far, in a reference cycle with aiohttp's handler frame. Only
    the cyclic garbage collector frees those, rarely (bytes do not count towards its
    thresholds): a bridge answering stalled senders 408 grew by their bodies, wave after wave.
    """
    limit = limits.max_body_bytes
    declared = request.content_length
    if declared is not None and not hold.cover(declared):
        return _busy(source, "bodies-over-budget", f"no room for a body of {declared} bytes")
    # StreamReader.read(n) returns what is buffered (up to n), not n: loop until the end, or
    # until one byte over the limit. Chunks joined once at the end: growing one buffer by
    # reallocation fragments the heap (a bridge under attack kept growing wave after wave).
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            while size <= limit:
                chunk = await request.content.read(limit + 1 - size)
                if not chunk:
                    break
                if not hold.cover(size + len(chunk)):
                    return _busy(source, "bodies-over-budget", "no room for the rest of a body")
                chunks.append(chunk)
                size += len(chunk)
    except TimeoutError:
        chunks.clear()
        REJECTED.labels(source, "body-timeout").inc()
        log.info(
            "refused delivery to /hooks/%s (408 body-timeout): %d bytes in %.0f s, not whole",
            source,
            size,
            limits.body_timeout_s,
        )
        return web.Response(status=408, text="body not received in time\n")
    except (OSError, HttpProcessingError) as exc:  # the client went away or broke the framing
        chunks.clear()
        REJECTED.labels(source, "incomplete").inc()
        log.info("delivery to /hooks/%s ended before its body did: %r", source, exc)
        return web.Response(status=400, text="incomplete body\n")
    if size > limit:
        REJECTED.labels(source, "too-large").inc()
        return web.Response(status=413, text="body too large\n")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


MAX_DETAIL_CHARS = 300
"""Of a verdict's detail in the log: details may quote request headers (up to 8 KB each)."""


def content_codings(values: Iterable[str]) -> list[str]:
    """The content codings a request's `Content-Encoding` headers name, `identity` left out
    (every header line counted: a request may carry several)."""
    codings = (coding.strip().lower() for value in values for coding in value.split(","))
    return [coding for coding in codings if coding and coding != "identity"]


def _unsupported_encoding(source: str, codings: list[str]) -> web.Response:
    """415 for an encoded body: no provider compresses what it posts, and a decoded body
    would cost the bridge many times what it cost the sender before any credential is
    checked (gzip inflates 1,000-fold), then not be the bytes that came (issue 23 #6)."""
    REJECTED.labels(source, "encoded-body").inc()
    log.info(
        "refused delivery to /hooks/%s (415 encoded-body): Content-Encoding %s",
        source,
        printable(", ".join(codings))[:MAX_DETAIL_CHARS],
    )
    return web.Response(
        status=415,
        text="encoded bodies are not accepted\n",
        headers={"Accept-Encoding": "identity"},
    )


def _refused(source: str, verdict: Verdict) -> web.Response:
    REJECTED.labels(source, verdict.reason).inc()
    log.info(
        "refused delivery to /hooks/%s (%d %s): %s",
        source,
        verdict.status,
        verdict.reason,
        printable(verdict.detail)[:MAX_DETAIL_CHARS],
    )
    text = "unauthenticated\n" if verdict.status == 401 else f"{verdict.reason}\n"
    return web.Response(status=verdict.status, text=text)


async def _decide(source: str, check: Awaitable[Verdict | None]) -> Verdict | None:
    """An authenticator's answer; a bug in it (any exception) refuses the request with one
    log line: it must neither publish nor answer 500, nor write a traceback per request."""
    try:
        return await check
    except Exception as exc:
        log.error("authenticating a delivery to /hooks/%s failed: %r", source, exc)
        log.debug("the authenticator's traceback", exc_info=True)
        return Verdict(REJECT, 400, "unreadable", "")


async def receive(request: web.Request) -> web.StreamResponse:
    source = request.match_info["source"]
    route: Route | None = request.app[ROUTES_KEY].get(source)
    if route is None:
        REJECTED.labels(source if source in PUSH_SOURCES else "?", "no-route").inc()
        # Never echo the path back: it is attacker-controlled (reflected input).
        raise web.HTTPNotFound(text="no route for this source\n")
    methods = route.authenticator.methods
    if request.method not in methods:
        REJECTED.labels(source, "method-not-allowed").inc()
        raise web.HTTPMethodNotAllowed(request.method, sorted(methods))
    codings = content_codings(request.headers.getall("Content-Encoding", ()))
    if codings:
        return _unsupported_encoding(source, codings)
    limits = request.app[LIMITS_KEY]
    declared = request.content_length
    if declared is not None and declared > limits.max_body_bytes:
        REJECTED.labels(source, "too-large").inc()
        raise web.HTTPRequestEntityTooLarge(max_size=limits.max_body_bytes, actual_size=declared)
    repeated = sorted(name for name in route.single if len(request.headers.getall(name, ())) > 1)
    if repeated:
        REJECTED.labels(source, "repeated-header").inc()
        log.info(
            "refused delivery to /hooks/%s (400 repeated-header): %s more than once",
            source,
            ", ".join(repeated),
        )
        return web.Response(status=400, text="repeated header\n")
    headers = raw_headers(
        source, "webhook", forwarded_headers(request.headers, route.authenticator.secret_headers)
    )
    header_bytes = headers_size(headers)
    if header_bytes > limits.max_header_bytes:
        REJECTED.labels(source, "headers-too-large").inc()
        log.info(
            "refused delivery to /hooks/%s (431 headers-too-large): %d header bytes, over %d",
            source,
            header_bytes,
            limits.max_header_bytes,
        )
        return web.Response(status=431, text="request headers too large\n")
    head = _request_facts(request, b"", request.app[SERVICES_KEY].clock())
    if route.precheck is not None:
        early = await _decide(source, route.precheck(head))
        if early is not None:
            return _refused(source, early)
    with request.app[BUDGET_KEY].hold() as hold:
        body = await _read_body(request, source, limits, hold)
        if isinstance(body, web.Response):
            return body
        facts = dataclasses.replace(head, body=body)
        verdict = await _decide(source, route.authenticator.authenticate(facts))
        assert verdict is not None  # authenticate always decides
        if verdict.outcome == REJECT:
            return _refused(source, verdict)
        if verdict.outcome != PUBLISH:
            HANDSHAKES.labels(source, verdict.reason).inc()
            log.info(
                "answered %s handshake on /hooks/%s %s",
                verdict.reason,
                source,
                printable(verdict.detail)[:MAX_DETAIL_CHARS],
            )
            content_type = verdict.content_type if verdict.body else None
            return web.Response(
                status=verdict.status,
                body=verdict.body,
                headers=verdict.headers,
                content_type=content_type,
            )
        return await _publish(request, route, body, headers)


async def _publish(
    request: web.Request, route: Route, body: bytes, headers: list[tuple[str, bytes]]
) -> web.Response:
    source = route.source
    started = time.monotonic()
    timeout = request.app[LIMITS_KEY].publish_timeout_s
    try:
        ready = request.app[READY_KEY]
        if not ready.is_set():
            try:
                await asyncio.wait_for(ready.wait(), timeout)
            except TimeoutError:
                raise PublishFailed("the bridge is not connected to Kafka") from None
        remaining = max(timeout - (time.monotonic() - started), 0.001)
        # asyncio.timeout, not wait_for: no task of its own per delivery (the hot path).
        async with asyncio.timeout(remaining):
            await request.app[PUBLISHER_KEY].publish(body, headers)
    except (PublishFailed, TimeoutError) as exc:
        # Answers returned, not raised (see _read_body): the body must not outlive the request.
        if isinstance(exc, RecordTooLarge) or isinstance(exc.__cause__, MessageSizeTooLargeError):
            # Permanent: a retry would fail the same way, so no 503 (endless redelivery).
            REJECTED.labels(source, "too-large-for-kafka").inc()
            log.error(
                "delivery to /hooks/%s (%d bytes) is larger than a Kafka record may be "
                "(producer max_request_size / topic max.message.bytes): refused with 413; "
                "lower webhook.max_body_bytes or raise the Kafka limits",
                source,
                len(body),
            )
            return web.Response(status=413, text="too large for a Kafka record\n")
        REJECTED.labels(source, "kafka-unavailable").inc()
        log.warning("delivery to /hooks/%s not acknowledged by Kafka: %s", source, exc)
        return web.Response(status=503, text="not stored; deliver again\n")
    _publish_seconds(source).observe(time.monotonic() - started)
    _accepted(source).inc()
    return web.Response(status=202, text=ACCEPTED_TEXT, content_type="application/json")


async def healthz(request: web.Request) -> web.Response:
    """Liveness: 200 while the bridge serves. `kafka`: whether Kafka acknowledged a write or
    answered a metadata request within the last few seconds (now, not at start)."""
    return web.json_response({"ok": True, "kafka": request.app[PUBLISHER_KEY].kafka_ok()})


async def ready(request: web.Request) -> web.Response:
    """Readiness: 200 while Kafka answers (as `/healthz`'s `kafka`), else 503: a bridge that
    cannot store deliveries would only answer them 503."""
    kafka = request.app[PUBLISHER_KEY].kafka_ok()
    return web.json_response({"ready": kafka, "kafka": kafka}, status=200 if kafka else 503)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(), content_type=CONTENT_TYPE_LATEST.split(";")[0])


def create_app(
    settings: Settings,
    publisher: RawPublisher,
    environ: Mapping[str, str] | None = None,
    services: Services | None = None,
) -> web.Application:
    """The bridge's aiohttp application; `services` (clock, outbound HTTP) for tests.

    With `webhook.admin_port` set, `/healthz`, `/ready` and `/metrics` are not on it (404) but on
    `create_admin_app(app)`."""
    services = services or Services()
    config = settings.webhook
    app = web.Application(client_max_size=config.max_body_bytes + 1)
    app[PUBLISHER_KEY] = publisher
    app[SERVICES_KEY] = services
    app[ROUTES_KEY] = build_routes(config, environ, services)
    app[LIMITS_KEY] = Limits(
        config.max_body_bytes,
        config.max_header_bytes,
        config.body_timeout_s,
        config.publish_timeout_s,
    )
    app[BUDGET_KEY] = BodyBudget(config.max_bodies_bytes, config.SMALL_BODY_BYTES)
    app[READY_KEY] = asyncio.Event()

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        # Connect in the background: the bridge answers (503 for deliveries) while Kafka is
        # unreachable instead of not listening at all.
        ready = app[READY_KEY]

        async def connect() -> None:
            await publisher.start()
            ready.set()

        connecting = asyncio.create_task(connect())
        yield
        # aiohttp has finished in-flight requests by now: their writes are acknowledged.
        if not connecting.done():
            connecting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await connecting
        try:
            await publisher.stop()
        except Exception as exc:  # a producer that never connected may not stop cleanly
            log.warning("stopping the Kafka producer: %r", exc)

    app.cleanup_ctx.append(lifecycle)
    for method in ("POST", "OPTIONS", "GET", "PUT", "PATCH", "DELETE"):
        app.router.add_route(method, "/hooks/{source}", receive)
    if config.admin_port is None:
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/ready", ready)
        app.router.add_get("/metrics", metrics)
    return app


def create_admin_app(app: web.Application) -> web.Application:
    """`/healthz`, `/ready` and `/metrics` of the bridge `app`, for `webhook.admin_port`."""
    admin = web.Application()
    admin[READY_KEY] = app[READY_KEY]
    admin[PUBLISHER_KEY] = app[PUBLISHER_KEY]
    admin.router.add_get("/healthz", healthz)
    admin.router.add_get("/ready", ready)
    admin.router.add_get("/metrics", metrics)
    return admin


def server_options(config: WebhookConfig) -> dict[str, object]:
    """aiohttp's per-connection bounds for the public port (see the module docstring)."""
    return {
        "logger": server_logger(),
        "access_log_class": RedactedAccessLogger,
        "keepalive_timeout": config.idle_timeout_s,
        "max_line_size": MAX_FIELD_BYTES,
        "max_field_size": MAX_FIELD_BYTES,
        "max_headers": MAX_HEADERS,
        "lingering_time": LINGER_S,
        "read_bufsize": READ_BUFFER_BYTES,
        # Bodies as they came: a decoded body is not what the provider sent, and inflating
        # one is the sender's leverage (a request with a Content-Encoding is refused, 415).
        "auto_decompress": False,
        "shutdown_timeout": 30.0,
    }


@dataclass
class RunningBridge:
    """The bridge's servers, started; `stop()` finishes requests in flight first."""

    public: BoundedSite
    runners: list[web.AppRunner] = field(default_factory=list)
    admin: web.TCPSite | None = None

    @property
    def port(self) -> int:
        return self.public.port

    @property
    def admin_port(self) -> int | None:
        return None if self.admin is None else self.admin.port

    async def stop(self) -> None:
        for runner in self.runners:
            await runner.cleanup()


class PortTaken(Exception):
    """A port the bridge must listen on cannot be bound (in use, not allowed): one line
    naming the setting that chose it."""

    def __init__(self, setting: str, host: str, port: int, error: OSError) -> None:
        reason = os.strerror(error.errno).lower() if error.errno else str(error)
        super().__init__(f"cannot listen on {host}:{port} ({reason}); set {setting} to a free port")


async def start_bridge(
    settings: Settings,
    publisher: RawPublisher,
    environ: Mapping[str, str] | None = None,
    services: Services | None = None,
    port: int | None = None,
    admin_port: int | None = None,
) -> RunningBridge:
    """Start the public port (and the admin port when configured) as `serve` does; `port`,
    `admin_port` override the configured ones (0: any free port, for tests)."""
    config = settings.webhook
    app = create_app(settings, publisher, environ, services)
    runner = web.AppRunner(app, **server_options(config))  # type: ignore[arg-type]
    await runner.setup()
    public = BoundedSite(
        runner,
        config.host,
        config.port if port is None else port,
        config.max_connections,
        on_refused=REJECTED.labels("?", "too-many-connections").inc,
    )
    bridge = RunningBridge(public, [runner])
    try:
        try:
            await public.start()
        except OSError as exc:
            raise PortTaken("WEBHOOK_PORT (webhook.port)", config.host, public.port, exc) from None
        if config.admin_port is not None:
            admin_runner = web.AppRunner(
                create_admin_app(app), access_log_class=RedactedAccessLogger
            )
            await admin_runner.setup()
            bridge.runners.append(admin_runner)
            bridge.admin = web.TCPSite(
                admin_runner,
                config.admin_host or config.host,
                config.admin_port if admin_port is None else admin_port,
            )
            try:
                await bridge.admin.start()
            except OSError as exc:
                raise PortTaken(
                    "WEBHOOK_ADMIN_PORT (webhook.admin_port)",
                    config.admin_host or config.host,
                    config.admin_port if admin_port is None else admin_port,
                    exc,
                ) from None
    except BaseException:
        await bridge.stop()
        raise
    return bridge


async def _serve(settings: Settings) -> None:
    config = settings.webhook
    # Refused credentials or an untrusted certificate stop the bridge with one line naming
    # the setting; an unreachable Kafka does not (deliveries get 503 until it answers).
    problem = await check_access(settings.kafka)
    if problem is not None and problem[1]:
        raise KafkaAccessError(problem[0])
    publisher = RawPublisher(settings.kafka, config.raw_topic, config.publish_timeout_s)
    bridge = await start_bridge(settings, publisher)
    on: dict[str, Route] = bridge.runners[0].app[ROUTES_KEY]
    routes = sorted(on)
    log.info(
        "webhook bridge on http://%s:%d, routes on: %s; /healthz and /metrics on %s",
        config.host,
        bridge.port,
        ", ".join(f"/hooks/{source}" for source in routes) or "none",
        f"http://{config.admin_host or config.host}:{bridge.admin_port}"
        if bridge.admin_port is not None
        else "the same port",
    )
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    try:
        await stopping.wait()
    finally:
        log.info("webhook bridge stopping: finishing requests in flight")
        await bridge.stop()


def serve(settings: Settings) -> None:
    """Run the webhook server until SIGINT/SIGTERM; in-flight requests finish first."""
    asyncio.run(_serve(settings))


ROUTE_SUMMARIES = {
    "s3": "S3 -> Amazon SNS subscription; SNS signature, allowed topic_arns",
    "eventbridge": "EventBridge API destination; its API key header, or Basic auth",
    "gcs": "GCS -> Pub/Sub push; Google OIDC token and/or a shared token",
    "azure": "Azure Event Grid; a shared secret (?code= or a header)",
    "minio": "MinIO webhook target; Authorization: Bearer <auth_token>",
    "supabase": "Supabase Database Webhook; a secret header",
    "b2": "Backblaze B2 Event Notifications; HMAC-SHA256 signature",
    "box": "Box webhooks V2; HMAC-SHA256 signatures, timestamp window",
    "cloudinary": "Cloudinary notifications; SHA-1/SHA-256 signature, timestamp window",
    "appwrite": "Appwrite webhooks; HMAC-SHA1 signature over URL + body",
}
"""One line per route for `--help` (the module docstring and docs/bridges.md say more)."""


def help_details() -> str:
    """`python -m connectors webhook --help`'s routes and variables."""
    from streams.config import ENVIRONMENT

    defaults = WebhookConfig()
    routes = "\n".join(
        f"  POST /hooks/{source:<12} {ROUTE_SUMMARIES.get(source, '')}" for source in PUSH_SOURCES
    )

    def shown(value: object) -> str:
        if value is None or value == ():
            return "unset"
        return str(value)

    variables = "\n".join(
        f"  {variable:<26} webhook.{name} (default {shown(getattr(defaults, name))})"
        for variable, (section, name) in ENVIRONMENT.items()
        if section == "webhook"
    )
    return f"""routes (each off, answering 404, until [webhook.routes.<source>] configures its
credentials, or WEBHOOK_INSECURE_SOURCES lists it: local development only):
{routes}
  GET  /healthz /ready /metrics  liveness, readiness (Kafka answers), Prometheus
                                 (on WEBHOOK_ADMIN_PORT alone when it is set)

variables (each wins over its field in the config file):
  STREAMS_CONFIG             the config file (TOML; [webhook], [webhook.routes.<source>])
{variables}
  KAFKA_BOOTSTRAP_SERVERS, KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_*, KAFKA_SSL_*: Kafka
                             (docs/settings.md)
  each route's secret: the variable its secret_env names (secrets are never in the file)

A delivery is answered 202 once Kafka acknowledged it, 503 (the provider retries) otherwise.
Every route, its checks and answers: docs/bridges.md; `python -m pydoc connectors.webhook`."""


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    """The webhook bridge takes everything from the configuration ([webhook])."""


def _run(args: argparse.Namespace, settings: Settings) -> int:
    try:
        serve(settings)
    except (ConfigError, PortTaken) as exc:
        print(f"connectors: {exc}", file=sys.stderr)
        return 2
    return 0


COMMAND = BridgeCommand("HTTP server for push providers", _add_arguments, _run, help_details)
