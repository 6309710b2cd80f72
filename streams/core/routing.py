"""Stage one, pure: a raw delivery becomes keyed records for each instance that keeps them.

Everything that cannot be parsed becomes one dead-letter record (original bytes, headers and
the reason). So does a delivery
with an event too large for the topics it would go through (its `raw` record, which the
event carries whole, makes it so): `event_record_bytes` over `EVENT_MAX_MESSAGE_BYTES`. It is
never truncated, and never written to fail there.

Routing reads no settings: it takes a `RoutePolicy`, small frozen values built once per
Settings by the shell (streams.stages.normalize `route_policy`).

What a raw topic lets its writers claim (`RawTopicPolicy`, from streams.config.RawTopicConfig)
is checked here, as a bound on every credential that may write the topic:

* its sources: a record whose `source` header names a source the topic does not carry (on
  a topic with `default_source`, any other source) is dead-lettered, never normalized as the
  source it claims;
* its instances: its deliveries reach only those (the other candidates count
  `filtered{reason="topic"}`);
* a `reconcile` delivery reaches exactly the one instance its body names (`instance`, which
  `connectors reconcile` writes; on a topic of one instance, that one when absent), which must
  be configured and reached by the topic: else dead-lettered. The other candidates count
  `filtered{reason="instance"}`;
* the events of one delivery: at most what its provider sends in one
  (`RoutePolicy.events_bounds`: `stream.max_events_per_delivery`, else the provider's), else
  the whole delivery is dead-lettered, nothing of it published.

An event visits only the instances that could keep it, its candidates: those whose bucket
is the event's (or every bucket: no bucket, `"*"`; or the delivery names none) and whose
prefix holds its key on a path boundary (or that have none). `InstanceIndex` finds them
with a map per bucket and a map of prefixes each (one look-up per `/` of the key up to the
longest prefix), built once per policy, so that routing costs the same
with 10,000 instances as with one; they are tried in configuration order, the order of the
keyed records. Each candidate applies its rules (streams.core.rules) in full, so what is kept
is exactly what trying every instance kept (tests/fuzz/test_routing_index.py holds the two
to each other).

`Routed.filtered` counts, per candidate that does not keep an event, why: `topic`,
`instance`, `source`, `prefix-escape` or `plugin:<name>` (an instance whose bucket or prefix
does not hold the event was never a candidate, and counts nothing); and an event that no
instance's bucket and prefix hold once, under instance `*` and reason `no-instance`
(`NO_INSTANCE`). So a tenant's `filtered` series say what was addressed to it and refused,
and grow with what it is sent, not with the number of tenants.

The dead-letter reason quotes input (the `source` header, fields of the body, a normalizer's
message about them), and the normalize stage logs it: it is made one printable line where it
is built (streams.logs `printable`: a line break is `\\n`), in the log and in the dead
letter's `error` header alike, so that a header such as `s3\\n[2026-12-07 ...] [CRITICAL] ...`
cannot forge a line of the worker's log (issue 31).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from streams.core.event import FileEvent
from streams.core.normalizers import MalformedDelivery, normalize
from streams.core.records import (
    EVENT_MAX_MESSAGE_BYTES,
    OutRecord,
    RawRecord,
    dead_letter_record,
    delivery_from_raw,
    event_record_bytes,
    keyed_record,
)
from streams.core.rules import Filtered, InstanceRules, apply_rules
from streams.logs import printable

log = logging.getLogger(__name__)


NO_INSTANCE = ("*", "no-instance")
"""The `Routed.filtered` entry of an event no instance's bucket and prefix hold."""


@dataclass(frozen=True, slots=True)
class RawTopicPolicy:
    """What a raw topic's records may claim (streams.config.RawTopicConfig)."""

    name: str
    default_source: str | None
    """The source of its records that carry no `source` header."""
    carried_sources: tuple[str, ...] | None
    """The sources its records may claim; None: every source."""
    instances: tuple[str, ...] | None
    """The instances its deliveries may reach; None: every instance."""

    def carries(self, source: str) -> bool:
        carried = self.carried_sources
        return carried is None or source in carried


@dataclass(frozen=True, slots=True)
class RoutePolicy:
    """Everything stage one's routing reads of the settings, built once per Settings
    (streams.stages.normalize `route_policy`)."""

    repartition_topic: str
    dead_letter_topic: str
    raw_topics: Mapping[str, RawTopicPolicy]
    """By name: the configured raw topics (a record of another topic claims what it will)."""
    events_bounds: Mapping[str, int]
    """Per source: the most events one delivery may hold (module docstring)."""
    index: InstanceIndex
    """The instances, in configuration order, by what selects them."""


