"""Authenticity checks of the webhook bridge, one module per push source.

`build_authenticator(source, route, environ, services)` turns a route's configuration and
the secrets named by it into an `Authenticator` (see `base`), or None when the route is off.
Each authenticator is a small object whose `authenticate(RequestFacts) -> Verdict` does no
HTTP serving of its own, so it is tested without a server.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

from connectors.webhook_auth import (
    appwrite,
    azure,
    b2,
    box,
    cloudinary,
    eventbridge,
    gcs,
    minio,
    s3,
    supabase,
)
from connectors.webhook_auth.base import (
    Authenticator,
    Insecure,
    RequestFacts,
    Services,
    Verdict,
)
from streams.config import ConfigError, WebhookRouteConfig

__all__ = ["Authenticator", "RequestFacts", "Services", "Verdict", "build_authenticator"]

log = logging.getLogger(__name__)


def _read(path: Path, field: str, source: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"webhook.routes.{source}.{field}: cannot read {path}: {exc.strerror or exc}"
        ) from None


def _secret(
    name: str | None,
    environ: Mapping[str, str],
    field: str,
    source: str,
    without: str = "the route stays off (404)",
) -> str | None:
    """The secret in environment variable `name`; None (and a warning naming the variable)
    when it is unset, empty or only whitespace: a blank secret would admit a blank credential
    (`Authorization: Bearer ` with no token), so it is no secret and the route stays off."""
    if name is None:
        return None
    value = environ.get(name)
    if value is None or not value.strip():
        log.warning(
            "webhook route %s: environment variable %s (webhook.routes.%s.%s) is %s: %s",
            source,
            name,
            source,
            field,
            "not set" if value is None else "empty or blank",
            without,
        )
        return None
    return value


def build_authenticator(
    source: str,
    route: WebhookRouteConfig,
    environ: Mapping[str, str],
    services: Services,
    insecure: bool = False,
) -> tuple[Authenticator, bool] | None:
    """(the route's authenticator, whether it authenticates); None: the route is off (404).

    An `insecure` route without credentials publishes everything (Azure's handshakes are
    still answered); with credentials, they win and `insecure` is ignored. Raises
    ConfigError when a file the route names cannot be read.
    """
    field = "secret_env" if route.secret_env is not None else "token_env"
    secret = _secret(route.secret_variable, environ, field, source)
    built = _secure(source, route, secret, environ, services)
    if built is not None:
        if insecure:
            log.warning("webhook route %s has credentials: `insecure` is ignored", source)
        return built, True
    if not insecure:
        return None
    if source == "azure":
        handshakes_only = azure.EventGrid(
            source, None, route.query_param(source), None, route.allowed_origins, route.allowed_rate
        )
        return handshakes_only, False
    return Insecure(source), False


def _sns_anchors(route: WebhookRouteConfig) -> s3.TrustAnchors:
    """The CAs SNS signing certificates must chain to: `trusted_ca_file`, else the system's."""
    if route.trusted_ca_file is not None:
        data = _read(route.trusted_ca_file, "trusted_ca_file", "s3")
        try:
            return s3.TrustAnchors(
                s3.load_authorities(data), f"trusted_ca_file {route.trusted_ca_file}"
            )
        except ValueError as exc:
            raise ConfigError(
                f"webhook.routes.s3.trusted_ca_file: not a PEM bundle: {exc}"
            ) from None
    try:
        path, certificates = s3.system_trust_store()
    except ValueError as exc:
        raise ConfigError(f"webhook.routes.s3.trusted_ca_file: {exc}") from None
    log.info(
        "webhook route s3: SNS signing certificates must chain to the system trust store %s "
        "(%d CAs; webhook.routes.s3.trusted_ca_file replaces it)",
        path,
        len(certificates),
    )
    return s3.TrustAnchors(certificates, f"system trust store {path}")


def _secure(
    source: str,
    route: WebhookRouteConfig,
    secret: str | None,
    environ: Mapping[str, str],
    services: Services,
) -> Authenticator | None:
    if source == "s3":
        if not route.topic_arns:
            return None
        files = {
            url: _read(path, "certificate_files", source)
            for url, path in route.certificate_files.items()
        }
        store = s3.CertificateStore(
            services.http_get, files, route.certificate_cache_s, _sns_anchors(route)
        )
        return s3.SnsMessages(
            source,
            frozenset(route.topic_arns),
            store,
            services.http_get,
            route.confirm_subscriptions,
            route.max_message_age_s,
        )
    if source == "gcs":
        oidc: gcs.OidcPolicy | None = None
        keys: gcs.GoogleKeys | None = None
        if route.audience is not None and route.service_account is not None:
            oidc = gcs.OidcPolicy(
                route.audience, route.service_account, route.issuers, route.jwt_leeway_s
            )
            fixed = None
            if route.jwks_file is not None:
                try:
                    document = json.loads(_read(route.jwks_file, "jwks_file", source))
                    fixed = gcs.keys_from_jwks(document)
                except (ValueError, AttributeError) as exc:
                    raise ConfigError(
                        f"webhook.routes.gcs.jwks_file: not a JWKS document: {exc}"
                    ) from None
            keys = gcs.GoogleKeys(route.jwks_url, services.http_get, fixed)
        if oidc is None and secret is None:
            return None
        return gcs.PubSubPush(source, oidc, keys, secret, route.query_param(source))
    if secret is None:
        return None
    if source == "eventbridge":
        if route.auth == "basic":
            assert route.basic_username is not None  # checked by the config
            return eventbridge.BasicAuth(source, route.basic_username, secret)
        assert route.secret_header is not None  # checked by the config
        return eventbridge.api_key(route.secret_header, secret)
    if source == "azure":
        return azure.EventGrid(
            source,
            secret,
            route.query_param(source),
            route.secret_header,
            route.allowed_origins,
            route.allowed_rate,
        )
    if source == "minio":
        return minio.MinioToken(source, secret)
    if source == "supabase":
        assert route.secret_header is not None  # checked by the config
        return supabase.supabase_header(route.secret_header, secret)
    if source == "b2":
        return b2.B2Signature(source, secret)
    if source == "box":
        secondary = _secret(
            route.secondary_secret_env,
            environ,
            "secondary_secret_env",
            source,
            "only the primary key is checked",
        )
        return box.BoxSignature(source, secret, secondary, route.replay_window(source))
    if source == "cloudinary":
        return cloudinary.CloudinarySignature(
            source, secret, route.signature_algorithm, route.replay_window(source)
        )
    if source == "appwrite":
        assert route.url is not None  # checked by the config
        memory = appwrite.EventMemory(route.event_memory, route.event_memory_s)
        return appwrite.AppwriteSignature(source, secret, route.url, memory)
    raise ConfigError(f"webhook.routes.{source}: no authenticator for this source")
