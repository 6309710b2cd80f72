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

from cryptography import x509

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


def _secret(name: str | None, environ: Mapping[str, str], field: str, source: str) -> str | None:
    if name is None:
        return None
    value = environ.get(name) or None
    if value is None:
        log.error(
            "webhook route %s: environment variable %s (webhook.routes.%s.%s) is not set",
            source,
            name,
            source,
            field,
        )
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
        trusted: tuple[x509.Certificate, ...] = ()
        if route.trusted_ca_file is not None:
            data = _read(route.trusted_ca_file, "trusted_ca_file", source)
            try:
                trusted = s3.load_authorities(data)
            except ValueError as exc:
                raise ConfigError(
                    f"webhook.routes.s3.trusted_ca_file: not a PEM bundle: {exc}"
                ) from None
        store = s3.CertificateStore(services.http_get, files, route.certificate_cache_s)
        return s3.SnsMessages(
            source,
            frozenset(route.topic_arns),
            store,
            trusted,
            services.http_get,
            route.confirm_subscriptions,
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
        secondary = _secret(route.secondary_secret_env, environ, "secondary_secret_env", source)
        return box.BoxSignature(source, secret, secondary, route.replay_window(source))
    if source == "cloudinary":
        return cloudinary.CloudinarySignature(
            source, secret, route.signature_algorithm, route.replay_window(source)
        )
    if source == "appwrite":
        assert route.url is not None  # checked by the config
        return appwrite.AppwriteSignature(source, secret, route.url)
    raise ConfigError(f"webhook.routes.{source}: no authenticator for this source")