@dataclass(slots=True, init=False)
class Routed:
    """What one raw record turned into. Built per delivery, so its `__init__` is written out
    (a dataclass's generated one runs interpreted even in the compiled core) and `filtered` is
    a plain dict: with a `Counter()` this object was ~5% of stage one's handling."""

    records: list[OutRecord]
    events: int
    filtered: dict[tuple[str, str], int]
    """(instance, reason) -> count, for the candidates that did not keep an event; NO_INSTANCE
    for an event that had none (module docstring)"""
    dead_letter_reason: str | None

    def __init__(
        self, records: list[OutRecord] | None = None, dead_letter_reason: str | None = None
    ) -> None:
        self.records = [] if records is None else records
        self.events = 0
        self.filtered = {}
        self.dead_letter_reason = dead_letter_reason


def route(record: RawRecord, key: bytes | None, policy: RoutePolicy) -> Routed:
    """Normalize one raw record and fan it out to the instances that keep its events."""
    topic = policy.raw_topics.get(record.topic)
    delivery = delivery_from_raw(record, topic.default_source if topic is not None else None)
    routed = Routed()
    reason: str | None = None
    only: str | None = None
    try:
        if not delivery.source:
            raise MalformedDelivery("no `source` header and the topic has no default source")
        if topic is not None and not topic.carries(delivery.source):
            raise MalformedDelivery(
                f"raw topic {topic.name} carries {', '.join(topic.carried_sources or ())} "
                f"only: a record on it cannot claim source {delivery.source[:64]!r}"
            )
        events = normalize(delivery)
        bound = policy.events_bounds[delivery.source]
        if len(events) > bound:
            raise MalformedDelivery(
                f"{len(events):,} events in one delivery, over the {bound:,} one {delivery.source} "
                f"delivery holds at most (stream.max_events_per_delivery.{delivery.source})"
            )
        if delivery.source == "reconcile" and events:
            only = reconcile_instance(events[0], topic, policy)
    except MalformedDelivery as malformed:
        reason = f"{delivery.source[:64] or '?'}: {malformed}"
    except Exception as bug:  # a normalizer bug must not stop the stream on one delivery
        reason = f"{delivery.source[:64]}: internal error {type(bug).__name__}: {bug}"
        # The frames are the product's code; the message may quote the delivery: escaped.
        log.error(
            "normalizer %r failed on a delivery: %s\nTraceback (most recent call last):\n%s",
            delivery.source[:64],
            printable(reason),
            "".join(traceback.format_tb(bug.__traceback__)).rstrip(),
        )
    if reason is None:
        try:
            _fan_out(routed, events, record.headers.get("received-at"), policy, topic, only)
        except TooLarge as too_large:
            routed = Routed()
            reason = f"{delivery.source}: {too_large}"
        except ValueError as unserialisable:  # pydantic cannot serialise it (`raw` too deep)
            routed = Routed()
            reason = f"{delivery.source}: cannot serialise its event: {unserialisable}"
    if reason is not None:
        reason = printable(reason)  # one line, in the log and in the `error` header
        routed.dead_letter_reason = reason
        routed.records.append(
            dead_letter_record(policy.dead_letter_topic, record, key, reason, "normalize")
        )
    return routed


def reconcile_instance(event: FileEvent, topic: RawTopicPolicy | None, policy: RoutePolicy) -> str:
    """The one instance a reconcile event is for: the one its delivery names, else the one
    its topic reaches; MalformedDelivery when that is none, unknown, or not the topic's."""
    named = event.raw.get("instance") if isinstance(event.raw, dict) else None
    if named is not None and not isinstance(named, str):
        raise MalformedDelivery("instance is not a string")
    pinned = topic.instances if topic is not None else None
    if named is None:
        if pinned is None or len(pinned) != 1:
            raise MalformedDelivery(
                "a reconcile delivery names no instance (and its topic reaches more than one)"
            )
        named = pinned[0]
    index = policy.index
    if named not in index.positions:
        raise MalformedDelivery(f"instance {named[:200]!r} is not configured")
    if topic is not None and not index.reaches(topic, named):
        raise MalformedDelivery(
            f"raw topic {topic.name} reaches {', '.join(topic.instances or ())} only, "
            f"not instance {named!r}"
        )
    return named


class TooLarge(Exception):
    """An event whose records would exceed the limit of the topics they go to."""


