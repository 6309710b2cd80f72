"""The engine's idempotent producer (`send_all`): a stage's records written, acknowledged per
partition, refusals replaced.

`produce` is called on the event loop (it only queues, in C); a dedicated thread serves the
producer's delivery reports (`poll`) and resolves one asyncio future per `send_all` round
once every record of it has a report. So the loop never blocks on Kafka, and no thread hop
is paid per record, only per round.

A sender made `failures_only` (stage one's) takes no Python call per record at all: its
producer reports only the records Kafka did not take (`delivery.report.only.error`), and a
round is done once the producer holds none of its records (QuietRounds). It does not say
where the records went (`Sent.acknowledged` stays empty).

librdkafka retries what Kafka may take later (a broker away, a leader moving, with
idempotence and in order) by itself, up to `message.timeout.ms`; a record still without
acknowledgement then is sent again here, with those after it in its partition, after a
growing pause, until Kafka takes it: a transient failure holds the stream back, it never
becomes a drop. A record Kafka refuses for what it is (REFUSALS: too large for its topic) is
never sent again: Kafka refuses a message set as a whole, and one may hold records of
several rounds, so a refused record is sent again alone (Turns) to tell whether it is the
one, and each refused alone is replaced by what the caller's `Replace` makes of it
(streams.engine.outcomes.DeadLetters by default).

Partitions are librdkafka's `murmur2_random`: the Java client's murmur2 for a key (as
streams.core.partitioning.partition_for), spread for records without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from streams import metrics
from streams.core.records import OutRecord
from streams.engine import failpoints
from streams.engine.librdkafka import librdkafka_log
from streams.engine.outcomes import (
    MAX_BACKOFF_S,
    MAX_BATCH_BYTES,
    Acknowledged,
    Refused,
    Replace,
    Sender,
    Sent,
    refusal_reason,
)
from streams.engine.topics import DEAD_LETTER_MAX_MESSAGE_BYTES
from streams.kafka_settings import KafkaSettings

log = logging.getLogger(__name__)

PRODUCER_CONFIG: dict[str, Any] = {
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 5,
    "batch.size": MAX_BATCH_BYTES,
    "message.max.bytes": DEAD_LETTER_MAX_MESSAGE_BYTES,  # dead letters carry whole deliveries
    "partitioner": "murmur2_random",  # the Java client's, as streams.core.partitioning
    "request.timeout.ms": 30_000,
    "message.timeout.ms": 30_000,
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1024 * 1024,
}
"""Every producer of the engine: the transactional ones add their `transactional.id`."""

REFUSALS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        2,  # CORRUPT_MESSAGE (no constant in confluent-kafka)
    }
)
"""Error codes Kafka answers for the records themselves: sending them again cannot succeed."""

Report = tuple[KafkaError | None, int, int]
"""One record's delivery report: its error (None: stored), partition and offset."""


def producer_config(kafka: KafkaSettings, client_id: str, **extra: Any) -> dict[str, Any]:
    """librdkafka properties of one of the engine's producers (the connection from
    KafkaSettings.librdkafka_config: TLS, SASL)."""
    return {
        **kafka.librdkafka_config(),
        **PRODUCER_CONFIG,
        "client.id": client_id,
        "logger": librdkafka_log(),
        **extra,
    }


