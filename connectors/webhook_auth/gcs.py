"""GCS notifications through a Pub/Sub push subscription: Google's OIDC token, or a shared token.

Sources: https://cloud.google.com/pubsub/docs/authenticate-push-subscriptions: with
authentication on, Pub/Sub sends `Authorization: Bearer <JWT>`, an OpenID Connect token
signed by Google (`{"alg":"RS256","kid":...}`) with claims `aud` (the configured audience,
by default the push endpoint URL), `iss` (`https://accounts.google.com` or
`accounts.google.com`), `email` (the subscription's service account), `email_verified`,
`iat`, `exp`; the subscriber verifies the signature with Google's public keys
(https://www.googleapis.com/oauth2/v3/certs, JWKS) and the claims. The older scheme, a
secret token in the push endpoint's query string (`?token=...`), is supported as the shared
token. When both are configured, both are required.

The token's time claims are checked against the bridge's (injectable) clock with
`jwt_leeway_s` of tolerance; keys are cached per the JWKS response's `max-age` (1 h when it
gives none) and fetched again, at most once a minute, when a token names an unknown `kid`.
One fetch is in flight at a time, shared by every request waiting for the keys, and a failed
fetch is not made again for `FAILED_RETRY_S` (10 s): unauthenticated requests cannot make
the bridge fetch once each.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jwt

from connectors.webhook_auth.base import (
    FETCH_ERRORS,
    PUBLISH,
    HttpGet,
    RequestFacts,
    Verdict,
    publish,
    reject,
    same,
    split_authorization,
)

DEFAULT_MAX_AGE_S = 3600.0
REFETCH_AFTER_S = 60.0
FAILED_RETRY_S = 10.0
"""After a failed key fetch, how long until the next: Pub/Sub's retries back off from 10 s, so
a delivery refused meanwhile (503) is retried after it, while the requests in between cost no
fetch each (issue 23 #7; as the SNS certificate store, `s3.UNAVAILABLE_RETRY_S`)."""
MAX_AGE = re.compile(r"max-age=(\d+)")


class KeysUnavailable(Exception):
    """Google's keys could not be fetched."""


def keys_from_jwks(document: Mapping[str, Any]) -> dict[str, Any]:
    """kid -> public key for the RS256 signing keys of a JWKS document."""
    keys: dict[str, Any] = {}
    for entry in document.get("keys", []):
        if not isinstance(entry, dict) or entry.get("kty") != "RSA" or "kid" not in entry:
            continue
        if entry.get("use", "sig") != "sig" or entry.get("alg", "RS256") != "RS256":
            continue
        try:
            keys[str(entry["kid"])] = jwt.PyJWK(entry, algorithm="RS256").key
        except jwt.PyJWTError:
            continue
    return keys


@dataclass
class GoogleKeys:
    """Google's token signing keys: a fixed JWKS document, or fetched from `url` and cached.

    Fetches are bounded whatever the requests: one fetch in flight at a time, which every
    request that needs the keys meanwhile waits for; after a failed fetch none for
    `FAILED_RETRY_S`, during which requests are answered with the keys held (while they are
    at most `DEFAULT_MAX_AGE_S` past their expiry), else refused (`KeysUnavailable`, 503)."""

    url: str
    http_get: HttpGet
    fixed: Mapping[str, Any] | None = None
    fetches: int = 0
    """Outbound GETs made; for tests and the log."""
    _keys: dict[str, Any] = field(default_factory=dict)
    _fetched_at: float | None = None
    _expires_at: float = 0.0
    _failure: str = ""
    _retry_at: float = 0.0
    """Before this (the request clock), a failed fetch is not made again."""
    _flight: asyncio.Future[None] | None = None

    async def key(self, kid: str, now: float) -> Any | None:
        if self.fixed is not None:
            return self.fixed.get(kid)
        stale = now >= self._expires_at
        unknown = kid not in self._keys and (
            self._fetched_at is None or now - self._fetched_at >= REFETCH_AFTER_S
        )
        if stale or unknown:
            if self._flight is None and now < self._retry_at:
                if stale and not self._usable(now):
                    raise KeysUnavailable(
                        f"{self._failure} (not fetched again before {self._retry_at - now:.0f} s)"
                    )
            else:
                await self._shared_fetch(now)
        return self._keys.get(kid)

    def _usable(self, now: float) -> bool:
        """Whether the keys held may still be served while Google's cannot be fetched."""
        return bool(self._keys) and now < self._expires_at + DEFAULT_MAX_AGE_S

    async def _shared_fetch(self, now: float) -> None:
        """The fetch in flight, started if there is none; a waiter that gives up (its client
        went away) does not cancel it for the others."""
        flight = self._flight
        if flight is None:
            flight = self._flight = asyncio.ensure_future(self._fetch(now))
            flight.add_done_callback(self._landed)
        await asyncio.shield(flight)

    def _landed(self, done: asyncio.Future[None]) -> None:
        self._flight = None
        if not done.cancelled():
            done.exception()  # retrieved here, so a fetch nobody waits for logs nothing

    async def _fetch(self, now: float) -> None:
        self.fetches += 1
        try:
            result = await self.http_get(self.url)
            if result.status != 200:
                raise OSError(f"HTTP {result.status}")
            document = json.loads(result.body)
        except FETCH_ERRORS as exc:
            self._failure = f"fetching {self.url}: {exc!r}"
            self._retry_at = now + FAILED_RETRY_S
            if self._usable(now):
                return  # keep serving the keys we have for a while
            raise KeysUnavailable(self._failure) from None
        match = MAX_AGE.search(result.headers.get("cache-control", ""))
        max_age = float(match.group(1)) if match else DEFAULT_MAX_AGE_S
        self._keys = keys_from_jwks(document if isinstance(document, dict) else {})
        self._fetched_at, self._expires_at = now, now + max_age
        self._failure, self._retry_at = "", 0.0


@dataclass(frozen=True)
class OidcPolicy:
    audience: str
    service_account: str
    issuers: tuple[str, ...]
    leeway_s: float


def check_claims(claims: Mapping[str, Any], policy: OidcPolicy, now: float) -> str | None:
    """None when the verified token's claims are acceptable, else the reason."""
    for name in ("exp", "iat"):
        if not isinstance(claims.get(name), int | float):
            return f"token has no numeric {name}"
    if now > claims["exp"] + policy.leeway_s:
        return "token expired"
    if claims["iat"] > now + policy.leeway_s:
        return "token issued in the future"
    if claims.get("iss") not in policy.issuers:
        return f"issuer {claims.get('iss')!r} not accepted"
    if claims.get("email") != policy.service_account:
        return f"email {claims.get('email')!r} is not the configured service account"
    if claims.get("email_verified") is not True:
        return "email_verified is not true"
    return None


@dataclass(frozen=True)
class PubSubPush:
    source: str
    oidc: OidcPolicy | None
    keys: GoogleKeys | None
    token: str | None
    token_param: str
    methods: frozenset[str] = frozenset({"POST"})
    secret_headers: frozenset[str] = frozenset({"authorization"})

    @property
    def read_headers(self) -> frozenset[str]:
        return frozenset({"authorization"}) if self.oidc is not None else frozenset()

    async def before_body(self, request: RequestFacts) -> Verdict | None:
        """The whole check: the token and the shared secret are in the head of the request
        (the OIDC token is not bound to the body)."""
        if self.token is not None:
            given = request.query.get(self.token_param)
            if not given:
                return reject("missing-credentials", f"no {self.token_param} query parameter")
            if not same(given, self.token):
                return reject("bad-credentials", "push token does not match")
        if self.oidc is not None and self.keys is not None:
            verdict = await self._oidc(request, self.oidc, self.keys)
            return None if verdict.outcome == PUBLISH else verdict
        return None

    async def authenticate(self, request: RequestFacts) -> Verdict:
        return await self.before_body(request) or publish()

    async def _oidc(self, request: RequestFacts, policy: OidcPolicy, keys: GoogleKeys) -> Verdict:
        scheme, token = split_authorization(request.header("authorization"))
        if scheme != "bearer" or not token:
            return reject("missing-credentials", "no Bearer token")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            return reject("bad-token", "token is not a JWT")
        if header.get("alg") != "RS256":
            return reject("wrong-algorithm", f"token alg {header.get('alg')!r}, RS256 expected")
        try:
            key = await keys.key(str(header.get("kid")), request.now)
        except KeysUnavailable as exc:
            return reject("keys-unavailable", str(exc), 503)
        if key is None:
            return reject("bad-token", f"unknown signing key {header.get('kid')!r}")
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=["RS256"],
                audience=policy.audience,
                # Times are checked in check_claims against the bridge's own clock.
                options={"verify_exp": False, "verify_iat": False, "verify_nbf": False},
            )
        except jwt.InvalidAudienceError:
            return reject("bad-token", "token audience does not match")
        except jwt.PyJWTError as exc:
            return reject("bad-token", f"token does not verify: {type(exc).__name__}")
        problem = check_claims(claims, policy, request.now)
        return publish() if problem is None else reject("bad-token", problem)
