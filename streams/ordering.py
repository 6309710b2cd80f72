"""Per-key ordering, pure: how two events of one key compare, by the provider's own fields.

* S3, EventBridge, MinIO: the `sequencer`, hex, case-normalised, the shorter right-padded
  with `0` before a string comparison (what AWS documents today; see PROVIDERS.md §1). AWS
  promises the order only for events of one key, which is all this module compares.
* Azure: `data.sequencer` compared as a byte-wise string (fixed-width hex).
* GCS: generation, then `created` before `deleted` of the same generation (a generation's
  delete or archive always follows its finalize), then metageneration.
* Everything else, or a pair whose tokens are of different kinds: the provider's event time.

Two events that compare equal, or whose order is unknown (no token, no time), both pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

SEQUENCER_WIDTH = 64
TYPE_RANK = {"created": 0, "deleted": 1}
AWS_SEQUENCED = frozenset({"s3", "eventbridge", "minio"})


class Ordered(Protocol):
    """What ordering reads of an event: a FileEvent, or stage two's KeyedEvent."""

    @property
    def id(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def provider(self) -> str: ...
    @property
    def sequencer(self) -> str | None: ...
    @property
    def time(self) -> datetime | None: ...
    @property
    def raw(self) -> Mapping[str, Any] | None: ...


@dataclass(frozen=True, slots=True)
class Mark:
    """What the ordering step remembers about the newest event emitted for a key."""

    kind: str | None
    token: tuple[Any, ...] | None
    time: float | None
    event_id: str
    type: str

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "token": list(self.token) if self.token is not None else None,
            "time": self.time,
            "id": self.event_id,
            "type": self.type,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Mark:
        token = data.get("token")
        return cls(
            kind=data.get("kind"),
            token=tuple(token) if token is not None else None,
            time=data.get("time"),
            event_id=str(data.get("id", "")),
            type=str(data.get("type", "")),
        )


# An int64 has at most 19 digits; longer strings are not GCS numbers (and int() may refuse them).
MAX_NUMBER_DIGITS = 20


def _int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    # isascii: str.isdigit() accepts "²", which int() refuses.
    if (
        isinstance(value, str)
        and value.isascii()
        and value.isdigit()
        and len(value) <= MAX_NUMBER_DIGITS
    ):
        return int(value)
    return None


def order_token(event: Ordered) -> tuple[str, tuple[Any, ...]] | None:
    """(kind, comparable token) for the event, or None when its provider has no token."""
    sequencer = event.sequencer
    if event.provider in AWS_SEQUENCED and sequencer:
        normalised = sequencer.upper()
        width = max(SEQUENCER_WIDTH, len(normalised))
        return "aws-sequencer", (normalised.ljust(width, "0"),)
    if event.provider == "azure" and sequencer:
        return "azure-sequencer", (sequencer,)
    if event.provider == "gcs":
        generation = _int(sequencer)
        if generation is None:
            return None
        metageneration = _int((event.raw or {}).get("metageneration")) or 0
        return "gcs-generation", (generation, TYPE_RANK[event.type], metageneration)
    return None


def event_seconds(time: datetime | None) -> float | None:
    return time.timestamp() if time is not None else None


def mark_for(event: Ordered) -> Mark:
    found = order_token(event)
    kind, token = found if found is not None else (None, None)
    return Mark(
        kind=kind, token=token, time=event_seconds(event.time), event_id=event.id, type=event.type
    )


def staleness(event: Ordered, last: Mark | None) -> str | None:
    """Why `event` is older than the last emitted event of its key, or None if it is not."""
    if last is None:
        return None
    mark = mark_for(event)
    if (
        mark.kind is not None
        and mark.kind == last.kind
        and mark.token is not None
        and last.token is not None
    ):
        if mark.token < last.token:
            return (
                f"{mark.kind} {event.sequencer} is older than that of the emitted "
                f"{last.type} event {last.event_id}"
            )
        return None
    if mark.time is not None and last.time is not None and mark.time < last.time:
        return (
            f"event time {event.time.isoformat() if event.time else '?'} is older than "
            f"that of the emitted {last.type} event {last.event_id}"
        )
    return None
