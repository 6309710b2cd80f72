"""The webhook bridge: one HTTP route per push source, `POST /hooks/<source>`.

A delivery is published to the raw topic (`webhook.raw_topic`) only if its route is on and
the request is authentic, and it is answered 202 only once Kafka acknowledged the write
(idempotent producer, acks=all); otherwise 503, so that the provider delivers again. An
authenticated body that is not valid JSON is still published (the stream dead-letters it):
nothing is lost. Handshakes are answered as each provider expects and are never published.

Every route is configured under `[webhook.routes.<source>]` (`streams.config.WebhookRouteConfig`
documents each field). Secrets are never in the file: `secret_env` (older name `token_env`)
and `secondary_secret_env` name environment variables. A route is on when its credentials
are configured, or when it is `insecure` (or listed in `WEBHOOK_INSECURE_SOURCES`), which is
for local development only and logged as a warning at start-up; otherwise it answers 404.

Routes (scheme checked in constant time; config fields of `[webhook.routes.<source>]`):

`POST /hooks/s3` -- S3 -> Amazon SNS HTTP(S) subscription.
    SNS message signature, `SignatureVersion` 1 (SHA1) or 2 (SHA256), verified with the X.509
    certificate at `SigningCertURL` (https, host `sns.<region>.amazonaws.com[.cn]`, `.pem`,
    valid now, SNS subject, cached); the `TopicArn` must be allowed. A verified
    `SubscriptionConfirmation` is confirmed by a GET of its `SubscribeURL` and answered 200
    (503 when the GET fails); a verified `UnsubscribeConfirmation` is logged and answered 200;
    neither is published. Raw message delivery must be off.
    Fields: `topic_arns` (non-empty turns the route on), `confirm_subscriptions`,
    `certificate_files`, `trusted_ca_file`, `certificate_cache_s`.
`POST /hooks/eventbridge` -- EventBridge API destination.
    The connection's API key header (`ApiKeyName: ApiKeyValue`), or `Authorization: Basic`.
    Fields: `auth` (`api_key` | `basic`), `secret_env`, `secret_header`, `basic_username`.
`POST /hooks/gcs` -- GCS -> Pub/Sub push subscription.
    Google-signed OIDC token in `Authorization: Bearer`: RS256 with Google's JWKS keys, `aud`,
    `iss` `https://accounts.google.com` or `accounts.google.com`, `email` = the service
    account, `email_verified`, `exp`/`iat`; and/or a shared token in the query string.
    Fields: `audience` + `service_account` (OIDC), `issuers`, `jwks_url`, `jwks_file`,
    `jwt_leeway_s`; `secret_env`, `secret_query_param` (default `token`).
`POST /hooks/azure`, `OPTIONS /hooks/azure` -- Azure Event Grid webhook.
    A shared secret in the query string (default `?code=`) or a delivery header, on every
    request. Event Grid schema `SubscriptionValidationEvent`: answered 200
    `{"validationResponse": "<code>"}`, not published. CloudEvents abuse protection (OPTIONS):
    `WebHook-Request-Origin` -> `WebHook-Allowed-Origin`, `WebHook-Allowed-Rate`, `Allow`
    (403 for an origin not allowed).
    Fields: `secret_env`, `secret_query_param`, `secret_header`, `allowed_origins` (default
    `eventgrid.azure.net`), `allowed_rate` (default `*`).
`POST /hooks/minio` -- MinIO webhook target.
    `Authorization: Bearer <auth_token>` (the token as is when it reads `<scheme> <token>`).
    Fields: `secret_env`.
`POST /hooks/supabase` -- Supabase Database Webhook.
    The secret header configured on the webhook, compared whole.
    Fields: `secret_env`, `secret_header`.
`POST /hooks/b2` -- Backblaze B2 Event Notifications.
    `X-Bz-Event-Notification-Signature: v1=<hex HMAC-SHA256 of the body>`, keyed with the
    rule's signing secret. Fields: `secret_env`.
`POST /hooks/box` -- Box webhooks V2.
    base64 HMAC-SHA256 over body + `BOX-DELIVERY-TIMESTAMP` in `BOX-SIGNATURE-PRIMARY` /
    `BOX-SIGNATURE-SECONDARY` (either key matching), version `1`, `HmacSHA256`, timestamp
    within the window (default 10 min).
    Fields: `secret_env` (primary key), `secondary_secret_env`, `replay_window_s`.
`POST /hooks/cloudinary` -- Cloudinary notifications.
    `X-Cld-Signature` = hex SHA-1 (or SHA-256) of body + `X-Cld-Timestamp` + API secret,
    timestamp within the window (default 2 h).
    Fields: `secret_env`, `signature_algorithm`, `replay_window_s`.
`POST /hooks/appwrite` -- Appwrite webhooks.
    `X-Appwrite-Webhook-Signature` = base64 HMAC-SHA1 of (registered URL + body), keyed with
    the webhook's signature key. Fields: `secret_env`, `url`.

Example (secrets in the environment variables named here):

    [webhook]
    max_body_bytes = 1048576
    [webhook.routes.s3]
    topic_arns = ["arn:aws:sns:eu-west-1:123456789012:uploads"]
    [webhook.routes.gcs]
    audience = "https://hooks.example.com/hooks/gcs"
    service_account = "gcs-push@my-project.iam.gserviceaccount.com"
    [webhook.routes.azure]
    secret_env = "EVENT_GRID_SECRET"          # endpoint URL .../hooks/azure?code=<secret>
    [webhook.routes.supabase]
    secret_env = "SUPABASE_WEBHOOK_SECRET"
    secret_header = "x-webhook-secret"
    [webhook.routes.box]
    secret_env = "BOX_PRIMARY_KEY"
    secondary_secret_env = "BOX_SECONDARY_KEY"
    [webhook.routes.appwrite]
    secret_env = "APPWRITE_SIGNATURE_KEY"
    url = "https://hooks.example.com/hooks/appwrite"

Answers: 202 published; 200 handshake answered (never published); 401 unauthenticated,
forged, unsigned, truncated or wrong-algorithm signature, replayed (outside the window), or
an SNS topic not allowed; 400/403 malformed or refused Azure handshake; 404 route off; 405
method; 413 body over `webhook.max_body_bytes` (default 1 MiB), or too large for a Kafka
record (a retry could never succeed); 503 Kafka did not acknowledge within
`webhook.publish_timeout_s` (also while the bridge is still connecting), or a signing
certificate / Google key set / SNS subscription confirmation could not be fetched, so the
provider delivers again. Only Box and Cloudinary sign a timestamp, so only they have a replay
window; other sources' duplicates are dropped by the stream's dedupe.

Published record: value = the body as received; headers per the raw-topic contract
(`streams.records`): `source`, `transport` (`webhook`), `delivery-id`, `received-at`,
`header.<lower-case name>` for every HTTP header except credentials (`authorization`,
`cookie`, `x-api-key`, and the route's own secret header). The query string is not published.

    GET /healthz   200 while the bridge runs (`kafka`: whether the producer is connected)
    GET /metrics   Prometheus: bridge_webhook_accepted, bridge_webhook_rejected{reason},
                   bridge_webhook_handshakes{kind}, bridge_webhook_publish_seconds

`rejected` reasons: no-route, method-not-allowed, too-large, too-large-for-kafka,
missing-credentials, bad-credentials, missing-signature, bad-signature, wrong-algorithm,
replayed, malformed, unknown-topic, bad-certificate, certificate-unavailable,
confirmation-failed, bad-token, keys-unavailable, origin-not-allowed, kafka-unavailable.
Handshake kinds: subscription-confirmation, unsubscribe-confirmation (s3),
subscription-validation, subscription-deletion, abuse-protection (azure).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from aiohttp import web
from aiokafka.errors import MessageSizeTooLargeError
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest

from connectors.command import BridgeCommand
from connectors.publisher import PublishFailed, RawPublisher, raw_headers
from connectors.webhook_auth import Authenticator, RequestFacts, Services, build_authenticator
from connectors.webhook_auth.base import PUBLISH, REJECT
from streams.config import ConfigError, Settings, WebhookConfig, WebhookRouteConfig
from streams.normalizers import SOURCES

# Reconcile deliveries come from our own command, which publishes to Kafka directly.
PUSH_SOURCES = tuple(source for source in SOURCES if source != "reconcile")

log = logging.getLogger(__name__)

ACCEPTED = Counter("bridge_webhook_accepted", "Deliveries published and acknowledged", ["source"])
REJECTED = Counter("bridge_webhook_rejected", "Deliveries refused", ["source", "reason"])
HANDSHAKES = Counter("bridge_webhook_handshakes", "Handshakes answered", ["source", "kind"])
PUBLISH_SECONDS = Histogram(
    "bridge_webhook_publish_seconds", "From request to Kafka acknowledgement", ["source"]
)

# What `web.json_response({"accepted": True}, status=202)` sends, serialised once.
ACCEPTED_TEXT = json.dumps({"accepted": True})


@functools.cache
def _accepted(source: str) -> Counter:
    """The source's child of ACCEPTED, looked up once (labels() takes a lock every call)."""
    return ACCEPTED.labels(source)


