"""Per-key ordering, pure: how two events of one key compare, by the provider's own fields.

* S3, EventBridge, MinIO: the `sequencer`, hex, case-normalised, the shorter right-padded
  with `0` before a string comparison (what AWS documents today; see PROVIDERS.md §1). AWS
  promises the order only for events of one key, which is all this module compares.
* Azure: `data.sequencer` compared as a byte-wise string (fixed-width hex).
* GCS: generation, then `created` before `deleted` of the same generation (a generation's
  delete or archive always follows its finalize), then metageneration.
* Everything else, or a pair whose tokens are of different kinds: the provider's event time.

Two events that compare equal, or whose order is unknown (no token, no time), both pass.

Scopes (`scope`): tokens and times are compared only between events of one scope, the
provider that issued them: every provider's credential is a different party, and one
provider's sequencers, generations and clock say nothing about another's (a MinIO sequencer
`"F" * 64` or a Supabase time of 9999-12-31 must not make an S3 change look old). A scope is
the provider, narrowed where one endpoint receives several independent namespaces:

* `azure@<account>`: Event Grid delivers blob events of several storage accounts to one
  endpoint, containers are unique only per account, and sequencers are per account. The
  account is read from the event's `topic` (Event Grid schema) or `source` (CloudEvents),
  `/subscriptions/../providers/Microsoft.Storage/storageAccounts/<name>`; without one, `azure`.
* `s3@<partition>`, `eventbridge@<partition>` outside the `aws` partition (`aws-cn`,
  `aws-us-gov`, `aws-iso*`, `aws-eusc`, from the record's region): bucket names are unique only
  within a partition, and one bridge may accept SNS topics of several. In `aws`: `s3`.
* GCS bucket names are global, as are B2's; MinIO, Supabase and Appwrite payloads name no
  deployment or project, so one scope each (two projects of one provider posting to one route
  with the same bucket and key still share order).
* `reconcile` deliveries are synthetic listings of one instance's bucket, ordered by time
  against that bucket's own notifications: the emit stage gives them the scope of the
  instance's one source when its `sources` names exactly one (`streams.core.emitting`), else
  `reconcile`.

Clock skew (`bounded_mark`, `recorded_mark`): an event time more than `stream.max_clock_skew_s`
(default 300 s) ahead of the worker's clock is a provider's broken clock or a forged field. The
event is still emitted (it is authenticated, and newer than anything known), but its time is
not recorded: the key's mark keeps the time it had. A stored mark whose time is beyond the
bound (one recorded before this rule) counts as having no time.

Forgetting deleted keys (`with_grace`, `forgotten`): a mark left by a `deleted` event carries
`forget_at`, the worker's time when it was recorded plus the grace
(`stream.deleted_mark_grace_s`, default the instance's dedupe TTL). From then on it counts as
no mark: an event of that key older than the delete, delayed past the grace, is emitted as
if new. A live key's mark never expires.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

SEQUENCER_WIDTH = 64
TYPE_RANK = {"created": 0, "deleted": 1}
AWS_SEQUENCED = frozenset({"s3", "eventbridge", "minio"})
TOKEN_KINDS: dict[str, frozenset[str]] = {
    "aws-sequencer": AWS_SEQUENCED,
    "azure-sequencer": frozenset({"azure"}),
    "gcs-generation": frozenset({"gcs"}),
}
"""Which providers issue each kind of ordering token."""
AWS_PARTITIONS = (
    ("cn-", "aws-cn"),
    ("us-gov-", "aws-us-gov"),
    ("us-isob-", "aws-iso-b"),
    ("us-isof-", "aws-iso-f"),
    ("us-iso-", "aws-iso"),
    ("eu-isoe-", "aws-iso-e"),
    ("eusc-", "aws-eusc"),
)
"""Region prefix -> partition (botocore's `partitions.json` regionRegex); others are `aws`."""
AWS_REGION_FIELD = {"s3": "awsRegion", "eventbridge": "region"}
STORAGE_ACCOUNT = re.compile(
    r"/providers/Microsoft\.Storage/storageAccounts/([A-Za-z0-9]{3,24})(?:/|$)", re.IGNORECASE
)


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


@dataclass(slots=True, init=False)  # not frozen: built per record (streams.core.records)
class Mark:
    """What the ordering step remembers about the newest event emitted for a key. Built per
    emitted event and per key record read, so its `__init__` is written out (a dataclass's
    generated one runs interpreted even in the compiled core)."""

    kind: str | None
    token: tuple[Any, ...] | None
    time: float | None
    event_id: str
    type: str
    forget_at: float | None
    """A `deleted` key's mark only: when (worker clock, epoch seconds) it is forgotten
    (`forgotten`). Never set on a live key's mark, which is kept."""

    def __init__(
        self,
        kind: str | None,
        token: tuple[Any, ...] | None,
        time: float | None,
        event_id: str,
        type: str,
        forget_at: float | None = None,
    ) -> None:
        self.kind = kind
        self.token = token
        self.time = time
        self.event_id = event_id
        self.type = type
        self.forget_at = forget_at

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "kind": self.kind,
            "token": list(self.token) if self.token is not None else None,
            "time": self.time,
            "id": self.event_id,
            "type": self.type,
        }
        if self.forget_at is not None:
            data["forget_at"] = self.forget_at
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Mark:
        token = data.get("token")
        forget_at = data.get("forget_at")
        return cls(
            kind=data.get("kind"),
            token=tuple(token) if token is not None else None,
            time=data.get("time"),
            event_id=str(data.get("id", "")),
            type=str(data.get("type", "")),
            forget_at=float(forget_at) if isinstance(forget_at, int | float) else None,
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


def scope(event: Ordered) -> str:
    """The namespace `event`'s id and ordering token belong to (see the module docstring)."""
    provider = event.provider
    if provider == "azure":
        raw = event.raw or {}
        origin = raw.get("topic") or raw.get("source")
        if isinstance(origin, str):
            found = STORAGE_ACCOUNT.search(origin)
            if found is not None:
                return f"azure@{found.group(1).lower()}"
        return provider
    region_field = AWS_REGION_FIELD.get(provider)
    if region_field is not None:
        region = (event.raw or {}).get(region_field)
        if isinstance(region, str):
            for head, partition in AWS_PARTITIONS:
                if region.startswith(head):
                    return f"{provider}@{partition}"
    return provider


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


def bounded_mark(mark: Mark | None, latest: float) -> Mark | None:
    """`mark` with a time beyond `latest` (now + the clock-skew bound) forgotten."""
    if mark is None or mark.time is None or mark.time <= latest:
        return mark
    return replace(mark, time=None)


def recorded_mark(mark: Mark, last: Mark | None, latest: float) -> Mark:
    """The mark an emitted event leaves (`mark`, its `mark_for`), except that a time beyond
    `latest` is not recorded: the key keeps the time of `last`."""
    if mark.time is not None and mark.time > latest:
        return replace(mark, time=last.time if last is not None else None)
    return mark


def with_grace(mark: Mark, now: float, grace_s: float) -> Mark:
    """The mark to record: a `deleted` one is forgotten `grace_s` after `now` (a live key's
    mark is kept: it is what makes an older copy of the live object stale)."""
    if mark.type != "deleted":
        return replace(mark, forget_at=None) if mark.forget_at is not None else mark
    return replace(mark, forget_at=now + grace_s)


def forgotten(mark: Mark | None, now: float) -> bool:
    """Whether `mark` (of a deleted key) is past its grace: it orders nothing any more, as
    if the key had never been seen. A mark without `forget_at` (a live key's, or one written
    before marks expired) is never forgotten here."""
    return (
        mark is not None
        and mark.type == "deleted"
        and mark.forget_at is not None
        and mark.forget_at <= now
    )


def staleness(event: Ordered, last: Mark | None) -> str | None:
    """Why `event` is older than the last emitted event of its key, or None if it is not.

    Both must be of one scope (`scope`): the caller keeps one mark per key and scope."""
    return stale_reason(mark_for(event), event, last)


def stale_reason(mark: Mark, event: Ordered, last: Mark | None) -> str | None:
    """`staleness` for an event whose `mark_for` is `mark` (computed once by the caller)."""
    if last is None:
        return None
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
