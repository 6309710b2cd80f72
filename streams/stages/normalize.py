"""Stage one's runner: a batch of raw deliveries normalized, routed and written, keyed by
object, to the repartition topic (dead letters for what cannot be parsed).

At least once: a batch's input offsets are committed after Kafka acknowledged every record
of it and of every batch before it (a repeat is a duplicate the emit stage drops). Never idle
on Kafka: while up to MAX_BATCHES_IN_FLIGHT batches wait for their acknowledgements and
commits, the next one is fetched, normalized and queued.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from streams import metrics
from streams.config import RawTopicConfig, Settings
from streams.core.normalizers import HEADERS_READ, SOURCES
from streams.core.records import (
    HEADER_PREFIX,
    RAW_MAX_MESSAGE_BYTES,
    OutRecord,
    RawRecord,
    dead_letter_record,
    header_text,
    headers_dict,
    repeated_headers,
)
from streams.core.routing import InstanceIndex, RawTopicPolicy, Routed, RoutePolicy, route
from streams.engine.batches import Batch
from streams.engine.librdkafka.consumer import Unreadable, headers_unreadable
from streams.engine.librdkafka.producer import RdRecordSender
from streams.engine.outcomes import DeadLetters
from streams.logs import printable
from streams.policies import instance_rules
from streams.progress import Stopping

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


def raw_topic_policy(topic: RawTopicConfig) -> RawTopicPolicy:
    """What routing checks of a raw topic's records (streams.core.routing)."""
    return RawTopicPolicy(
        name=topic.name,
        default_source=topic.default_source,
        carried_sources=topic.carried_sources,
        instances=topic.instances,
    )


def build_route_policy(settings: Settings) -> RoutePolicy:
    """Stage one's policy of `settings` (use `route_policy`, which builds it once)."""
    raw_topics = [raw_topic_policy(topic) for topic in settings.stream.raw_topics]
    return RoutePolicy(
        repartition_topic=settings.stream.repartition_topic,
        dead_letter_topic=settings.stream.dead_letter_topic,
        raw_topics={topic.name: topic for topic in raw_topics},
        events_bounds={source: settings.stream.events_bound(source) for source in SOURCES},
        index=InstanceIndex([instance_rules(i) for i in settings.instances], raw_topics),
    )


def route_policy(settings: Settings) -> RoutePolicy:
    """The RoutePolicy of `settings`, built on first use and kept on them (Settings.derived):
    what streams.core.routing takes instead of the settings."""
    return settings.derived(build_route_policy)


MAX_BATCHES_IN_FLIGHT = 2
"""Batches written but not yet acknowledged and committed, while the next is normalized."""


