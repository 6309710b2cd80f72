"""What every webhook authenticator shares: request facts in, a verdict out.

An authenticator sees one HTTP request as plain data (`RequestFacts`: method, URL, query,
lower-cased headers, raw body, the bridge's clock reading) and answers with a `Verdict`:

* `publish`: authentic; the HTTP layer publishes the body and answers 202 once Kafka has it;
* `respond`: a handshake (SNS subscription, Event Grid validation, CloudEvents OPTIONS),
  answered as the provider expects and never published;
* `reject`: refused with a status (401 unauthenticated, forged, replayed; 503 when the bridge
  could not check, e.g. a signing certificate it could not fetch) and a short reason that
  becomes the `reason` label of `bridge_webhook_rejected`.

An authenticator whose scheme puts the credential (or what can be checked of it) in the
headers or the query string also offers `before_body` (`ChecksBeforeBody`): the bridge asks
it before it reads the body, with `body == b""`, so that a request without a valid secret is
refused before its body is read, held or parsed. `authenticate` still decides on the whole
request, repeating those checks.

Outbound I/O (fetching SNS certificates and Google's keys, confirming SNS subscriptions) and
the clock come from `Services`, so tests inject their own and never leave the machine.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

PUBLISH: Literal["publish"] = "publish"
RESPOND: Literal["respond"] = "respond"
REJECT: Literal["reject"] = "reject"


@dataclass(frozen=True)
class RequestFacts:
    """One HTTP request, as an authenticator sees it."""

    method: str
    url: str
    """The URL as the bridge received it (behind a proxy this is not the public URL)."""
    query: Mapping[str, str]
    """First value of each query parameter."""
    headers: Mapping[str, str]
    """Lower-case header name -> first value."""
    body: bytes
    now: float
    """The bridge's clock (Unix seconds) when the request arrived."""

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass(frozen=True)
class Verdict:
    """What to do with a request; build one with `publish()`, `respond()` or `reject()`."""

    outcome: Literal["publish", "respond", "reject"]
    status: int = 202
    reason: str = ""
    """reject: the metric reason; respond: the handshake kind."""
    detail: str = ""
    """For the log line only; never secret material."""
    body: bytes = b""
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)


def publish() -> Verdict:
    return Verdict(PUBLISH)


def respond(
    kind: str,
    status: int = 200,
    payload: Any = None,
    headers: Mapping[str, str] | None = None,
    detail: str = "",
) -> Verdict:
    """A handshake answer; `payload` is sent as JSON (None: empty body)."""
    body = b"" if payload is None else json.dumps(payload).encode()
    return Verdict(RESPOND, status, kind, detail, body, headers=dict(headers or {}))


def reject(reason: str, detail: str = "", status: int = 401) -> Verdict:
    return Verdict(REJECT, status, reason, detail)


class Authenticator(Protocol):
    """Decides on one request for one source's route."""

    @property
    def source(self) -> str: ...

    @property
    def methods(self) -> frozenset[str]:
        """HTTP methods the route answers (others get 405)."""
        ...

    @property
    def secret_headers(self) -> frozenset[str]:
        """Lower-case header names that carry credentials: never forwarded to Kafka."""
        ...

    @property
    def read_headers(self) -> frozenset[str]:
        """Lower-case header names its checks read (first value, `RequestFacts.headers`): a
        request that repeats one is refused 400 before they run, so that the value checked
        is the only one any later reader can see."""
        ...

    async def authenticate(self, request: RequestFacts) -> Verdict: ...


@runtime_checkable
class ChecksBeforeBody(Protocol):
    """An authenticator that can refuse a request from its head alone."""

    async def before_body(self, request: RequestFacts) -> Verdict | None:
        """A rejection decided from method, URL, query and headers (`request.body` is
        empty), or None: read the body and call `authenticate`."""
        ...


@dataclass(frozen=True)
class HttpResult:
    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


HttpGet = Callable[[str], Awaitable[HttpResult]]
"""GET a URL (https), return status, body (bounded) and lower-case headers; raise OSError or
asyncio.TimeoutError when it cannot."""

MAX_FETCH_BYTES = 256 * 1024
FETCH_TIMEOUT_S = 10.0


async def default_http_get(url: str) -> HttpResult:
    """GET over the network with TLS verification, a timeout and a size bound."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url, allow_redirects=False) as response,
        ):
            body = await response.content.read(MAX_FETCH_BYTES + 1)
            if len(body) > MAX_FETCH_BYTES:
                raise OSError(f"response from {url} is larger than {MAX_FETCH_BYTES} bytes")
            headers = {name.lower(): value for name, value in response.headers.items()}
            return HttpResult(response.status, body, headers)
    except aiohttp.ClientError as exc:
        raise OSError(f"GET {url} failed: {exc!r}") from exc


@dataclass(frozen=True)
class Services:
    """The clock and outbound HTTP the authenticators use; tests pass their own."""

    clock: Callable[[], float] = time.time
    http_get: HttpGet = default_http_get


FETCH_ERRORS = (OSError, asyncio.TimeoutError, ValueError, RecursionError)
"""What a failed fetch of keys or certificates may raise (ValueError: unparsable content)."""


def same(given: str | bytes | None, expected: str | bytes) -> bool:
    """Constant-time equality; a missing or empty value never matches (not even an empty
    expected value: a blank secret is never a credential)."""
    if not given or not expected:
        return False
    left = given.encode() if isinstance(given, str) else given
    right = expected.encode() if isinstance(expected, str) else expected
    return hmac.compare_digest(left, right)


def split_authorization(value: str | None) -> tuple[str, str]:
    """`Scheme credentials` -> (lower-case scheme, credentials); ("", "") when absent."""
    if not value:
        return "", ""
    scheme, _, credentials = value.strip().partition(" ")
    return scheme.lower(), credentials.strip()


@dataclass(frozen=True)
class Insecure:
    """A route configured `insecure`: everything is published, nothing is checked."""

    source: str
    methods: frozenset[str] = frozenset({"POST"})
    secret_headers: frozenset[str] = frozenset()
    read_headers: frozenset[str] = frozenset()

    async def authenticate(self, request: RequestFacts) -> Verdict:
        return publish()


@dataclass(frozen=True)
class SharedSecretHeader:
    """A static secret in a named header, compared whole (Supabase, EventBridge API key)."""

    source: str
    header: str
    secret: str
    methods: frozenset[str] = frozenset({"POST"})

    @property
    def secret_headers(self) -> frozenset[str]:
        return frozenset({self.header.lower()})

    @property
    def read_headers(self) -> frozenset[str]:
        return self.secret_headers

    async def before_body(self, request: RequestFacts) -> Verdict | None:
        given = request.header(self.header)
        if not given:
            return reject("missing-credentials", f"no {self.header} header")
        if not same(given, self.secret):
            return reject("bad-credentials", f"{self.header} does not match")
        return None

    async def authenticate(self, request: RequestFacts) -> Verdict:
        return await self.before_body(request) or publish()
