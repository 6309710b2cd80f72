"""MinIO webhook target: the `Authorization` header built from the target's `auth_token`.

Source: `minio/minio` `internal/event/target/webhook.go` (`send()`): a token of two
whitespace-separated fields (`<scheme> <token>`) is sent as is; a single field is sent as
`Bearer <token>`. The body is not signed, so the header is all there is (use TLS).
"""

from __future__ import annotations

from dataclasses import dataclass

from connectors.webhook_auth.base import (
    RequestFacts,
    Verdict,
    publish,
    reject,
    same,
    split_authorization,
)


def expected_authorization(auth_token: str) -> tuple[str, str]:
    """(lower-case scheme, credentials) MinIO sends for `auth_token`."""
    fields = auth_token.split()
    if len(fields) == 2:
        return fields[0].lower(), fields[1]
    return "bearer", auth_token.strip()


@dataclass(frozen=True)
class MinioToken:
    source: str
    auth_token: str
    methods: frozenset[str] = frozenset({"POST"})
    secret_headers: frozenset[str] = frozenset({"authorization"})
    read_headers: frozenset[str] = frozenset({"authorization"})

    async def before_body(self, request: RequestFacts) -> Verdict | None:
        """The whole check: the token is in the header."""
        scheme, credentials = split_authorization(request.header("authorization"))
        if not scheme or not credentials:
            return reject("missing-credentials", "no Authorization header with a token")
        want_scheme, want = expected_authorization(self.auth_token)
        # Both compared, always: no early exit that would time the scheme separately.
        matches = same(credentials, want) & (scheme == want_scheme)
        return None if matches else reject("bad-credentials", "token does not match")

    async def authenticate(self, request: RequestFacts) -> Verdict:
        return await self.before_body(request) or publish()
