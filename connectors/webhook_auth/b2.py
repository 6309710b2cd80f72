"""Backblaze B2 Event Notifications: HMAC-SHA256 of the body with the rule's signing secret.

Sources: https://www.backblaze.com/docs/cloud-storage-event-notifications-reference-guide
("Verifying the Webhook Request Signature": the header value is the signature version,
always `v1`, `=`, then the lower-case hex HMAC-SHA256 of the request payload keyed with the
rule's `hmacSha256SigningSecret`); `Backblaze/b2-sdk-java` `B2EventNotification.SignatureUtils`
(key = the UTF-8 bytes of the secret string, never base64-decoded; the header may hold a
comma-separated list, any one matching suffices). B2 signs no timestamp, so there is no
replay window: the stream dedupes on `eventId`. A rule without a secret sends unsigned
requests, which this route refuses.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from connectors.webhook_auth.base import RequestFacts, Verdict, publish, reject, same

HEADER = "x-bz-event-notification-signature"
VERSION = "v1"


def signature(secret: str, body: bytes) -> str:
    """The header value B2 sends for `body`."""
    digest = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
    return f"{VERSION}={digest}"


@dataclass(frozen=True)
class B2Signature:
    source: str
    secret: str
    methods: frozenset[str] = frozenset({"POST"})
    secret_headers: frozenset[str] = frozenset()
    read_headers: frozenset[str] = frozenset({HEADER})

    async def before_body(self, request: RequestFacts) -> Verdict | None:
        """A signature header with a `v1=` part is there (the HMAC needs the body)."""
        given = request.header(HEADER)
        if not given or not given.strip():
            return reject("missing-signature", f"no {HEADER} header")
        versions = {part.strip().partition("=")[0].lower() for part in given.split(",")}
        if VERSION not in versions:
            return reject("wrong-algorithm", f"no {VERSION} signature in {HEADER}")
        return None

    async def authenticate(self, request: RequestFacts) -> Verdict:
        refused = await self.before_body(request)
        if refused is not None:
            return refused
        given = request.header(HEADER) or ""
        expected = signature(self.secret, request.body)
        candidates = [part.strip() for part in given.split(",") if part.strip()]
        matched = False
        for part in candidates:
            version, _, value = part.partition("=")
            matched |= same(f"{version.lower()}={value.lower()}", expected)
        return publish() if matched else reject("bad-signature", "HMAC-SHA256 does not match")