class Round:
    """One batch of records handed to a producer: their delivery reports, in order, and a
    future resolved (on its loop) once every record has one."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, count: int, tracked: int | None = None
    ) -> None:
        self.loop = loop
        self.reports: list[Report | None] = [None] * count
        self.remaining = count if tracked is None else tracked
        """Reports still to come (of the records given a callback)."""
        self.done: asyncio.Future[None] = loop.create_future()
        self.unqueued: KafkaError | None = None
        """Why `produce` itself refused a record (those from it on were never queued)."""
        if not self.remaining:
            self.done.set_result(None)

    def callback(self, index: int) -> Any:
        def delivered(error: KafkaError | None, message: Message) -> None:
            # The thread serving the producer's reports (or one flushing it).
            self.reports[index] = (error, message.partition() or 0, message.offset() or 0)
            self.remaining -= 1
            if self.remaining == 0:
                self.loop.call_soon_threadsafe(self._finish)

        return delivered

    def settled(self) -> None:
        """Its records are all out of the producer (QuietRounds): done."""
        self.remaining -= 1
        if self.remaining == 0:
            self.loop.call_soon_threadsafe(self._finish)

    def fail_rest(self, start: int, error: KafkaError, only: set[int] | None) -> None:
        """Records from `start` on were never queued (`produce` itself refused); `only`: the
        indexes given a callback (None: all)."""
        self.unqueued = error
        for index in range(start, len(self.reports)):
            self.reports[index] = (error, -1, -1)
            if only is None or index in only:
                self.remaining -= 1
        if self.remaining == 0:
            self._finish()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def produce_round(
    producer: Producer,
    records: Sequence[OutRecord],
    only: set[int] | None = None,
    quiet: QuietRounds | None = None,
) -> Round:
    """Queue `records` in order (waiting while librdkafka's queue is full); their Round.
    `only`: the indexes of the records that get a delivery report (default: all). `quiet`:
    the producer reports only failures, and the round is done once QuietRounds says so."""
    if quiet is not None:
        only = set()
    tracked = 1 if quiet is not None else None if only is None else len(only)
    round_ = Round(asyncio.get_running_loop(), len(records), tracked)
    try:
        await _queue(producer, records, round_, only)
    finally:
        if quiet is not None:
            quiet.queued(round_, records)
    return round_


async def _queue(
    producer: Producer, records: Sequence[OutRecord], round_: Round, only: set[int] | None
) -> None:
    for index, record in enumerate(records):
        callback = round_.callback(index) if only is None or index in only else None
        partition = -1 if record.partition is None else record.partition
        headers: list[tuple[str, str | bytes | None]] | None = (
            list(record.headers) if record.headers else None
        )
        while True:
            try:
                producer.produce(
                    record.topic,
                    record.value,
                    record.key,
                    partition,
                    on_delivery=callback,
                    headers=headers,
                )
                break
            except BufferError:
                await asyncio.sleep(0.005)  # the queue drains as Kafka acknowledges
            except KafkaException as exc:  # refused before queueing (size, unknown topic)
                round_.fail_rest(index, exc.args[0], only)
                return


def acknowledgements(
    records: Sequence[OutRecord], reports: Iterable[Report | None]
) -> list[Acknowledged]:
    """Where the records Kafka stored went, per topic partition (its last offset exact)."""
    places: dict[tuple[str, int], tuple[int, int]] = {}
    for record, report in zip(records, reports, strict=True):
        if report is None or report[0] is not None:
            continue
        place = (record.topic, report[1])
        last, count = places.get(place, (-1, 0))
        places[place] = (max(last, report[2]), count + 1)
    return [
        Acknowledged(topic, partition, last - count + 1, count)
        for (topic, partition), (last, count) in places.items()
    ]


class RecordRefused(Exception):
    """Kafka refused a record itself (REFUSALS): a dead letter's reason names the subclass
    for the broker's code, as dead letters always did (the names of aiokafka's error classes,
    which the engine no longer uses), e.g. `MessageSizeTooLargeError('Broker: ...')`."""


class MessageSizeTooLargeError(RecordRefused):
    """MESSAGE_TOO_LARGE (10): larger than the topic's max.message.bytes."""


class RecordListTooLargeError(RecordRefused):
    """RECORD_LIST_TOO_LARGE (18): the batch is larger than the topic takes."""


class CorruptRecordException(RecordRefused):
    """CORRUPT_MESSAGE (2): the record fails its CRC or is otherwise corrupt."""


REFUSAL_NAMES: dict[int, type[RecordRefused]] = {
    KafkaError.MSG_SIZE_TOO_LARGE: MessageSizeTooLargeError,
    KafkaError.RECORD_LIST_TOO_LARGE: RecordListTooLargeError,
    2: CorruptRecordException,
}
"""Per broker code, the refusal a dead letter names; any other (INVALID_RECORD, which aiokafka
knew by no name either) reads as librdkafka's KafkaException."""


def refusal_error(error: KafkaError) -> BaseException:
    """The refusal as dead letters word it (REFUSAL_NAMES), so a reason reads as it did."""
    cls = REFUSAL_NAMES.get(error.code())
    if cls is None:
        return KafkaException(error)
    return cls(error.str())


def is_refusal(error: KafkaError | None) -> bool:
    return error is not None and error.code() in REFUSALS


Failure = tuple[KafkaError, str, bytes | None, bytes | None]
"""A record Kafka did not take, as its report says: the error, topic, key and value."""

QUIET_POLL_S = 0.002
"""How often a quiet producer's out-queue is looked at while rounds wait on it."""


