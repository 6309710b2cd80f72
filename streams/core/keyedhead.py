"""The head of a keyed record: what stage two decides on, packed, so that it never parses
the event's JSON (streams.core.records, "Keyed record").

The `head` header's value: one version byte (`KEYED_HEAD_VERSION`), then a MessagePack array
`[id, type, key, bucket, provider, sequencer, time, version_only, etag, raw]`: `time` as the
event's JSON writes it (RFC 3339 in UTC, `Z`), `raw` only the fields of the provider's record
that ordering reads (`HEAD_RAW_FIELDS`), or null when the event has no `raw`.

Versions: a reader takes the elements it knows and ignores any further ones, so a later
release may append elements within version 1; a change of meaning or order is a new version,
which a reader that does not know it refuses (stage two dead-letters the record) rather than
misreads. An event whose head MessagePack cannot hold (an integer beyond 64 bits among those
raw fields) gets none, and stage two reads its JSON instead.

Not in the compiled core (streams.core.compiled): `HeadV1` is a msgspec Struct, whose
metaclass mypyc cannot compile; its work is msgspec's C either way.
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

import msgspec

from streams.core.event import FileEvent, format_time

KEYED_HEAD_VERSION = 1
"""The first byte of a `head` header: the layout of what follows."""
HEAD_RAW_FIELDS = ("topic", "source", "awsRegion", "region", "metageneration")
"""The fields of an event's `raw` that stage two reads (streams.core.ordering: an Azure
event's `topic` or `source` and an S3 or EventBridge event's region name its scope, a GCS
event's `metageneration` is part of its token); the head carries these, no other.
tests/unit/test_keyed_head.py holds stage two's scope and token of every normalizer test
payload to those of the event itself."""

_VERSION_1 = bytes((KEYED_HEAD_VERSION,))
_encode = msgspec.msgpack.Encoder().encode
_json = msgspec.json.Encoder().encode


class HeadV1(msgspec.Struct, array_like=True):
    """Version 1 of the head, as stage two reads it (module docstring)."""

    id: str
    type: str
    key: str
    bucket: str | None
    provider: str
    sequencer: str | None
    time: str | None
    version_only: bool | None
    etag: str | None
    raw: dict[str, Any] | None


_decode_v1 = msgspec.msgpack.Decoder(HeadV1).decode


def pack_head(event: FileEvent) -> bytes | None:
    """The `head` header of `event`'s keyed record; None when MessagePack cannot hold it."""
    fields = event.__dict__  # the model's values as stored: no copy, no serialisation
    raw = fields["raw"]
    if raw is not None:
        raw = {name: raw[name] for name in HEAD_RAW_FIELDS if name in raw}
    time = fields["time"]
    if time is None:
        time_text = None
    elif time.tzinfo is UTC:  # as the model keeps it: msgspec writes format_time's text
        time_text = _json(time)[1:-1].decode()
    else:
        time_text = format_time(time)
    try:
        return _VERSION_1 + _encode(
            (
                fields["id"],
                fields["type"],
                fields["key"],
                fields["bucket"],
                fields["provider"],
                fields["sequencer"],
                time_text,
                fields["version_only"],
                fields["etag"],
                raw,
            )
        )
    except (OverflowError, TypeError, UnicodeEncodeError):
        return None


def unpack_head(head: bytes) -> HeadV1:
    """The fields of a `head` header; ValueError when it is of another version or unreadable."""
    if head[:1] != _VERSION_1:
        version = head[0] if head else None
        raise ValueError(
            f"keyed record head of version {version} (this worker reads {KEYED_HEAD_VERSION})"
        )
    try:
        return _decode_v1(memoryview(head)[1:])
    except msgspec.DecodeError as exc:
        raise ValueError(f"keyed record head is unreadable: {exc}") from None
