"""What a producer's `send_all` reports: where Kafka stored each partition's
records (Acknowledged), what it refused for what the records are (Refused), and what replaces
a refused record by default (DeadLetters: a dead letter of it, then one without its value)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from streams.core.records import OutRecord, RawRecord, dead_letter_record
from streams.kafka_settings import KafkaSettings
from streams.progress import Progress

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 5.0
MAX_BATCH_BYTES = 1024 * 1024

VALUE_DROPPED_HEADER = "error.value-dropped"
"""On a dead letter whose own write was refused: the size of the value it no longer carries."""

Replace = Callable[[OutRecord, str], OutRecord | None]
"""What to write instead of a record Kafka refused (with the reason); None drops it."""


class RecordsRefused(Exception):
    """Kafka refused these records (with the reason each): the transaction was aborted, and
    the caller replaces them and commits again (streams.engine.librdkafka.transactions)."""

    def __init__(self, refused: list[tuple[OutRecord, str]]) -> None:
        super().__init__(f"Kafka refused {len(refused)} records")
        self.refused = refused


@dataclass(frozen=True, slots=True)
class Refused:
    """A record Kafka refused, why, and what was written instead (None: nothing)."""

    record: OutRecord
    reason: str
    replacement: OutRecord | None


class DeadLetters:
    """The default replacements of refused records, for one dead-letter topic and stage.

    A record is replaced by a dead letter of itself (its key, value and headers, with the
    reason; `error.topic` is the topic it was meant for); a dead letter by the same without
    its value (`error.value-dropped` says how large it was); a dead letter without its value
    by nothing. The last two are logged as errors: the dead-letter topic is too small."""

    def __init__(self, topic: str, stage: str) -> None:
        self.topic = topic
        self.stage = stage

    def __call__(self, record: OutRecord, reason: str) -> OutRecord | None:
        if record.topic != self.topic:
            headers = dict(record.headers)
            raw = RawRecord(record.topic, record.value or b"", headers)
            return dead_letter_record(self.topic, raw, record.key, reason, self.stage)
        return self.without_value(record, reason)

    def without_value(self, record: OutRecord, reason: str) -> OutRecord | None:
        """A refused dead letter, once more without its value; None when it had none."""
        names = {name for name, _ in record.headers}
        if VALUE_DROPPED_HEADER in names:
            log.error(
                "DROPPED a dead letter Kafka refused even without its value (%s); its headers: %s",
                reason,
                {name: value[:200] for name, value in record.headers},
            )
            return None
        log.error(
            "the dead-letter topic %s refused a dead letter (%s): writing it without its "
            "value (%d bytes); raise the topic's max.message.bytes",
            record.topic,
            reason,
            len(record.value or b""),
        )
        kept = [(name, value) for name, value in record.headers if name != "error"]
        error = dict(record.headers).get("error", b"")
        note = f" | dead letter refused ({reason}): value dropped".encode()
        return OutRecord(
            record.topic,
            record.key if record.key is None or len(record.key) <= 1024 else None,
            None,
            (
                *kept,
                ("error", error[: 4096 - len(note)] + note),
                (VALUE_DROPPED_HEADER, str(len(record.value or b"")).encode()),
            ),
        )


def refusal_reason(record: OutRecord, exc: BaseException) -> str:
    """The reason a dead letter carries for a record Kafka refused."""
    size = len(record.key or b"") + len(record.value or b"")
    size += sum(len(name) + len(value or b"") for name, value in record.headers)
    return (
        f"Kafka refused the record for topic {record.topic} ({size:,} bytes of key, value "
        f"and headers): {exc!r}; is the topic's max.message.bytes lower than the stream's?"
    )


@dataclass(slots=True)
class Sent:
    """What one `send_all` wrote: where each partition's records went, and what Kafka
    refused (and was replaced or dropped)."""

    acknowledged: list[Acknowledged] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Acknowledged:
    """Where Kafka stored the records of one topic partition that one call sent."""

    topic: str
    partition: int
    first_offset: int
    count: int

    @property
    def last_offset(self) -> int:
        return self.first_offset + self.count - 1


class Sender:
    """The frame of a stage's sender (streams.engine.librdkafka.producer.RdRecordSender):
    each `send_all` call is one writer of its stage for `progress`, whose trouble ends with
    the call however it ends."""

    def __init__(
        self,
        kafka: KafkaSettings | str,
        client_id: str,
        progress: Progress,
        dead_letters: DeadLetters,
        *,
        failures_only: bool = False,
    ) -> None:
        self.kafka = KafkaSettings.of(kafka)
        self.client_id = client_id
        self.progress = progress
        self.dead_letters = dead_letters
        """The replacement of a refused record when the caller names none, and always of a
        refused dead letter."""
        self.failures_only = failures_only
        """Kafka reports only the records it did not take: no call per record, and
        `Sent.acknowledged` stays empty (for a caller that needs no offsets: stage one)."""

    async def send_all(
        self, records: Sequence[OutRecord], stage: str, replace: Replace | None = None
    ) -> Sent:
        """Send every record; once all are acknowledged, say where each partition's went and
        which records Kafka refused (`replace`, else the sender's default, said what to write
        instead). `stage` names who waits, for the log and `/ready`."""
        if not records:
            return Sent()
        who = object()  # this call, among the stage's writes waiting at once
        try:
            return await self._send(records, stage, replace, who)
        finally:
            self.progress.given_up(stage, who)  # raised (Stopping, cancelled): no trouble left

    async def _send(
        self, records: Sequence[OutRecord], stage: str, replace: Replace | None, who: object
    ) -> Sent:
        raise NotImplementedError
