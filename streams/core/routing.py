"""Stage one, pure: a raw delivery becomes keyed records for each instance that keeps them.

Everything that cannot be parsed becomes one dead-letter record (original bytes, headers and
the reason); every event an instance does not keep is counted by reason. So does a delivery
with an event too large for the topics it would go through (its `raw` record, which the
event carries whole, makes it so): `event_record_bytes` over `EVENT_MAX_MESSAGE_BYTES`. It is
never truncated, and never written to fail there.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

from streams.config import Settings
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
    delivery = delivery_from_raw(record, settings.stream.default_source(record.topic))
    routed = Routed()
    reason: str | None = None
    try:
        if not delivery.source:
            raise MalformedDelivery("no `source` header and the topic has no default source")
        events = normalize(delivery)
    except MalformedDelivery as malformed:
        reason = f"{delivery.source or '?'}: {malformed}"
    except Exception as bug:  # a normalizer bug must not stop the stream on one delivery
        log.exception("normalizer %s failed on a delivery", delivery.source)
        reason = f"{delivery.source}: internal error {type(bug).__name__}: {bug}"
    if reason is None:
        try:
            _fan_out(routed, events, record.headers.get("received-at"), settings)
        except TooLarge as too_large:
            routed = Routed()
            reason = f"{delivery.source}: {too_large}"
        except ValueError as unserialisable:  # pydantic cannot serialise it (`raw` too deep)
            routed = Routed()
            reason = f"{delivery.source}: cannot serialise its event: {unserialisable}"
    if reason is not None:
        routed.dead_letter_reason = reason
        routed.records.append(
            dead_letter_record(settings.stream.dead_letter_topic, record, key, reason, "normalize")
        )
    return routed


class TooLarge(Exception):
    """An event whose records would exceed the limit of the topics they go to."""


def _fan_out(
    routed: Routed, events: list[FileEvent], received_at: bytes | None, settings: Settings
) -> None:
    routed.events = len(events)
    for event in events:
        for instance in settings.instances:
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
