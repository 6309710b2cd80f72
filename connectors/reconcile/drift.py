"""The drift between a listing and what the stream knows, and the safety bound (pure).

Nothing here does I/O: the listing and the stream's knowledge come in as iterables (from the
provider modules in `connectors.reconcile.listings` and from `connectors.reconcile.stream`),
and a `Plan` comes out, which `refusal` then checks before anything is published. `compare`
streams: one pass over the listing, lookups in a `KnownSet`, each drift handed to a sink as
found; `plan` is `compare` over a dict, its drifts kept in the Plan.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from streams.config import InstanceConfig
from streams.core.event import FileEvent, format_time
from streams.core.normalizers.base import strip_quotes
from streams.core.normalizers.reconcile import SOURCE, reconcile_id
from streams.core.rules import Filtered, apply_rules
from streams.policies import instance_rules

if TYPE_CHECKING:
    from connectors.reconcile.knownset import KnownSet

DEFAULT_MAX_DELETE_SHARE = 0.10
"""A run may delete at most this share of the keys the stream knows as present."""


@dataclass(frozen=True, slots=True)
class Listed:
    """One live object of the listing, as the provider names it (full key, prefix included)."""

    key: str
    etag: str | None
    size: int | None
    last_modified: datetime | None


@dataclass(frozen=True, slots=True)
class Known:
    """What the stream last said about a key (caller-facing, prefix stripped).

    `type` is `created` (present) or `deleted`; `token` is the stream's ordering token for the
    key (the event's sequencer, when the provider has one), kept for the comparison's sources
    that carry one and for reports; `time` is the last event's time.
    """

    key: str
    type: str
    etag: str | None
    time: datetime | None
    token: str | None = None

    @property
    def present(self) -> bool:
        return self.type == "created"


@dataclass(frozen=True, slots=True)
class Drift:
    type: str
    key: str
    """The full provider key."""
    reason: str
    body: dict[str, Any]

    def value(self) -> bytes:
        return json.dumps(self.body, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass(slots=True)
class Plan:
    drifts: list[Drift] = field(default_factory=list)
    listed: int = 0
    ignored: int = 0
    """Listed keys the instance does not keep (its rules drop them)."""
    known: int = 0
    """Keys the stream knows as present."""
    in_sync: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    """Drifts found per type (`created`, `deleted`), whether kept in `drifts` or not."""

    def count(self, event_type: str) -> int:
        return self.counts.get(event_type, 0)

    @property
    def drift_count(self) -> int:
        return sum(self.counts.values())


def full_key(instance: InstanceConfig, key: str) -> str:
    return f"{instance.prefix}/{key}" if instance.prefix else key


def _body(
    instance: InstanceConfig,
    event_type: str,
    bucket: str | None,
    key: str,
    etag: str | None,
    size: int | None,
    last_modified: datetime | None,
    observed_at: datetime,
    reason: str,
) -> dict[str, Any]:
    return {
        "type": event_type,
        "bucket": bucket,
        "key": key,
        "etag": etag,
        "size": size,
        "last_modified": format_time(last_modified) if last_modified is not None else None,
        "observed_at": format_time(observed_at),
        "id": reconcile_id(event_type, bucket, key, etag, last_modified),
        "instance": instance.name,
        "reason": reason,
    }


DriftSink = Callable[[Drift], None]
"""Where `compare` puts each drift as it finds it."""


def compare(
    listed: Iterable[Listed],
    known: KnownSet,
    instance: InstanceConfig,
    bucket: str | None,
    observed_at: datetime,
    sink: DriftSink,
    on_listed: Callable[[], None] | None = None,
    on_unlisted: Callable[[], None] | None = None,
) -> Plan:
    """The drifts between a listing and what the stream knows, streamed into `sink`: the
    `created` ones in listing order, then the `deleted` ones in key order.

    One pass over the listing (a lookup per key, which marks it listed), then one over the
    known keys never listed: memory is what `known` keeps in memory (`SpilledKnown`: a
    bounded RocksDB) plus the counts; the returned Plan's `drifts` stays empty (the sink has
    them). `bucket` is None for providers without buckets (Box, Cloudinary). `on_listed` is
    called once per listed object, `on_unlisted` once per known key compared after the
    listing (progress). An exception raised by the listing stops the comparison, so a
    listing that fails part-way yields no plan at all (and nothing is published).
    """
    result = Plan(known=known.present)

    def found(drift: Drift) -> None:
        result.counts[drift.type] = result.counts.get(drift.type, 0) + 1
        sink(drift)

    rules = instance_rules(instance)  # once: applied to every listed key
    for item in listed:
        if on_listed is not None:
            on_listed()
        etag = strip_quotes(item.etag)
        probe = FileEvent(
            id="listing",
            type="created",
            key=item.key,
            bucket=bucket,
            size=item.size,
            etag=etag,
            provider=SOURCE,
        )
        view = apply_rules(probe, rules)
        if isinstance(view, Filtered):
            result.ignored += 1
            continue
        result.listed += 1
        last = known.lookup(view.key)
        if last is None:
            reason = "not-in-stream"
        elif not last.present:
            reason = "deleted-in-stream"
        elif view.etag and last.etag and view.etag != last.etag:
            reason = "etag-differs"
        else:
            result.in_sync += 1
            continue
        body = _body(
            instance,
            "created",
            bucket,
            item.key,
            etag,
            item.size,
            item.last_modified,
            observed_at,
            reason,
        )
        found(Drift("created", item.key, reason, body))
    for last in known.unlisted():
        if on_unlisted is not None:
            on_unlisted()
        provider_key = full_key(instance, last.key)
        body = _body(
            instance,
            "deleted",
            bucket,
            provider_key,
            last.etag,
            None,
            last.time,
            observed_at,
            "not-listed",
        )
        found(Drift("deleted", provider_key, "not-listed", body))
    return result


def plan(
    listed: Iterable[Listed],
    known: Mapping[str, Known],
    instance: InstanceConfig,
    bucket: str | None,
    observed_at: datetime,
    on_listed: Callable[[], None] | None = None,
) -> Plan:
    """`compare` with the known set in memory (a dict: key -> the stream's last word) and the
    drifts kept in the returned Plan: for small sets and the tests."""
    from connectors.reconcile.knownset import MemoryKnown

    drifts: list[Drift] = []
    result = compare(
        listed, MemoryKnown(known), instance, bucket, observed_at, drifts.append, on_listed
    )
    result.drifts = drifts
    return result


def refusal(
    result: Plan,
    max_delete_share: float = DEFAULT_MAX_DELETE_SHARE,
    max_deletes: int | None = None,
    force: bool = False,
) -> str | None:
    """Why this plan must not be published, or None.

    A listing that comes back empty or cut short (wrong credentials, prefix or bucket, an
    eventually consistent endpoint) looks exactly like a mass deletion, and its `deleted`
    events would make every consumer drop its copies. So a run refuses when it would delete
    anything from an empty listing, or more than `max_delete_share` of the keys the stream
    knows as present; `max_deletes` replaces that share by an absolute number the operator
    names (for a deletion they expect), and `force` lifts the bound.
    """
    deletes = result.count("deleted")
    if force or deletes == 0:
        return None
    if max_deletes is not None:
        if deletes <= max_deletes:
            return None
        return (
            f"it would publish {deletes} deletes, more than --max-deletes {max_deletes}; "
            "check the listing, then raise --max-deletes or pass --force"
        )
    if result.listed == 0:
        return (
            f"the listing holds no key the instance keeps, so it would delete all {deletes} "
            "keys the stream knows; check the bucket, prefix and credentials, then pass "
            f"--max-deletes {deletes} or --force if the bucket really is empty"
        )
    share = deletes / result.known if result.known else 1.0
    if share > max_delete_share:
        return (
            f"it would delete {deletes} of the {result.known} keys the stream knows "
            f"({share:.0%}, above the {max_delete_share:.0%} bound); check the listing, then "
            f"pass --max-deletes {deletes} or --force"
        )
    return None