class QuietRounds:
    """The rounds of a producer that reports only failures (`delivery.report.only.error`;
    librdkafka frees a record Kafka took without a report). `len(producer)` counts the
    records it holds and the reports not yet served, so once it is 0 every record queued
    before is either stored or reported failed, and the failures' reports were served: the
    rounds queued by then are done. A failure is matched to its record by topic, key and
    value (identical records are interchangeable: either one sent again is the same bytes).

    The rounds are queued on the event loop; `failed` and `settle` run in the thread that
    serves the producer (ReportThread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rounds: list[tuple[Round, Sequence[OutRecord]]] = []
        self._failures: list[Failure] = []

    def queued(self, round_: Round, records: Sequence[OutRecord]) -> None:
        """Every record of `round_` that will be queued is (the rest failed before)."""
        with self._lock:
            self._rounds.append((round_, records))

    def waiting(self) -> list[tuple[Round, Sequence[OutRecord]]]:
        with self._lock:
            return list(self._rounds)

    def failed(self, error: KafkaError, message: Message) -> None:
        """The producer's `on_delivery`: called for failures only."""
        self._failures.append((error, message.topic() or "", message.key(), message.value()))

    def settle(self, rounds: list[tuple[Round, Sequence[OutRecord]]]) -> None:
        """`rounds` (queued before the producer's out-queue was seen empty) are done: their
        failures are in their reports."""
        if self._failures:
            self._failures = self._match(rounds, self._failures)
        with self._lock:
            settled = {id(round_) for round_, _ in rounds}
            self._rounds = [entry for entry in self._rounds if id(entry[0]) not in settled]
        for round_, _ in rounds:
            round_.settled()

    @staticmethod
    def _match(
        rounds: list[tuple[Round, Sequence[OutRecord]]], failures: list[Failure]
    ) -> list[Failure]:
        """Write each failure into its record's report; those of no record in `rounds` (a
        round queued since) are kept."""
        places: dict[tuple[str, bytes | None, bytes | None], list[tuple[Round, int]]] = {}
        for round_, records in reversed(rounds):
            for index in range(len(records) - 1, -1, -1):
                record = records[index]
                if round_.reports[index] is None:
                    place = (record.topic, record.key, record.value)
                    places.setdefault(place, []).append((round_, index))
        kept: list[Failure] = []
        for failure in failures:
            error, topic, key, value = failure
            candidates = places.get((topic, key, value))
            if not candidates:
                kept.append(failure)
                continue
            round_, index = candidates.pop()  # the oldest first
            round_.reports[index] = (error, -1, -1)
        return kept


class ReportThread:
    """Serves one producer's callbacks (delivery reports) until stopped; with `quiet`, also
    settles its rounds whenever the producer holds no record."""

    def __init__(self, producer: Producer, name: str, quiet: QuietRounds | None = None) -> None:
        self.producer = producer
        self.quiet = quiet
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        producer, quiet = self.producer, self.quiet
        while not self._stopped.is_set():
            if quiet is None:
                producer.poll(0.05)
                continue
            waiting = quiet.waiting()  # before looking at the queue: these are all queued
            producer.poll(QUIET_POLL_S if waiting else 0.05)
            if waiting and len(producer) == 0:
                quiet.settle(waiting)

    async def stop(self, flush_s: float = 10.0) -> None:
        self._stopped.set()
        await asyncio.to_thread(self._thread.join)
        await asyncio.to_thread(self.producer.flush, flush_s)
        if self.quiet is not None:
            waiting = self.quiet.waiting()
            if waiting and len(self.producer) == 0:
                self.quiet.settle(waiting)


