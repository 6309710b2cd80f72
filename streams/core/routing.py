"""Stage one, pure: a raw delivery becomes keyed records for each instance that keeps them.

Everything that cannot be parsed becomes one dead-letter record (original bytes, headers and
the reason); every event an instance does not keep is counted by reason. So does a delivery
with an event too large for the topics it would go through (its `raw` record, which the
event carries whole, makes it so): `event_record_bytes` over `EVENT_MAX_MESSAGE_BYTES`. It is
never truncated, and never written to fail there.

What a raw topic lets its writers claim (streams.config.RawTopicConfig) is checked here, as
a bound on every credential that may write the topic:

* its sources: a record whose `source` header names a source the topic does not carry (on
  a topic with `default_source`, any other source) is dead-lettered, never normalized as the
  source it claims;
* its instances: its deliveries reach only those (the others count `filtered{reason="topic"}`);
* a `reconcile` delivery reaches exactly the one instance its body names (`instance`, which
  `connectors reconcile` writes; on a topic of one instance, that one when absent), which must
  be configured and reached by the topic: else dead-lettered. The other instances count
  `filtered{reason="instance"}`;
* the events of one delivery: at most what its provider sends in one
  (`StreamConfig.events_bound`), else the whole delivery is dead-lettered, nothing of it
  published.

The dead-letter reason quotes input (the `source` header, fields of the body, a normalizer's
message about them), and the normalize stage logs it: it is made one printable line where it
is built (streams.logs `printable`: a line break is `\\n`), in the log and in the dead
letter's `error` header alike, so that a header such as `s3\\n[2026-12-07 ...] [CRITICAL] ...`
cannot forge a line of the worker's log (issue 31).
"""

from __future__ import annotations

import logging
import traceback
from collections import Counter
from dataclasses import dataclass, field

from streams.config import RawTopicConfig, Settings
from streams.core.event import FileEvent
from streams.core.normalizers import MalformedDelivery, normalize
from streams.core.records import (
    OutRecord,
    RawRecord,
    dead_letter_record,
    delivery_from_raw,
    event_record_bytes,
    keyed_record,
)
from streams.core.rules import Filtered, apply_instance
from streams.engine.topics import EVENT_MAX_MESSAGE_BYTES
from streams.logs import printable

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Routed:
    """What one raw record turned into."""

    records: list[OutRecord] = field(default_factory=list)
    events: int = 0
    filtered: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(instance, reason) -> count"""
    dead_letter_reason: str | None = None


def route(record: RawRecord, key: bytes | None, settings: Settings) -> Routed:
    """Normalize one raw record and fan it out to the instances that keep its events."""
    topic = settings.stream.raw_topic(record.topic)
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
        bound = settings.stream.events_bound(delivery.source)
        if len(events) > bound:
            raise MalformedDelivery(
                f"{len(events):,} events in one delivery, over the {bound:,} one {delivery.source} "
                f"delivery holds at most (stream.max_events_per_delivery.{delivery.source})"
            )
        if delivery.source == "reconcile" and events:
            only = reconcile_instance(events[0], topic, settings)
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
            _fan_out(routed, events, record.headers.get("received-at"), settings, topic, only)
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
            dead_letter_record(settings.stream.dead_letter_topic, record, key, reason, "normalize")
        )
    return routed


def reconcile_instance(event: FileEvent, topic: RawTopicConfig | None, settings: Settings) -> str:
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
    configured = [instance.name for instance in settings.instances]
    if named not in configured:
        raise MalformedDelivery(f"instance {named[:200]!r} is not configured")
    if topic is not None and not topic.reaches(named):
        raise MalformedDelivery(
            f"raw topic {topic.name} reaches {', '.join(topic.instances or ())} only, "
            f"not instance {named!r}"
        )
    return named


class TooLarge(Exception):
    """An event whose records would exceed the limit of the topics they go to."""


def _fan_out(
    routed: Routed,
    events: list[FileEvent],
    received_at: bytes | None,
    settings: Settings,
    topic: RawTopicConfig | None,
    only: str | None,
) -> None:
    routed.events = len(events)
    for event in events:
        for instance in settings.instances:
            if topic is not None and not topic.reaches(instance.name):
                routed.filtered[(instance.name, "topic")] += 1
                continue
            if only is not None and instance.name != only:
                routed.filtered[(instance.name, "instance")] += 1
                continue
            kept = apply_instance(event, instance)
            if isinstance(kept, Filtered):
                routed.filtered[(instance.name, kept.reason)] += 1
            else:
                keyed = keyed_record(
                    settings.stream.repartition_topic, instance.name, kept, received_at
                )
                size = event_record_bytes(instance.name, kept, keyed)
                if size > EVENT_MAX_MESSAGE_BYTES:
                    raise TooLarge(
                        f"event {kept.id[:200]} for instance {instance.name} makes a record of "
                        f"{size:,} bytes, over the {EVENT_MAX_MESSAGE_BYTES:,}-byte limit "
                        "(max.message.bytes) of the repartition, output and stale topics"
                    )
                routed.records.append(keyed)
