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
from streams.core.normalizers import HEADERS_READ, SOURCES
from streams.core.records import (
    HEADER_PREFIX,
    OutRecord,
    RawRecord,
    dead_letter_record,
    header_text,
    headers_dict,
    repeated_headers,
)
from streams.core.routing import Routed, route
from streams.engine.batches import Batch
from streams.engine.librdkafka.producer import RdRecordSender
from streams.engine.outcomes import DeadLetters

log = logging.getLogger(__name__)

KNOWN_SOURCES = frozenset(SOURCES)
DECISIVE_HEADERS = frozenset(
    {"source", *(f"{HEADER_PREFIX}{name}" for names in HEADERS_READ.values() for name in names)}
)
"""The raw record's headers a decision reads: each must come once (a repeated one is two
readings of one delivery)."""
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
                header_list = message.headers or []
                raw = RawRecord(tp.topic, message.value or b"", headers_dict(header_list))
                if len(raw.headers) < len(header_list):
                    routed = self._repeated(raw, message.key, header_list) or route(
                        raw, message.key, settings
                    )
                else:
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

    def _repeated(
        self, raw: RawRecord, key: bytes | None, headers: list[tuple[str, bytes | None]]
    ) -> Routed | None:
        """A dead letter for a record that repeats a header a decision reads; else None."""
        repeated = repeated_headers(headers, DECISIVE_HEADERS)
        if not repeated:
            return None
        reason = f"repeated header(s) {', '.join(repeated)}: a decision reads exactly one"
        letter = dead_letter_record(self.dead_letter_topic, raw, key, reason, "normalize")
        added = tuple(header for header in letter.headers if header[0].startswith("error"))
        letter.headers = (*((name, value or b"") for name, value in headers), *added)
        return Routed(records=[letter], dead_letter_reason=reason)


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
