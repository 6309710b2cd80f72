"""Stage one's runner: a batch of raw deliveries normalized, routed and written, keyed by
object, to the repartition topic (dead letters for what cannot be parsed).

At least once: the stage's loop commits the input offsets after Kafka acknowledged every
record of the batch (a repeat is a duplicate the emit stage drops).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

from streams import metrics
from streams.config import Settings
from streams.core.normalizers import SOURCES
from streams.core.records import OutRecord, RawRecord, dead_letter_record, header_text, headers_dict
from streams.core.routing import route
from streams.engine.batches import Batch
from streams.engine.librdkafka.producer import RdRecordSender
from streams.engine.outcomes import DeadLetters

log = logging.getLogger(__name__)

KNOWN_SOURCES = frozenset(SOURCES)
UNKNOWN_SOURCE = "unknown"
"""The `source` label of deliveries whose source is no normalizer's: a header's value never
becomes a metric label (a hostile one would make a series per value)."""


def source_label(source: str | None) -> str:
    """The metric label of a delivery's source: one of a fixed set."""
    return source if source in KNOWN_SOURCES else UNKNOWN_SOURCE


class NormalizeStage:
    """Normalize and repartition batches of raw deliveries."""

    def __init__(self, settings: Settings, sender: RdRecordSender) -> None:
        self.settings = settings
        self.sender = sender
        self.dead_letter_topic = settings.stream.dead_letter_topic

    async def handle(self, batch: Batch) -> None:
        """Normalize and repartition one batch of raw deliveries."""
        settings = self.settings
        records: list[OutRecord] = []
        origins: dict[int, tuple[RawRecord, bytes | None]] = {}
        received: Counter[str] = Counter()
        normalized: Counter[str] = Counter()
        filtered: Counter[tuple[str, str]] = Counter()
        for tp, messages in batch.items():
            default_source = settings.stream.default_source(tp.topic)
            for message in messages:
                raw = RawRecord(tp.topic, message.value or b"", headers_dict(message.headers))
                routed = route(raw, message.key, settings)
                source = source_label(header_text(raw.headers, "source") or default_source)
                received[source] += 1
                normalized[source] += routed.events
                filtered.update(routed.filtered)
                if routed.dead_letter_reason is not None:
                    metrics.DEAD_LETTERED.labels("normalize").inc()
                    log.warning(
                        "dead-lettered a delivery from %s[%d]@%d: %.500s",
                        tp.topic,
                        tp.partition,
                        message.offset,
                        routed.dead_letter_reason,
                    )
                else:
                    for record in routed.records:
                        origins[id(record)] = (raw, message.key)
                records.extend(routed.records)
        for source, count in received.items():
            metrics.RECEIVED.labels(source).inc(count)
            metrics.NORMALIZED.labels(source).inc(normalized[source])
        for (instance, reason), count in filtered.items():
            metrics.FILTERED.labels(instance, reason).inc(count)
        dead_letter = _dead_letter_once(origins, self.dead_letter_topic)
        sent = await self.sender.send_all(records, "normalize", dead_letter)
        lettered = sum(refused.replacement is not None for refused in sent.refused)
        metrics.DEAD_LETTERED.labels("normalize").inc(lettered)


def _dead_letter_once(
    origins: dict[int, tuple[RawRecord, bytes | None]], dead_letter_topic: str
) -> Callable[[OutRecord, str], OutRecord | None]:
    """The replacement of a keyed record Kafka refused: a dead letter of the delivery it came
    from, once per delivery (its other records may have been written: a replay after the fix
    gives duplicates, which the emit stage drops)."""
    lettered: set[int] = set()

    def replace(record: OutRecord, reason: str) -> OutRecord | None:
        origin = origins.get(id(record))
        if origin is None:
            return DeadLetters(dead_letter_topic, "normalize")(record, reason)
        raw, key = origin
        if id(raw) in lettered:
            return None
        lettered.add(id(raw))
        return dead_letter_record(dead_letter_topic, raw, key, reason, "normalize")

    return replace