@functools.cache
def _publish_seconds(source: str) -> Histogram:
    return PUBLISH_SECONDS.labels(source)


PUBLISHER_KEY = web.AppKey("publisher", RawPublisher)
SERVICES_KEY = web.AppKey("services", Services)
READY_KEY = web.AppKey("kafka_ready", asyncio.Event)
MAX_BODY_KEY = web.AppKey("max_body_bytes", int)
TIMEOUT_KEY = web.AppKey("publish_timeout_s", float)


@dataclass(frozen=True)
class Route:
    source: str
    authenticator: Authenticator
    insecure: bool


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
        routes[source] = Route(source, authenticator, not authenticated)
    return routes


def _request_facts(request: web.Request, body: bytes, now: float) -> RequestFacts:
    headers: dict[str, str] = {}
    for name, value in request.headers.items():
        headers.setdefault(name.lower(), value)
    query: dict[str, str] = {}
    for name, value in request.query.items():
        query.setdefault(name, value)
    return RequestFacts(request.method, str(request.url), query, headers, body, now)


async def _read_body(request: web.Request, source: str, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        REJECTED.labels(source, "too-large").inc()
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
    # StreamReader.read(n) returns what is buffered (up to n), not n: loop until the end, or
    # until one byte over the limit.
    body = bytearray()
    while len(body) <= limit:
        chunk = await request.content.read(limit + 1 - len(body))
        if not chunk:
            break
        body += chunk
    if len(body) > limit:
        REJECTED.labels(source, "too-large").inc()
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(body))
    return bytes(body)


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
    body = await _read_body(request, source, request.app[MAX_BODY_KEY])
    services = request.app[SERVICES_KEY]
    try:
        verdict = await route.authenticator.authenticate(
            _request_facts(request, body, services.clock())
        )
    except Exception:
        # A bug in an authenticator must neither publish nor answer 500 to a bad delivery.
        log.exception("authenticating a delivery to /hooks/%s failed", source)
        REJECTED.labels(source, "unreadable").inc()
        return web.Response(status=400, text="unreadable delivery\n")
    if verdict.outcome == REJECT:
        REJECTED.labels(source, verdict.reason).inc()
        log.info(
            "refused delivery to /hooks/%s (%d %s): %s",
            source,
            verdict.status,
            verdict.reason,
            verdict.detail,
        )
        text = "unauthenticated\n" if verdict.status == 401 else f"{verdict.reason}\n"
        return web.Response(status=verdict.status, text=text)
    if verdict.outcome != PUBLISH:
        HANDSHAKES.labels(source, verdict.reason).inc()
        log.info("answered %s handshake on /hooks/%s %s", verdict.reason, source, verdict.detail)
        content_type = verdict.content_type if verdict.body else None
        return web.Response(
            status=verdict.status,
            body=verdict.body,
            headers=verdict.headers,
            content_type=content_type,
        )
    return await _publish(request, route, body)