class _Place:
    """The instances of one bucket (or of every bucket), by prefix: positions in the
    configuration."""

    def __init__(self) -> None:
        self.whole: list[int] = []
        """Those without a prefix: every key."""
        self.prefixes: dict[str, list[int]] = {}
        self.longest = 0
        """The length of the longest prefix: where the look-ups in a key stop."""

    def add(self, position: int, prefix: str) -> None:
        if not prefix:
            self.whole.append(position)
            return
        self.prefixes.setdefault(prefix, []).append(position)
        self.longest = max(self.longest, len(prefix))

    def collect(self, key: str, into: list[int]) -> None:
        """Add the instances whose prefix holds `key` (rules.under_prefix: `key` is
        `<prefix>/<something>`): one look-up per `/` of the key, up to the longest prefix."""
        into.extend(self.whole)
        if not self.prefixes:
            return
        # A `/` at i ends the prefix key[:i] (never empty) and leaves key[i + 1:], which must
        # not be empty: 1 <= i <= len(key) - 2, and no further than the longest prefix.
        limit = min(self.longest, len(key) - 2) + 1
        slash = key.find("/", 1, limit)
        while slash >= 0:
            found = self.prefixes.get(key[:slash])
            if found is not None:
                into.extend(found)
            slash = key.find("/", slash + 1, limit)


class InstanceIndex:
    """The instances of one configuration by what selects them (built once per
    `RoutePolicy`)."""

    def __init__(
        self, instances: Sequence[InstanceRules], raw_topics: Sequence[RawTopicPolicy]
    ) -> None:
        self.instances: tuple[InstanceRules, ...] = tuple(instances)
        self.positions: dict[str, int] = {}
        """Each instance's place in the configuration, by name."""
        self.buckets: dict[str, _Place] = {}
        """The instances of each bucket named in the configuration."""
        self.every_bucket = _Place()
        """The instances without a bucket (none, or `"*"`)."""
        self.anywhere = _Place()
        """Every instance: for a delivery that names no bucket, which passes every bucket."""
        self.reach: dict[str, frozenset[str]] = {
            topic.name: frozenset(topic.instances)
            for topic in raw_topics
            if topic.instances is not None
        }
        """The instances each raw topic that pins some reaches."""
        for position, instance in enumerate(self.instances):
            self.positions[instance.name] = position
            self.anywhere.add(position, instance.prefix)
            if instance.bucket is None:
                self.every_bucket.add(position, instance.prefix)
            else:
                place = self.buckets.get(instance.bucket)
                if place is None:
                    place = self.buckets[instance.bucket] = _Place()
                place.add(position, instance.prefix)

    def candidates(self, bucket: str | None, key: str) -> list[int]:
        """The positions, in configuration order, of the instances whose bucket and prefix
        hold an event of `bucket` and `key` (rules.apply_rules' `bucket` and `prefix`)."""
        found: list[int] = []
        if bucket is None:
            self.anywhere.collect(key, found)
        else:
            self.every_bucket.collect(key, found)
            place = self.buckets.get(bucket)
            if place is not None:
                place.collect(key, found)
        if len(found) > 1:
            found.sort()
        return found

    def reaches(self, topic: RawTopicPolicy, name: str) -> bool:
        """Whether `topic`'s deliveries may reach instance `name`, by a set."""
        pinned = self.reach.get(topic.name)
        return pinned is None or name in pinned


def _fan_out(
    routed: Routed,
    events: list[FileEvent],
    received_at: bytes | None,
    policy: RoutePolicy,
    topic: RawTopicPolicy | None,
    only: str | None,
) -> None:
    routed.events = len(events)
    index = policy.index
    instances = index.instances
    pinned = index.reach.get(topic.name) if topic is not None else None
    for event in events:
        candidates = index.candidates(event.bucket, event.key)
        if not candidates:
            _count(routed.filtered, NO_INSTANCE)
            continue
        for position in candidates:
            instance = instances[position]
            if pinned is not None and instance.name not in pinned:
                _count(routed.filtered, (instance.name, "topic"))
                continue
            if only is not None and instance.name != only:
                _count(routed.filtered, (instance.name, "instance"))
                continue
            kept = apply_rules(event, instance)
            if isinstance(kept, Filtered):
                _count(routed.filtered, (instance.name, kept.reason))
            else:
                keyed = keyed_record(policy.repartition_topic, instance.name, kept, received_at)
                size = event_record_bytes(instance.name, kept, keyed)
                if size > EVENT_MAX_MESSAGE_BYTES:
                    raise TooLarge(
                        f"event {kept.id[:200]} for instance {instance.name} makes a record of "
                        f"{size:,} bytes, over the {EVENT_MAX_MESSAGE_BYTES:,}-byte limit "
                        "(max.message.bytes) of the repartition, output and stale topics"
                    )
                routed.records.append(keyed)


def _count(filtered: dict[tuple[str, str], int], reason: tuple[str, str]) -> None:
    filtered[reason] = filtered.get(reason, 0) + 1