class NormalizeStage:
    """Normalize and repartition batches of raw deliveries."""

    def __init__(
        self,
        settings: Settings,
        sender: RdRecordSender,
        commit: Callable[[Batch], Awaitable[None]],
        stop_on_failure: Callable[[str, BaseException], Awaitable[None]],
    ) -> None:
        self.settings = settings
        self.sender = sender
        self.commit = commit
        """Commits a batch's input offsets (the stage's group member)."""
        self.stop_on_failure = stop_on_failure
        """Called when a batch's write fails outside the stage's loop (nobody awaits it)."""
        self.dead_letter_topic = settings.stream.dead_letter_topic
        self._in_flight: deque[asyncio.Future[None]] = deque()
        """The batches written and not yet committed, oldest first."""

    async def handle(self, batch: Batch) -> None:
        """Normalize one batch and start its write; its offsets are committed once it and
        every batch before it are acknowledged (`_write`). Normalizes first, then waits
        only while MAX_BATCHES_IN_FLIGHT are in flight: the batches before are acknowledged
        meanwhile (the stage's producer knows a batch is stored once it holds no record,
        streams.engine.librdkafka.producer.QuietRounds)."""
        while self._in_flight and self._in_flight[0].done():
            self._in_flight.popleft().result()  # a failure raises here (the stage stops)
        records, origins = self._route(batch)
        while len(self._in_flight) >= MAX_BATCHES_IN_FLIGHT:
            await self._in_flight[0]
            self._in_flight.popleft()
        previous = self._in_flight[-1] if self._in_flight else None
        self._in_flight.append(
            asyncio.ensure_future(self._write(batch, records, origins, previous))
        )

    async def drain(self) -> None:
        """Wait until every batch in flight is acknowledged and committed (before partitions
        move, and on stop); raise the first that failed."""
        while self._in_flight:
            future = self._in_flight[0]
            try:
                await asyncio.shield(future)
            finally:
                if future.done():
                    self._in_flight.popleft()

    def abort(self) -> None:
        """Cancel the writes in flight: their offsets stay uncommitted (read again)."""
        for future in self._in_flight:
            future.cancel()
        self._in_flight.clear()

    async def _write(
        self,
        batch: Batch,
        records: list[OutRecord],
        origins: dict[int, tuple[RawRecord, bytes | None]],
        previous: asyncio.Future[None] | None,
    ) -> None:
        try:
            dead_letter = _dead_letter_once(origins, self.dead_letter_topic)
            sent = await self.sender.send_all(records, "normalize", dead_letter)
            lettered = sum(refused.replacement is not None for refused in sent.refused)
            metrics.DEAD_LETTERED.labels("normalize").inc(lettered)
            if previous is not None:
                await previous  # offsets in order: its failure is this batch's too
            await self.commit(batch)
        except (asyncio.CancelledError, Stopping):
            raise
        except Exception as exc:
            await self.stop_on_failure("normalize", exc)
            raise

    def _route(
        self, batch: Batch
    ) -> tuple[list[OutRecord], dict[int, tuple[RawRecord, bytes | None]]]:
        """Normalize and route every delivery of `batch` (counted in the metrics): the keyed
        and dead-letter records, and the delivery each keyed record came from."""
        settings = self.settings
        policy = route_policy(settings)
        records: list[OutRecord] = []
        origins: dict[int, tuple[RawRecord, bytes | None]] = {}
        received: Counter[str] = Counter()
        normalized: Counter[str] = Counter()
        filtered: Counter[tuple[str, str]] = Counter()
        for tp, messages in batch.items():
            default_source = settings.stream.default_source(tp.topic)
            for message in messages:
                if isinstance(message, Unreadable):
                    records.append(self._unreadable(message, message.describe()))
                    continue
                try:
                    header_list = message.headers() or []
                except Exception as exc:  # SystemError: a header name that is not UTF-8
                    records.append(self._unreadable(message, headers_unreadable(message, exc)))
                    continue
                key = message.key()
                raw = RawRecord(tp.topic, message.value() or b"", headers_dict(header_list))
                if len(raw.value) > RAW_MAX_MESSAGE_BYTES:
                    routed = self._oversized(raw, key)
                elif len(raw.headers) < len(header_list):
                    routed = self._repeated(raw, key, header_list) or route(raw, key, policy)
                else:
                    routed = route(raw, key, policy)
                source = source_label(header_text(raw.headers, "source") or default_source)
                received[source] += 1
                normalized[source] += routed.events
                if routed.filtered:
                    filtered.update(routed.filtered)
                if routed.dead_letter_reason is not None:
                    metrics.DEAD_LETTERED.labels("normalize").inc()
                    log.warning(
                        "dead-lettered a delivery from %s[%d]@%d: %.500s",
                        tp.topic,
                        tp.partition,
                        message.offset(),
                        printable(routed.dead_letter_reason),  # some reasons are built here
                    )
                else:
                    for record in routed.records:
                        origins[id(record)] = (raw, key)
                records.extend(routed.records)
        for source, count in received.items():
            metrics.RECEIVED.labels(source).inc(count)
            metrics.NORMALIZED.labels(source).inc(normalized[source])
        for (instance, reason), count in filtered.items():
            metrics.FILTERED.labels(instance, reason).inc(count)
        return records, origins

    def _unreadable(self, message: Any, reason: str) -> OutRecord:
        """The dead letter of a raw record whose headers, or whole self, cannot be read: its
        key and value when there are any (an Unreadable has neither), and the reason, which
        names where it is."""
        metrics.DEAD_LETTERED.labels("normalize").inc()
        metrics.UNREADABLE.labels("normalize").inc()
        log.warning("dead-lettered an unreadable record: %.500s", printable(reason))
        raw = RawRecord(message.topic() or "", message.value() or b"")
        letter = dead_letter_record(self.dead_letter_topic, raw, message.key(), reason, "normalize")
        if isinstance(message, Unreadable):
            letter.value = None
        return letter

    def _oversized(self, raw: RawRecord, key: bytes | None) -> Routed:
        """A dead letter for a value larger than any raw record may be (a compressed record
        batch inflates to it): not parsed. A bridge never publishes one."""
        reason = (
            f"a value of {len(raw.value):,} bytes is over the raw topics' limit of "
            f"{RAW_MAX_MESSAGE_BYTES:,} bytes (max.message.bytes): not parsed"
        )
        letter = dead_letter_record(self.dead_letter_topic, raw, key, reason, "normalize")
        return Routed(records=[letter], dead_letter_reason=reason)

    def _repeated(
        self, raw: RawRecord, key: bytes | None, headers: Sequence[tuple[str, bytes | None]]
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
