"""Provider normalizers, one module per source, looked up by source name.

Each module `streams.core.normalizers.<name>` defines `SOURCE` (its name) and
`normalize(delivery) -> list[FileEvent]`. Adding a provider means adding one module, one
line in `SOURCES` (and in `KEY_LIMITS`), and its tests.

`normalize` holds every normalizer's events to the same bounds (`check_bounds`): no object
key longer than its provider allows, no bucket name, id or ordering token longer than any
provider writes. A delivery that breaks one is malformed, and so dead-lettered: nothing a
bounded event carries can grow a record past its topic's limit but its `raw` record, which
stage one checks as a whole (streams.core.routing).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache

from streams.core.delivery import Delivery
from streams.core.event import FileEvent
from streams.core.normalizers.base import MalformedDelivery, Normalizer

SOURCES: tuple[str, ...] = (
    "s3",
    "eventbridge",
    "gcs",
    "azure",
    "minio",
    "supabase",
    "b2",
    "box",
    "cloudinary",
    "appwrite",
    "reconcile",  # synthetic deliveries of `python -m connectors reconcile`
)


@dataclass(frozen=True, slots=True)
class KeyLimit:
    """The longest object key a provider allows, as it counts: UTF-8 bytes or characters."""

    length: int
    unit: str  # "bytes" (UTF-8) or "characters"
    documented: str

    def exceeded_by(self, key: str) -> int | None:
        """The key's length in this unit when it is over the limit, else None."""
        if len(key) * 4 <= self.length:  # within the limit even in the longest UTF-8
            return None
        if self.unit == "characters":
            length = len(key)
        else:
            length = len(key.encode("utf-8", "surrogatepass"))
        return length if length > self.length else None


_S3_KEY = KeyLimit(1024, "bytes", "S3 object keys: at most 1,024 bytes of UTF-8")
KEY_LIMITS: dict[str, KeyLimit] = {
    "s3": _S3_KEY,
    "eventbridge": _S3_KEY,
    "minio": _S3_KEY,  # S3's limit (MinIO's own is 1,024 bytes too)
    "reconcile": _S3_KEY,  # keys listed through the S3 API
    "gcs": KeyLimit(1024, "bytes", "GCS object names: 1-1,024 bytes of UTF-8"),
    "azure": KeyLimit(1024, "characters", "Azure blob names: 1-1,024 characters"),
    "b2": KeyLimit(1024, "bytes", "B2 file names: at most 1,024 bytes of UTF-8"),
    # Supabase Storage keys follow S3's object key rules (its storage is S3-backed).
    "supabase": _S3_KEY,
    # The key is the file id, a decimal number; no documented maximum, so S3's bound.
    "box": KeyLimit(1024, "bytes", "Box file ids (short decimal strings)"),
    # `resource_type/type/public_id`: a public id has 1-255 characters, the resource type
    # (image, video, raw) and delivery type (upload, private, authenticated, ...) are short.
    "cloudinary": KeyLimit(
        255 + 64, "characters", "Cloudinary public ids: 1-255 characters, plus the types"
    ),
    "appwrite": KeyLimit(36, "characters", "Appwrite file ids: at most 36 characters"),
}
"""Per source, the longest key its provider allows; a longer one is malformed."""
HEADERS_READ: dict[str, frozenset[str]] = {
    "appwrite": frozenset({"x-appwrite-webhook-events"}),
}
"""Per source, the HTTP headers (`Delivery.headers`, lower case) its normalizer reads. The
webhook bridge refuses a request that repeats one (400), so that the value it forwards is the
only one there was: the bridge and the worker cannot read two different ones."""
MAX_EVENTS_PER_DELIVERY: dict[str, int] = {
    # One notification is one record; a Lambda SQS event batches 10 messages by default
    # (raise `stream.max_events_per_delivery.s3` for a larger Lambda batch size).
    "s3": 10,
    "eventbridge": 1,  # one event per target invocation, SQS message or SNS message
    "gcs": 1,  # one Pub/Sub message, one change
    # Event Grid batches at most 5,000 events (maxEventsPerBatch); a rename is two.
    "azure": 10_000,
    "minio": 1,  # one record per webhook POST and per Kafka target message
    "supabase": 2,  # one row; a move is a delete and a create
    "b2": 50,  # 1-50 events per POST
    "box": 1,
    # A delete notification lists the resources of one Admin API call: by prefix or tag,
    # at most 1,000; a rename is two.
    "cloudinary": 1_000,
    "appwrite": 1,
    "reconcile": 1,  # connectors.reconcile writes one change per delivery
}
"""Per source, the most events one delivery becomes: what its provider sends at most
(PROVIDERS.md). A delivery with more was not sent by the provider as it is (one 1 MiB MinIO
POST of small records made 10,701 events): streams.core.routing dead-letters it whole, so
no part of it is published. `stream.max_events_per_delivery` overrides a source's bound."""
MAX_BUCKET_BYTES = 255
"""Longer than any provider's bucket or container name (S3, MinIO, Azure and B2: 63 or fewer
characters; GCS: 222; Appwrite bucket ids: 36)."""
MAX_ID_BYTES = 1024
"""Event ids are provider UUIDs, request ids or 32-hex-digit hashes: far shorter."""
MAX_TOKEN_BYTES = 1024
"""Sequencers, generations, version ids and ETags: tens of characters where documented."""


class UnknownSource(MalformedDelivery):
    """The delivery names a source no normalizer is registered for."""


@cache
def normalizer_for(source: str) -> Normalizer:
    """The normalizer registered for `source`; UnknownSource if there is none."""
    if source not in SOURCES:
        raise UnknownSource(f"unknown source {source!r} (known: {', '.join(SOURCES)})")
    module = importlib.import_module(f"{__name__}.{source}")
    normalize: Normalizer = module.normalize
    return normalize


def normalize(delivery: Delivery) -> list[FileEvent]:
    """Every canonical event in one delivery, with full provider keys (no instance rules),
    each within the bounds of `check_bounds`."""
    events = normalizer_for(delivery.source)(delivery)
    limit = KEY_LIMITS.get(delivery.source, _S3_KEY)
    for event in events:
        check_bounds(event, limit)
    return events


def check_bounds(event: FileEvent, limit: KeyLimit) -> None:
    """MalformedDelivery when a field of `event` is longer than any real one can be: its key
    (past `limit`), bucket, id or an ordering token. These travel as Kafka keys, headers and
    state keys besides the event's JSON, so they are bounded one by one."""
    over = limit.exceeded_by(event.key)
    if over is not None:
        raise MalformedDelivery(
            f"object key of {over:,} {limit.unit} is longer than the provider allows "
            f"({limit.documented})"
        )
    for what, value, most in (
        ("bucket name", event.bucket, MAX_BUCKET_BYTES),
        ("event id", event.id, MAX_ID_BYTES),
        ("sequencer", event.sequencer, MAX_TOKEN_BYTES),
        ("version id", event.version_id, MAX_TOKEN_BYTES),
        ("ETag", event.etag, MAX_TOKEN_BYTES),
    ):
        if value is not None and len(value) * 4 > most:
            size = len(value.encode("utf-8", "surrogatepass"))
            if size > most:
                raise MalformedDelivery(f"{what} of {size:,} bytes is over {most:,} bytes")


__all__ = [
    "KEY_LIMITS",
    "SOURCES",
    "KeyLimit",
    "MalformedDelivery",
    "UnknownSource",
    "check_bounds",
    "normalize",
    "normalizer_for",
]