async def _publish(request: web.Request, route: Route, body: bytes) -> web.Response:
    source = route.source
    started = time.monotonic()
    hidden = route.authenticator.secret_headers
    forwarded = {
        name: value for name, value in request.headers.items() if name.lower() not in hidden
    }
    headers = raw_headers(source, "webhook", forwarded)
    timeout = request.app[TIMEOUT_KEY]
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
        if isinstance(exc.__cause__, MessageSizeTooLargeError):
            # Permanent: a retry would fail the same way, so no 503 (endless redelivery).
            REJECTED.labels(source, "too-large-for-kafka").inc()
            log.error(
                "delivery to /hooks/%s (%d bytes) is larger than a Kafka record may be "
                "(producer max_request_size / topic max.message.bytes): refused with 413; "
                "lower webhook.max_body_bytes or raise the Kafka limits",
                source,
                len(body),
            )
            raise web.HTTPRequestEntityTooLarge(
                max_size=request.app[MAX_BODY_KEY], actual_size=len(body)
            ) from None
        REJECTED.labels(source, "kafka-unavailable").inc()
        log.warning("delivery to /hooks/%s not acknowledged by Kafka: %s", source, exc)
        raise web.HTTPServiceUnavailable(text="not stored; deliver again\n") from None
    _publish_seconds(source).observe(time.monotonic() - started)
    _accepted(source).inc()
    return web.Response(status=202, text=ACCEPTED_TEXT, content_type="application/json")


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True, "kafka": request.app[READY_KEY].is_set()})


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(), content_type=CONTENT_TYPE_LATEST.split(";")[0])