class Turns:
    """Who may queue on a sender's producer. Rounds share it, so librdkafka may put records of
    several rounds in one message set, and Kafka refuses a set as a whole: a record sent to
    tell whether Kafka refuses it for itself goes alone, once every round before it is done
    and before any other is queued."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()
        self._sharing = 0
        self._alone = False

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._alone)
            self._sharing += 1
        try:
            yield
        finally:
            async with self._changed:
                self._sharing -= 1
                self._changed.notify_all()

    @contextlib.asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._alone and not self._sharing)
            self._alone = True
        try:
            yield
        finally:
            async with self._changed:
                self._alone = False
                self._changed.notify_all()


@dataclass(slots=True)
class _Waiting:
    """Records of one send_all still without acknowledgement, in order."""

    records: list[OutRecord]
    single: list[OutRecord] = field(default_factory=list)
    """Refused together with others: sent one at a time to tell which Kafka refuses."""


class RdRecordSender(Sender):
    """The engine's producer of output, stale, dead-letter, repartition and changelog records
    (Sender's constructor; the librdkafka producer is made by `start`)."""

    _producer: Producer | None = None
    _reports: ReportThread | None = None
    _quiet: QuietRounds | None = None
    _turns: Turns | None = None

    async def start(self) -> None:
        """librdkafka connects in the background: nothing here waits for Kafka."""
        extra: dict[str, Any] = {"error_cb": self._error}
        self._quiet = QuietRounds() if self.failures_only else None
        if self._quiet is not None:
            extra |= {"delivery.report.only.error": True, "on_delivery": self._quiet.failed}
        self._producer = Producer(producer_config(self.kafka, self.client_id, **extra))
        self._reports = ReportThread(self._producer, f"{self.client_id}-reports", self._quiet)

    def _error(self, error: KafkaError) -> None:
        # librdkafka's own retries cover these; fatal ones end the producer (sends fail, and
        # send_all replaces it).
        log.log(logging.ERROR if error.fatal() else logging.DEBUG, "producer: %s", error)

    async def stop(self) -> None:
        if self._reports is not None:
            await self._reports.stop()
            self._reports = None
        self._producer = None

    async def _renew(self) -> None:
        log.info("renewing the producer %s", self.client_id)
        await self.stop()
        await self.start()

    async def _send(
        self, records: Sequence[OutRecord], stage: str, replace: Replace | None, who: object
    ) -> Sent:
        sent = Sent()
        waiting = _Waiting(list(records))
        delay = 0.2
        while waiting.records or waiting.single:
            self.progress.check()
            single = bool(waiting.single)
            if single:  # one at a time: each is its own message set
                batch = [waiting.single.pop(0)]
            else:
                batch, waiting.records = waiting.records, []
            try:
                failpoints.check_writable({record.topic for record in batch})
            except failpoints.FailpointError as exc:  # as if Kafka were away
                if single:
                    waiting.single.insert(0, batch[0])
                else:
                    waiting.records = batch + waiting.records
                metrics.SEND_RETRIES.inc()
                self.progress.trouble(
                    stage,
                    type(exc).__name__,
                    f"Kafka did not acknowledge {len(batch)} of {len(records)} records ({exc}); "
                    "sending them again",
                    who,
                )
                await self.progress.pause(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)
                continue
            turns = self._turns = self._turns or Turns()
            async with turns.alone() if single else turns.shared():
                assert self._producer is not None
                round_ = await produce_round(self._producer, batch, quiet=self._quiet)
                await self.progress.watch(stage, f"{len(batch)} records", round_.done, who)
            sent.acknowledged.extend(acknowledgements(batch, round_.reports))
            failed: list[OutRecord] = []
            refused: list[tuple[OutRecord, KafkaError]] = []
            error: KafkaError | None = None
            fatal = False
            for record, report in zip(batch, round_.reports, strict=True):
                if report is None or report[0] is None:  # stored (a quiet round: no report)
                    continue
                if is_refusal(report[0]):
                    refused.append((record, report[0]))
                else:
                    failed.append(record)
                    error = report[0]
                    fatal = fatal or report[0].fatal()
            if single:  # sent alone (Turns): it is the one
                for record, refusal in refused:
                    self._refused(sent, waiting, record, refusal, replace)
            else:  # refused with its message set, maybe for another record in it
                waiting.single.extend(record for record, _ in refused)
            if failed:
                # In their order, before anything not sent yet.
                waiting.records = failed + waiting.records
                metrics.SEND_RETRIES.inc()
                self.progress.trouble(
                    stage,
                    error.name() if error is not None else "delivery",
                    f"Kafka did not acknowledge {len(failed)} of {len(records)} records "
                    f"({error}); sending them again",
                    who,
                )
                if fatal:  # once no other write is queued on the old producer
                    async with turns.alone():
                        await self._renew()
                await self.progress.pause(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)
        self.progress.recovered(stage, who)
        return sent

    def _refused(
        self,
        sent: Sent,
        waiting: _Waiting,
        record: OutRecord,
        error: KafkaError,
        replace: Replace | None,
    ) -> None:
        reason = refusal_reason(record, refusal_error(error))
        if replace is None or record.topic == self.dead_letters.topic:
            replace = self.dead_letters
        replacement = replace(record, reason)
        outcome = "dead-lettered" if replacement is not None else "dropped"
        metrics.REFUSED.labels(record.topic, outcome).inc()
        log.error("%s; %s", reason, outcome)
        sent.refused.append(Refused(record, reason, replacement))
        if replacement is not None:
            waiting.records.append(replacement)
