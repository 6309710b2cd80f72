"""Cloudinary notifications: `X-Cld-Signature` over body + `X-Cld-Timestamp` + API secret.

Sources: https://cloudinary.com/documentation/notification_signatures (a hexadecimal SHA-1 or
SHA-256 digest, per the account's `signature_algorithm`, of the whole body, then the
`X-Cld-Timestamp` value, then the API secret: a plain digest, not an HMAC; documented example:
body `{public_id: 'sample'}`, timestamp `1315060510`, secret `abcd` ->
`25f7e91709c858b97d688ce8da799dedb290d9ef`); `cloudinary/cloudinary_npm`
`utils.verifyNotificationSignature` / `webhook_signature` (refuses timestamps older than
`valid_for`, default 7200 s; SHA-256 test vector with secret `hardcoded`). This route also
refuses timestamps further than the window in the future.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal

from connectors.webhook_auth.base import RequestFacts, Verdict, publish, reject, same

SIGNATURE = "x-cld-signature"
TIMESTAMP = "x-cld-timestamp"
HEX_LENGTH = {"sha1": 40, "sha256": 64}
UNIX_SECONDS = re.compile(r"[0-9]{1,15}")


def signature(body: bytes, timestamp: str, secret: str, algorithm: str = "sha1") -> str:
    return hashlib.new(algorithm, body + timestamp.encode() + secret.encode()).hexdigest()


@dataclass(frozen=True)
class CloudinarySignature:
    source: str
    api_secret: str
    algorithm: Literal["sha1", "sha256"]
    window_s: float
    methods: frozenset[str] = frozenset({"POST"})
    secret_headers: frozenset[str] = frozenset()
    read_headers: frozenset[str] = frozenset({SIGNATURE, TIMESTAMP})

    async def before_body(self, request: RequestFacts) -> Verdict | None:
        """Headers there, the algorithm right, the timestamp inside the window (the digest
        needs the body)."""
        given, timestamp = request.header(SIGNATURE), request.header(TIMESTAMP)
        if not given or not timestamp:
            return reject("missing-signature", "no X-Cld-Signature or X-Cld-Timestamp header")
        given = given.strip().lower()
        if len(given) != HEX_LENGTH[self.algorithm] and len(given) in HEX_LENGTH.values():
            return reject("wrong-algorithm", f"signature is not {self.algorithm}")
        # ASCII digits, at most 15 (the SDK tests use 13): str.isdigit()
        # admits other scripts' digits, and int() of 5,000 digits raises.
        if not UNIX_SECONDS.fullmatch(timestamp.strip()):
            return reject("malformed", "X-Cld-Timestamp is not Unix seconds")
        if abs(request.now - int(timestamp)) > self.window_s:
            return reject("replayed", f"timestamp {timestamp.strip()} outside the window")
        return None

    async def authenticate(self, request: RequestFacts) -> Verdict:
        refused = await self.before_body(request)
        if refused is not None:
            return refused
        given = (request.header(SIGNATURE) or "").strip().lower()
        timestamp = request.header(TIMESTAMP) or ""
        expected = signature(request.body, timestamp, self.api_secret, self.algorithm)
        return publish() if same(given, expected) else reject("bad-signature", "digest differs")