def create_app(
    settings: Settings,
    publisher: RawPublisher,
    environ: Mapping[str, str] | None = None,
    services: Services | None = None,
) -> web.Application:
    """The bridge's aiohttp application; `services` (clock, outbound HTTP) for tests."""
    services = services or Services()
    config = settings.webhook
    app = web.Application(client_max_size=config.max_body_bytes + 1)
    app[PUBLISHER_KEY] = publisher
    app[SERVICES_KEY] = services
    app[ROUTES_KEY] = build_routes(config, environ, services)
    app[MAX_BODY_KEY] = config.max_body_bytes
    app[TIMEOUT_KEY] = config.publish_timeout_s
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
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    return app


def serve(settings: Settings) -> None:
    """Run the webhook server until SIGINT/SIGTERM; in-flight requests finish first."""
    config = settings.webhook
    publisher = RawPublisher(
        settings.kafka.bootstrap_servers, config.raw_topic, config.publish_timeout_s
    )
    app = create_app(settings, publisher)
    on: dict[str, Route] = app[ROUTES_KEY]
    routes = sorted(on)
    log.info(
        "webhook bridge on http://%s:%d, routes on: %s",
        config.host,
        config.port,
        ", ".join(f"/hooks/{source}" for source in routes) or "none",
    )
    web.run_app(app, host=config.host, port=config.port, print=None, shutdown_timeout=30)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    """The webhook bridge takes everything from the configuration ([webhook])."""


def _run(args: argparse.Namespace, settings: Settings) -> int:
    try:
        serve(settings)
    except ConfigError as exc:
        print(f"connectors: {exc}", file=sys.stderr)
        return 2
    return 0


COMMAND = BridgeCommand("HTTP server for push providers", _add_arguments, _run)
