"""Amazon EventBridge API destinations: the authorization of the destination's connection.

Source: https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-target-connection-auth.html
and the `CreateConnection` API (`AuthorizationType` BASIC | API_KEY |
OAUTH_CLIENT_CREDENTIALS): for API_KEY EventBridge sends the header `ApiKeyName` with the
value `ApiKeyValue`; for BASIC, `Authorization: Basic base64(Username:Password)`. OAuth client
credentials would need this bridge to be an OAuth authorization server and is not supported.
The event itself is not signed.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from connectors.webhook_auth.base import (
    PUBLISH,
    RequestFacts,
    SharedSecretHeader,
    Verdict,
    publish,
    reject,
    same,
    split_authorization,
)


def api_key(header: str, value: str) -> SharedSecretHeader:
    return SharedSecretHeader("eventbridge", header, value)


@dataclass(frozen=True)
class BasicAuth:
    source: str
    username: str
    password: str
    methods: frozenset[str] = frozenset({"POST"})
    secret_headers: frozenset[str] = frozenset({"authorization"})
    read_headers: frozenset[str] = frozenset({"authorization"})

    async def before_body(self, request: RequestFacts) -> Verdict | None:
        """The whole check: the credentials are in the header."""
        verdict = await self.authenticate(request)
        return None if verdict.outcome == PUBLISH else verdict

    async def authenticate(self, request: RequestFacts) -> Verdict:
        scheme, credentials = split_authorization(request.header("authorization"))
        if scheme != "basic" or not credentials:
            return reject("missing-credentials", "no Basic Authorization header")
        try:
            decoded = base64.b64decode(credentials, validate=True)
        except (binascii.Error, ValueError):
            return reject("bad-credentials", "Basic credentials are not base64")
        username, colon, password = decoded.partition(b":")
        ok = same(username, self.username.encode()) & same(password, self.password.encode())
        if not (colon and ok):
            return reject("bad-credentials", "username or password does not match")
        return publish()
