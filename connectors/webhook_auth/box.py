"""Box webhooks (V2): primary and secondary HMAC-SHA256 signatures and a 10-minute window.

Sources: https://developer.box.com/guides/webhooks/v2/signatures-v2/
(`box/developer.box.com:content/guides/webhooks/v2/signatures-v2.md`): refuse a
`BOX-DELIVERY-TIMESTAMP` older than ten minutes; compute base64(HMAC-SHA256(key, raw body bytes
followed by the timestamp header's bytes)) with the primary and with the secondary key and
compare with `BOX-SIGNATURE-PRIMARY` and `BOX-SIGNATURE-SECONDARY` respectively; either match
suffices (key rotation). The doc's code samples swap the two header names; the prose is
followed here. `box/box-python-sdk` `WebhooksManager.validate_message` also refuses a
`box-signature-version` other than `1`, a `box-signature-algorithm` other than `HmacSHA256`,
and timestamps as far in the future; so does this route. Test vector: `box-python-sdk`
`test/box_sdk_gen/test/webhooks.py`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from datetime import datetime

from connectors.webhook_auth.base import RequestFacts, Verdict, publish, reject, same

TIMESTAMP = "box-delivery-timestamp"
PRIMARY = "box-signature-primary"
SECONDARY = "box-signature-secondary"
VERSION = "box-signature-version"
ALGORITHM = "box-signature-algorithm"


def signature(key: str, body: bytes, timestamp: str) -> str:
    """What Box puts in a signature header for `key`."""
    digest = hmac.new(key.encode("utf-8"), body + timestamp.encode("utf-8"), hashlib.sha256)
    return base64.b64encode(digest.digest()).decode("ascii")


MAX_TIMESTAMP_CHARS = 64
"""Far more than RFC 3339 needs (`2016-07-11T10:10:33.123456-07:00` is 32)."""


def parse_timestamp(value: str) -> float | None:
    """RFC 3339 with an offset (`2016-07-11T10:10:33-07:00`) -> Unix seconds; None for
    anything else, however long or odd (never an exception)."""
    text = value.strip()
    if len(text) > MAX_TIMESTAMP_CHARS:
        return None
    try:
        parsed = datetime.fromisoformat(text)
        if parsed.tzinfo is None:
            return None
        return parsed.timestamp()
    except (ValueError, OverflowError, OSError):  # out of range once moved to UTC
        return None


@dataclass(frozen=True)
class BoxSignature:
    source: str
    primary_key: str
    secondary_key: str | None
    window_s: float
    methods: frozenset[str] = frozenset({"POST"})
    secret_headers: frozenset[str] = frozenset()
    read_headers: frozenset[str] = frozenset({TIMESTAMP, PRIMARY, SECONDARY, VERSION, ALGORITHM})

    async def before_body(self, request: RequestFacts) -> Verdict | None:
        """Headers there, version and algorithm right, the timestamp inside the window (the
        HMAC needs the body)."""
        timestamp = request.header(TIMESTAMP)
        primary, secondary = request.header(PRIMARY), request.header(SECONDARY)
        if timestamp is None or (primary is None and secondary is None):
            return reject("missing-signature", "no Box timestamp or signature header")
        if request.header(VERSION) != "1" or request.header(ALGORITHM) != "HmacSHA256":
            return reject("wrong-algorithm", "Box signature version 1 / HmacSHA256 expected")
        sent_at = parse_timestamp(timestamp)
        if sent_at is None:
            return reject("malformed", "BOX-DELIVERY-TIMESTAMP is not RFC 3339 with an offset")
        if abs(request.now - sent_at) > self.window_s:
            return reject("replayed", f"delivery timestamp {timestamp} outside the window")
        return None

    async def authenticate(self, request: RequestFacts) -> Verdict:
        refused = await self.before_body(request)
        if refused is not None:
            return refused
        timestamp = request.header(TIMESTAMP) or ""
        primary, secondary = request.header(PRIMARY), request.header(SECONDARY)
        matched = same(primary, signature(self.primary_key, request.body, timestamp))
        if self.secondary_key is not None:
            expected = signature(self.secondary_key, request.body, timestamp)
            matched |= same(secondary, expected)
        return publish() if matched else reject("bad-signature", "no Box signature matches")
