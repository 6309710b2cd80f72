"""The webhook bridge: one HTTP route per push source, `POST /hooks/<source>`.

A delivery is published to the raw topic only if its route is on and the request is
authentic, and it is answered 2xx only once Kafka acknowledged the write; otherwise 503, so
the provider delivers again. An authenticated body that is not valid JSON is still published
(the stream dead-letters it): nothing is lost.

Routes: a source's route is on when the configuration gives it a token (`[webhook.routes.X]
token_env = "ENV_VAR_NAME"`: `Authorization: Bearer <token>`), or lists it as insecure for
local development (logged as a warning at start-up). Any other source answers 404.

    GET /healthz   200 while the bridge runs
    GET /metrics   Prometheus metrics
"""

from __future__ import annotations

import argparse
import hmac
import logging
import os
import time
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest

from connectors.command import BridgeCommand
from connectors.publisher import PublishFailed, RawPublisher, raw_headers
from streams.config import Settings, WebhookConfig
from streams.normalizers import SOURCES

log = logging.getLogger(__name__)

ACCEPTED = Counter("bridge_webhook_accepted", "Deliveries published and acknowledged", ["source"])
REJECTED = Counter("bridge_webhook_rejected", "Deliveries refused", ["source", "reason"])
PUBLISH_SECONDS = Histogram(
    "bridge_webhook_publish_seconds", "From request to Kafka acknowledgement", ["source"]
)

PUBLISHER_KEY = web.AppKey("publisher", RawPublisher)


@dataclass(frozen=True)
class Route:
    source: str
    token: str | None
    insecure: bool

    def authentic(self, request: web.Request) -> bool:
        if self.insecure:
            return True
        if self.token is None:
            return False
        given = request.headers.get("Authorization", "")
        scheme, _, credential = given.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            credential.encode(), self.token.encode()
        )


def build_routes(config: WebhookConfig, environ: dict[str, str] | None = None) -> dict[str, Route]:
    """The routes that are on, from configuration and the environment."""
    environ = dict(os.environ) if environ is None else environ
    routes: dict[str, Route] = {}
    for source in SOURCES:
        route_config = config.routes.get(source)
        token = None
        if route_config is not None and route_config.token_env:
            token = environ.get(route_config.token_env) or None
            if token is None:
                log.error(
                    "webhook route %s: environment variable %s is not set; route off",
                    source,
                    route_config.token_env,
                )
        insecure = source in config.insecure_sources or bool(route_config and route_config.insecure)
        if insecure:
            log.warning(
                "webhook route /hooks/%s accepts UNAUTHENTICATED deliveries "
                "(configured as insecure: local development only)",
                source,
            )
        if token is not None or insecure:
            routes[source] = Route(source, token, insecure)
    return routes


async def receive(request: web.Request) -> web.Response:
    source = request.match_info["source"]
    routes: dict[str, Route] = request.app["routes"]
    route = routes.get(source)
    if route is None:
        REJECTED.labels(source if source in SOURCES else "?", "no-route").inc()
        raise web.HTTPNotFound(text=f"no route for source {source!r}\n")
    if not route.authentic(request):
        REJECTED.labels(source, "unauthenticated").inc()
        raise web.HTTPUnauthorized(text="unauthenticated\n")
    limit: int = request.app["max_body_bytes"]
    if request.content_length is not None and request.content_length > limit:
        REJECTED.labels(source, "too-large").inc()
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
    body = await request.content.read(limit + 1)
    if len(body) > limit:
        REJECTED.labels(source, "too-large").inc()
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(body))
    started = time.monotonic()
    headers = raw_headers(source, "webhook", dict(request.headers))
    try:
        await request.app[PUBLISHER_KEY].publish(body, headers)
    except PublishFailed as exc:
        REJECTED.labels(source, "kafka-unavailable").inc()
        log.warning("delivery to /hooks/%s not acknowledged by Kafka: %s", source, exc)
        raise web.HTTPServiceUnavailable(text="not stored; deliver again\n") from None
    PUBLISH_SECONDS.labels(source).observe(time.monotonic() - started)
    ACCEPTED.labels(source).inc()
    return web.json_response({"accepted": True}, status=202)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(), content_type=CONTENT_TYPE_LATEST.split(";")[0])


def create_app(
    settings: Settings, publisher: RawPublisher, environ: dict[str, str] | None = None
) -> web.Application:
    app = web.Application(client_max_size=settings.webhook.max_body_bytes + 1)
    app[PUBLISHER_KEY] = publisher
    app["routes"] = build_routes(settings.webhook, environ)
    app["max_body_bytes"] = settings.webhook.max_body_bytes

    async def lifecycle(app: web.Application):  # type: ignore[no-untyped-def]
        await publisher.start()
        yield
        # aiohttp has finished in-flight requests by now: their writes are acknowledged.
        await publisher.stop()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/hooks/{source}", receive)
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
    routes = sorted(app["routes"])
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
    serve(settings)
    return 0


COMMAND = BridgeCommand("HTTP server for push providers", _add_arguments, _run)
