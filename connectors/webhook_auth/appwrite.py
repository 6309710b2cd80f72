"""Appwrite webhooks: `X-Appwrite-Webhook-Signature` = base64(HMAC-SHA1(key, URL + body)).

Sources: `appwrite/appwrite` `src/Appwrite/Platform/Workers/Webhooks.php` (`$signature =
base64_encode(hash_hmac('sha1', $url . $payload, $signatureKey, true))`) and
https://appwrite.io/docs/apis/webhooks ("append the payload to the end of webhook URL ...
HMAC-SHA1"). The URL is the one registered in Appwrite, configured per route (`url`): what
the bridge receives behind proxies may differ. Some Appwrite versions sign the URL as stored,
others `rawurldecode($url)`; both forms are accepted (they differ only for `%` escapes). No
timestamp is signed, so there is no replay window; the optional HTTP basic auth of Appwrite
webhooks is not checked.

What happened is not signed either: the body is the file document, the same for a create and
for a delete of an unchanged file, and the kind comes from the unsigned
`X-Appwrite-Webhook-Events` header. So a captured signed body can be sent again with another
event header. `EventMemory` remembers the digest of each signed body with the event header it
came with (bounded: `event_memory` entries for `event_memory_s`, default 10,000 for 24 h) and
admits only what a file's life allows: the same header again (a redelivery, which the stream
drops by id), or, once, a file delete after a create or update of the same body (a file
deleted unchanged). Anything else is refused (401 `event-mismatch`): a deleted file's body
sent again as a create (a resurrection), a create sent as an update or back.
What this cannot do: a create replayed as a delete is exactly what the real delete of that
unchanged file looks like, so it passes (the file is reported deleted early; its real delete
is then a duplicate by id). A body is remembered by one bridge process only (replicas do not
share it, a restart forgets), for the window only, and only once it was seen. Within the
dedupe TTL a replayed create of a deleted, unchanged file is also a duplicate by id.
`event_memory = 0` turns the check off.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections import OrderedDict
from dataclasses import dataclass, field
from urllib.parse import unquote_to_bytes

from connectors.webhook_auth.base import RequestFacts, Verdict, publish, reject, same

HEADER = "x-appwrite-webhook-signature"
EVENTS = "x-appwrite-webhook-events"
FILE_DELETE = "buckets.*.files.*.delete"


def event_names(header: str | None) -> str:
    """The event header in one canonical form: its names, stripped, sorted, deduplicated."""
    names = {name.strip() for name in (header or "").split(",")}
    return ",".join(sorted(name for name in names if name))


def is_delete(events: str) -> bool:
    """Whether canonical `events` name a file delete (the normalizer reads the same pattern)."""
    return FILE_DELETE in events.split(",")


@dataclass
class EventMemory:
    """Digest of a signed body -> the event names it came with, for `ttl_s`, at most
    `capacity` bodies (the oldest go first). Checked only with authentic bodies, so an
    attacker cannot fill it without Appwrite's key."""

    capacity: int
    ttl_s: float
    _seen: OrderedDict[bytes, tuple[str, float]] = field(default_factory=OrderedDict)

    def __len__(self) -> int:
        return len(self._seen)

    def admit(self, body: bytes, events: str, now: float) -> bool:
        """Whether `body` may come with `events` (module docstring): its first header, the
        same again, or once a file delete after another header; remembers what it admits."""
        if self.capacity <= 0:
            return True
        seen = self._seen
        while seen:
            oldest = next(iter(seen.values()))
            if oldest[1] > now:
                break
            seen.popitem(last=False)
        digest = hashlib.sha256(body).digest()
        remembered = seen.get(digest)
        if remembered is not None:
            if remembered[0] == events:
                return True
            if not (is_delete(events) and not is_delete(remembered[0])):
                return False
        seen[digest] = (events, now + self.ttl_s)
        seen.move_to_end(digest)
        while len(seen) > self.capacity:
            seen.popitem(last=False)
        return True


def signature(key: str, url: bytes | str, body: bytes) -> str:
    url_bytes = url.encode() if isinstance(url, str) else url
    digest = hmac.new(key.encode("utf-8"), url_bytes + body, hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def signed_urls(url: str) -> tuple[bytes, ...]:
    """The URL forms Appwrite versions sign: as stored, and PHP `rawurldecode`d."""
    stored, decoded = url.encode(), unquote_to_bytes(url)
    return (stored,) if decoded == stored else (stored, decoded)


@dataclass(frozen=True)
class AppwriteSignature:
    source: str
    key: str
    url: str
    memory: EventMemory = field(default_factory=lambda: EventMemory(0, 0.0))
    methods: frozenset[str] = frozenset({"POST"})
    secret_headers: frozenset[str] = frozenset()
    read_headers: frozenset[str] = frozenset({HEADER, EVENTS})

    async def before_body(self, request: RequestFacts) -> Verdict | None:
        """The signature header is there (the HMAC needs the body)."""
        given = request.header(HEADER)
        if not given or not given.strip():
            return reject("missing-signature", f"no {HEADER} header")
        return None

    async def authenticate(self, request: RequestFacts) -> Verdict:
        refused = await self.before_body(request)
        if refused is not None:
            return refused
        given = (request.header(HEADER) or "").strip()
        matched = False
        for url in signed_urls(self.url):
            matched |= same(given, signature(self.key, url, request.body))
        if not matched:
            return reject("bad-signature", "HMAC-SHA1 does not match")
        events = event_names(request.header(EVENTS))
        if not self.memory.admit(request.body, events, request.now):
            return reject(
                "event-mismatch",
                f"this signed body came before with other {EVENTS}; now {events[:200]!r}",
            )
        return publish()
