"""Exactly-once v2 (KIP-447) for the emit stage: one transactional producer per emit member.

One producer, `transactional.id = <app id>-emit-<member>` (the member is
`stream.group_instance_id`, stable across a worker's restarts, so a restarted worker aborts
the transaction its previous life left open), writes every partition's outputs and changelog
records, and `send_offsets_to_transaction(offsets, consumer.consumer_group_metadata())` ties
each commit to the consumer's group generation: a worker whose partitions moved while it was
away (frozen, partitioned) cannot commit for them any more, whatever its producer.

Commits of several partitions' parts waiting at once go into one transaction (a transaction
costs a few round trips to the coordinator whatever it carries). A partition's parts commit one
after the other, so once a transaction committed, the next waits a few event-loop turns for
the parts that waited behind its parts (`queued_behind`) and takes them too, and the emit
stage plans its next batch only once that transaction has handed its records to librdkafka
(`clear_to_plan`): every partition's next part rides in each transaction, instead of the
partitions splitting into two groups that take turns. A failure of a transaction:
* a retriable failure of `send_offsets_to_transaction` or `commit_transaction` (a lost answer,
  a coordinator moving): the same call again, inside the transaction still open, as
  librdkafka documents for both;
* Kafka away, a timeout, anything that needs an abort: aborted, and tried again (the same
  records) with a growing pause **on a new producer** (a new epoch). An abort purges what
  librdkafka had in flight, and may have been stored by a leader that died before answering;
  the same producer would send the records again under the same epoch and sequences, which the
  new leader answers as duplicates of the aborted batch: acknowledged, and never readable.
  A new epoch starts the sequences afresh, so the retry is written;
* a `commit_transaction` given up (it did not return in time, or failed fatally) may have
  committed on the broker, and the next producer's initialisation then completes it: the
  next attempt first reads the emit group's stable committed offsets, and a transaction they
  show committed is not written again;
* records Kafka refuses: aborted; a transaction of several parts is tried again part by
  part, and a part's refused batch record by record, so that `RecordsRefused` names them
  (the caller replaces them and commits again);
* fenced producer, stale group generation or member, lost partitions: these partitions
  moved. Aborted (a fenced producer is replaced), every waiting commit fails with
  `PartitionsMoved`, and so does each later one until the emit member has rewound its
  partitions to their committed offsets (`resume`): their pending work is dropped and read
  again, never a crash.
Any other fatal producer error: the producer is replaced (the new one, under the same id,
fences it and aborts its transaction, as a restart would) and the transaction tried again,
the trouble reported meanwhile; at start-up (`prepare`) it is raised (the worker stops,
closing its consumers first).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient

from streams import metrics
from streams.core.records import OutRecord
from streams.engine import failpoints
from streams.engine.failpoints import FailpointError
from streams.engine.librdkafka import settle
from streams.engine.librdkafka.producer import (
    Round,
    acknowledgements,
    is_refusal,
    produce_round,
    producer_config,
    refusal_error,
)
from streams.engine.outcomes import MAX_BACKOFF_S, Acknowledged, RecordsRefused, refusal_reason
from streams.engine.records import TopicPartition
from streams.kafka_settings import KafkaSettings
from streams.progress import Progress

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 30.0
"""Per transactional call (init, offsets, commit, abort); a retriable timeout is tried again."""
OFFSETS_TIMEOUT_S = 10.0
"""`send_offsets_to_transaction`'s: a round trip to the group coordinator (milliseconds when
all is well); the one call seen hanging, so given the shortest wait."""
STUCK_MARGIN_S = 5.0
"""librdkafka may not return from a transactional call at its timeout: after the broker
restarted, `send_offsets_to_transaction` was seen waiting for good for a group coordinator it
never looks up again (confluentinc/librdkafka#5456 and #5511, open in 2.16). This long past
its timeout the producer is given up (its thread left inside it) and a new one under the same
transactional id fences it: the open transaction aborts, and its records are written again."""
RETRY_BACKOFF_MS = 10
"""`retry.backoff.ms` of the transactional producer (librdkafka's default: 100). Back-to-back
transactions wait on it: the coordinator answers CONCURRENT_TRANSACTIONS to a transaction's
AddOffsetsToTxn while the previous one's commit markers are still being written,
and librdkafka sends such a request again after `retry.backoff.ms` (rdkafka_txnmgr.c,
`rd_kafka_txn_handle_AddOffsetsToTxn`: `rd_kafka_buf_retry`; only AddPartitionsToTxn has its
own 20 ms). Markers take a few milliseconds, so a 100 ms backoff made most transactions of a
busy partition wait ~100 ms for nothing. Since librdkafka 2.3 (KIP-580) the backoff of each
request's later retries doubles up to `retry.backoff.max.ms` (1 s, unchanged), so a broker in
real trouble is not retried faster for long; produce retries of this producer start at 10 ms
too, which idempotence makes safe (sequence numbers: no duplicate, no reordering)."""
MAX_TRANSACTION_PLACES = 2000
"""The most output partitions (counted as `_places` does) the parts waiting to be committed
may touch together in one transaction; the rest wait for the next one (a part alone always
goes, bounded by the stage's `batch_size`). Kafka pays per partition per transaction (a
produce request, a commit marker): parts of several input partitions spread over thousands of
instances' topics, merged, could outlive the transaction timeout on every retry and stop the
stream (BENCHMARKS.md, "Issue 33: what an output partition costs": 61 s for one transaction
over 4,000 partitions). A stream with few output partitions merges every waiting part, as
before."""
GATHER_TURNS = 10
"""After a transaction committed, the most event-loop turns the next one waits for the parts
queued behind its parts (`MemberTransactions.queued_behind`); each needs two (the part before
it ends, then it calls `commit`)."""
TRANSACTION_TIMEOUT_MS = 30_000
"""`transaction.timeout.ms`: how long a transaction a vanished worker left open holds the
read_committed readers of its partitions back, when no restart under its id aborts it."""

MOVED = frozenset(
    {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.STALE_MEMBER_EPOCH,
        KafkaError.FENCED_MEMBER_EPOCH,
        KafkaError.UNKNOWN_PRODUCER_ID,
    }
)
"""Errors that mean the group (or another producer under this id) moved on from this member."""


class _Txn:
    """A transactional producer and the daemon thread its blocking calls run on, one after
    another: never the event loop's shared pool, which a call librdkafka does not return from
    would hold, and which the interpreter waits for at exit."""

    def __init__(self, producer: Producer, name: str) -> None:
        self.producer = producer
        self.stuck = False
        """A call did not return in time: the producer and its thread are given up."""
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            call()

    def close(self) -> None:
        """End its thread once the calls queued before are done (a retired producer)."""
        self._calls.put(None)

    async def call(self, what: str, call: Callable[[float], Any], timeout_s: float) -> Any:
        """`call(timeout_s)` off the loop; KafkaException(_TIMED_OUT) if it has not returned
        STUCK_MARGIN_S after its timeout, the producer then given up (`stuck`)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def run() -> None:
            try:
                result, error = call(timeout_s), None
            except BaseException as exc:
                result, error = None, exc
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle, future, result, error)

        self._calls.put(run)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s + STUCK_MARGIN_S)
        except TimeoutError:
            self.stuck = True
            raise KafkaException(
                KafkaError(
                    KafkaError._TIMED_OUT,
                    f"{what} did not return within {timeout_s + STUCK_MARGIN_S:.0f} s "
                    "(librdkafka#5456): replacing the transactional producer",
                )
            ) from None


FENCE_TIMEOUT_S = 10.0


def fence_partition_ids(kafka: KafkaSettings, app_id: str, partitions: Iterable[int]) -> None:
    """Initialise and let go the transactional ids of `partitions` that the aiokafka engine
    (removed 2026-12) used, one per input partition (`<app_id>-emit-<partition>`), before this
    member reads
    their committed offsets. After an upgrade from that engine (or during a rolling one) a
    transaction an aiokafka worker left open on them, killed or frozen, is aborted at once and
    that worker fenced: nothing else fences it (its commits carry no group generation), and
    the committed-offset read would wait out its timeout (63-70 s measured,
    tests/integration/test_engine_upgrade.py). Blocking, a thread per partition: the poll
    thread calls it in the assignment callback. A failure is logged, not raised."""

    def fence(partition: int) -> None:
        transactional_id = f"{app_id}-emit-{partition}"
        producer = Producer(
            producer_config(
                kafka, f"{transactional_id}-fence", **{"transactional.id": transactional_id}
            )
        )
        try:
            producer.init_transactions(FENCE_TIMEOUT_S)
        except KafkaException as exc:
            log.warning(
                "fencing the aiokafka engine's producer %s failed: %s", transactional_id, exc
            )

    threads = [
        threading.Thread(target=fence, args=(partition,), name=f"fence-{partition}", daemon=True)
        for partition in sorted(partitions)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + FENCE_TIMEOUT_S + STUCK_MARGIN_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


class PartitionsMoved(Exception):
    """The group moved on from this member's transaction: aborted, nothing of it is visible;
    the partitions are read again from their committed offsets by whoever owns them now."""


class _Refusal(Exception):
    """Records Kafka refused in an (aborted) transaction: known ones, or a batch of several."""

    def __init__(self, known: list[tuple[OutRecord, KafkaError]], several: bool) -> None:
        super().__init__("refused")
        self.known = known
        self.several = several


class _Moved(Exception):
    pass


@dataclass(slots=True)
class _Request:
    """One partition's part: its records and the offsets to commit with them."""

    partition: int
    records: Sequence[OutRecord]
    offsets: dict[TopicPartition, int]
    done: asyncio.Future[list[Acknowledged]]
    single: bool = False
    """Send one record at a time: a batch of several of its records was refused."""
    diagnose: bool = False
    """A delivery report for every record: an attempt failed (was a record refused?).
    Otherwise only the last record of each dictated partition (changelog) gets one: a
    committed transaction has every record, and the state needs only where those end."""
    rounds: list[Round] = field(default_factory=list)
    places: int = -1
    """`_places` of it, once counted (a request left for the next transaction is not counted
    again)."""


def _places(request: _Request, partitions: Mapping[str, int]) -> int:
    """How many output partitions `request`'s records may touch, at most: each dictated
    partition (changelog), and per other topic its records' count, but no more than its
    partitions where they are known."""
    dictated: set[tuple[str, int]] = set()
    counts: dict[str, int] = {}
    for record in request.records:
        if record.partition is not None:
            dictated.add((record.topic, record.partition))
        else:
            counts[record.topic] = counts.get(record.topic, 0) + 1
    return len(dictated) + sum(
        min(count, partitions.get(topic, count)) for topic, count in counts.items()
    )


def _within_places(
    queue: list[_Request], partitions: Mapping[str, int]
) -> tuple[list[_Request], list[_Request]]:
    """The first requests of `queue` whose places add up to at most MAX_TRANSACTION_PLACES
    (at least one), and the rest: what one transaction takes."""
    if len(queue) == 1:
        return queue, []
    total = 0
    for index, request in enumerate(queue):
        if request.places < 0:
            request.places = _places(request, partitions)
        total += request.places
        if index and total > MAX_TRANSACTION_PLACES:
            return queue[:index], queue[index:]
    return queue, []


def _last_per_place(request: _Request) -> set[int]:
    """Indexes of the last record of each dictated partition (the changelog's)."""
    last: dict[tuple[str, int], int] = {}
    for index, record in enumerate(request.records):
        if record.partition is not None:
            last[(record.topic, record.partition)] = index
    return set(last.values())


def error_of(exc: BaseException) -> KafkaError | None:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


class TransactionPhases:
    """Where a committed transaction's time went, in streams.metrics.STAGE_SECONDS (stage
    `emit`): `txn-produce` (begin, the records handed to librdkafka), `txn-offsets`
    (`send_offsets_to_transaction`: AddOffsetsToTxn to the transaction coordinator, then
    TxnOffsetCommit to the group coordinator), `txn-commit` (`commit_transaction`: the records
    acknowledged, then EndTxn). The emit loop plans the next batches meanwhile: these are not
    its waits unless its parts in flight are at their limit."""

    def __init__(self) -> None:
        self.produce = metrics.STAGE_SECONDS.labels("emit", "txn-produce")
        self.offsets = metrics.STAGE_SECONDS.labels("emit", "txn-offsets")
        self.commit = metrics.STAGE_SECONDS.labels("emit", "txn-commit")
        self.committed = 0
        """Transactions committed (for tests and benchmarks)."""

    def record(self, began: float, produced: float, offered: float, committed: float) -> None:
        self.produce.inc(produced - began)
        self.offsets.inc(offered - produced)
        self.commit.inc(committed - offered)
        self.committed += 1


class MemberTransactions:
    """The emit member's transactional producer: `prepare`, `commit(partition, records,
    offsets)`, `stop`."""

    def __init__(
        self,
        kafka: KafkaSettings | str,
        app_id: str,
        member: str,
        group_metadata: Callable[[], Any],
        progress: Progress,
        producer_factory: Callable[[dict[str, Any]], Producer] = Producer,
        group_id: str | None = None,
        partitions: Mapping[str, int] | None = None,
    ) -> None:
        self.kafka = KafkaSettings.of(kafka)
        self.partitions: Mapping[str, int] = partitions or {}
        """The output topics' partition counts (the topology's), bounding what a transaction
        may touch (`_places`); a topic not in it counts a partition per record."""
        self.group_id = group_id or f"{app_id}-emit"
        """The emit group, whose committed offsets say whether a transaction given up inside
        its commit did commit."""
        self.producer_factory = producer_factory
        """Makes the producer from its librdkafka properties (tests wrap it to inject faults)."""
        self.transactional_id = f"{app_id}-emit-{member}"
        self.group_metadata = group_metadata
        """The emit consumer's current group metadata (generation, member id, epoch)."""
        self.progress = progress
        self._txn: _Txn | None = None
        self._stuck: list[_Txn] = []
        """Producers given up inside a call (kept: librdkafka's thread is still in them)."""
        self._queue: list[_Request] = []
        self._committer: asyncio.Task[None] | None = None
        self._moved = False
        self.moved_count = 0
        """Transactions given up because the group moved on (for tests and the log)."""
        self.phases = TransactionPhases()
        self.queued_behind: Callable[[int], bool] = lambda partition: False
        """Whether a part of `partition` waits behind the one being committed (the emit
        stage sets it): such parts join the next transaction (`_gather`)."""
        self.clear_to_plan = asyncio.Event()
        """Cleared from a transaction's commit until the next one has handed its records to
        librdkafka, while parts queued behind it gather: the emit stage plans its next
        batch only when it is set (the event loop runs one thing at a time; planning first
        would hold the next transaction back and leave Kafka idle meanwhile)."""
        self.clear_to_plan.set()
        self._uncertain = False
        """The last attempt was given up inside `commit_transaction` (stuck, or a fatal
        error): the broker may have committed it, which the next producer's initialisation
        then completes rather than aborts. The next attempt asks the group first."""

    @property
    def moved(self) -> bool:
        """Commits fail with PartitionsMoved until `resume`."""
        return self._moved

    def resume(self) -> None:
        """The emit member rewound its partitions after PartitionsMoved: commit again."""
        self._moved = False

    async def _ready_producer(self) -> _Txn:
        """The producer, created and its transactions initialised (which fences an older
        producer under the same id and aborts what it left open) if needed."""
        if self._txn is not None and not self._txn.stuck:
            return self._txn
        if self._txn is not None:
            log.warning("giving up the stuck transactional producer %s", self.transactional_id)
            self._stuck.append(self._txn)
            self._txn = None
        producer = self.producer_factory(
            producer_config(
                self.kafka,
                self.transactional_id,
                **{
                    "transactional.id": self.transactional_id,
                    "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                    "retry.backoff.ms": RETRY_BACKOFF_MS,
                },
            )
        )
        txn = _Txn(producer, f"{self.transactional_id}-txn")
        try:
            await txn.call("init_transactions", producer.init_transactions, CALL_TIMEOUT_S)
        except BaseException:
            if not txn.stuck:
                txn.close()
            raise
        self._txn = txn
        return txn

    async def prepare(self, partitions: set[int]) -> None:
        """Before any partition's state is restored: the producer is initialised."""
        delay = 0.2
        while True:
            self.progress.check()
            try:
                await self.progress.watch(
                    "emit", "starting the transactional producer", self._ready_producer()
                )
                self.progress.recovered("emit")
                return
            except KafkaException as exc:
                error = error_of(exc)
                if error is not None and error.fatal() and error.code() not in MOVED:
                    raise
                self.progress.trouble(
                    "emit", "init", f"starting the transactional producer failed ({exc}); retrying"
                )
                self._txn = None
                await self.progress.pause(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)

    async def commit(
        self, partition: int, records: Sequence[OutRecord], offsets: dict[TopicPartition, int]
    ) -> list[Acknowledged]:
        """Write `records` and commit `offsets` in one transaction (possibly with other
        partitions' parts); where the records of each topic partition went."""
        if self._moved:
            raise PartitionsMoved(f"partition {partition}: the group moved on; not committed")
        done: asyncio.Future[list[Acknowledged]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(partition, records, offsets, done))
        if self._committer is None or self._committer.done():
            self._committer = asyncio.ensure_future(self._commit_waiting())
        return await done

    async def _commit_waiting(self) -> None:
        try:
            while self._queue:
                requests, self._queue = _within_places(self._queue, self.partitions)
                try:
                    await self._transact(requests)
                except BaseException as exc:
                    for request in requests:
                        if not request.done.done():
                            request.done.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                await self._gather(requests)
        finally:
            self.clear_to_plan.set()

    async def _gather(self, committed: list[_Request]) -> None:
        """Wait (GATHER_TURNS event-loop turns at most) until a part is queued for every
        partition of `committed` that had one waiting behind its committed part, so that
        they all join the next transaction; the stage's planning waits meanwhile
        (`clear_to_plan`, set again once that transaction has produced its records)."""
        behind = {
            request.partition
            for request in committed
            if request.done.done()
            and not request.done.cancelled()
            and request.done.exception() is None
            and self.queued_behind(request.partition)
        }
        for _ in range(GATHER_TURNS):
            behind -= {request.partition for request in self._queue}
            if not behind:
                break
            self.clear_to_plan.clear()
            await asyncio.sleep(0)
        if not self._queue:
            self.clear_to_plan.set()

    async def _transact(self, requests: list[_Request]) -> None:
        """Commit `requests` together; resolve each with its acknowledgements, or its error."""
        who = object()  # this call, among the stage's writes waiting at once
        try:
            await self._attempts(requests, who)
        finally:
            # Moved, refused, stopping: the attempts ended, and any trouble they reported
            # with them (a transaction slowed by a freeze, then moved, left /ready at 503).
            self.progress.given_up("emit", who)

    async def _attempts(self, requests: list[_Request], who: object) -> None:
        delay = 0.2
        while True:
            self.progress.check()
            if self._moved:
                raise PartitionsMoved("the group moved on; not committed")
            partitions = ", ".join(str(request.partition) for request in requests)
            try:
                await self.progress.watch(
                    "emit", f"a transaction for partitions {partitions}", self._once(requests), who
                )
                self.progress.recovered("emit", who)
                for request in requests:
                    request.done.set_result(
                        acknowledgements(
                            request.records,
                            [report for round_ in request.rounds for report in round_.reports],
                        )
                    )
                return
            except _Moved as exc:
                self._moved = True
                self.moved_count += 1
                log.warning(
                    "emit: a transaction for partitions %s was aborted, the group moved on "
                    "(%s): their pending work is dropped and read again",
                    partitions,
                    exc,
                )
                moved = PartitionsMoved(str(exc))
                for request in [*requests, *self._queue]:
                    if not request.done.done():
                        request.done.set_exception(moved)
                self._queue = []
                return
            except _Refusal as refusal:
                if len(requests) > 1:  # part by part, to tell whose records they are
                    for request in requests:
                        try:
                            await self._transact([request])
                        except Exception as exc:
                            if not request.done.done():
                                request.done.set_exception(exc)
                    return
                request = requests[0]
                if refusal.known:
                    request.done.set_exception(
                        RecordsRefused(
                            [
                                (record, refusal_reason(record, refusal_error(error)))
                                for record, error in refusal.known
                            ]
                        )
                    )
                    return
                request.single = True
            except KafkaException as exc:
                error = error_of(exc)
                for request in requests:
                    request.diagnose = True  # the next attempt tells a refused record
                metrics.SEND_RETRIES.inc()
                self.clear_to_plan.set()  # planning need not wait for a retry
                self.progress.trouble(
                    "emit",
                    f"txn:{error.name() if error is not None else type(exc).__name__}",
                    f"a transaction for partitions {partitions} failed ({exc}); retrying",
                    who,
                )
                await self.progress.pause(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)

    async def _once(self, requests: list[_Request]) -> None:
        """One transaction of `requests`; raises _Moved, _Refusal or KafkaException (the
        transaction aborted, to be tried again)."""
        try:
            for request in requests:
                failpoints.check_writable({record.topic for record in request.records})
        except FailpointError as exc:  # as if Kafka were away (streams.engine.failpoints)
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, str(exc))) from None
        txn = await self._ready_producer()  # fenced the one before: its outcome is final
        if self._uncertain:
            if await self._committed_already(requests):
                self._uncertain = False
                log.warning(
                    "emit: the transaction for partitions %s given up inside its commit had "
                    "committed: not written again",
                    ", ".join(str(request.partition) for request in requests),
                )
                self.clear_to_plan.set()
                return  # its rounds' reports are its acknowledgements
            self._uncertain = False
        producer = txn.producer
        committing = False
        began = time.monotonic()
        try:
            producer.begin_transaction()
            for request in requests:
                request.rounds = []
                if request.single:
                    for record in request.records:
                        round_ = await produce_round(producer, [record])
                        request.rounds.append(round_)
                        await txn.call("flush", producer.flush, CALL_TIMEOUT_S)
                elif request.diagnose:
                    request.rounds.append(await produce_round(producer, request.records))
                else:
                    request.rounds.append(
                        await produce_round(producer, request.records, _last_per_place(request))
                    )
                for round_ in request.rounds:  # never commit without records never queued
                    if round_.unqueued is not None:
                        raise KafkaException(round_.unqueued)
            offsets = [
                RdTopicPartition(tp.topic, tp.partition, offset)
                for request in requests
                for tp, offset in request.offsets.items()
            ]
            metadata = self.group_metadata()
            produced = time.monotonic()
            self.clear_to_plan.set()  # its records are librdkafka's: the stage plans on
            await self._in_transaction(
                txn,
                "send_offsets_to_transaction",
                lambda timeout_s: producer.send_offsets_to_transaction(
                    offsets, metadata, timeout_s
                ),
                OFFSETS_TIMEOUT_S,
            )
            committing = True
            offered = time.monotonic()
            await self._in_transaction(
                txn, "commit_transaction", producer.commit_transaction, CALL_TIMEOUT_S
            )
            self.phases.record(began, produced, offered, time.monotonic())
        except KafkaException as exc:
            error = error_of(exc)
            if committing and (txn.stuck or (error is not None and error.fatal())):
                self._uncertain = True
            moved = error is not None and (error.code() in MOVED or error.fatal())
            if error is not None and error.fatal() and error.code() not in MOVED:
                log.error("the transactional producer failed for good: %s", error)
                self._retire(txn)
                raise
            refusal = None if moved else self._refusal(requests)
            await self._abort(txn)
            self._retire(txn)  # never a retry under the aborted attempt's epoch
            if moved:
                raise _Moved(str(error)) from exc
            if refusal is not None:
                raise refusal from exc
            raise

    @staticmethod
    def _refusal(requests: list[_Request]) -> _Refusal | None:
        """Refused records among the delivery reports of the failed transaction."""
        known: list[tuple[OutRecord, KafkaError]] = []
        several = False
        for request in requests:
            records = (
                [[record] for record in request.records] if request.single else [request.records]
            )
            for group, round_ in zip(records, request.rounds, strict=False):
                refused = [
                    (record, report[0])
                    for record, report in zip(group, round_.reports, strict=True)
                    if report is not None and is_refusal(report[0])
                ]
                if len(refused) == 1:
                    known.extend((record, error) for record, error in refused if error)
                elif refused:
                    several = True
        if not known and not several:
            return None
        return _Refusal(known, several)

    async def _committed_already(self, requests: list[_Request]) -> bool:
        """Whether the emit group's committed offsets (stable: no transaction pending on
        them) already reach every request's: the transaction given up inside its commit
        committed. KafkaException when Kafka cannot say (the attempt is tried again later)."""
        wanted = {
            (tp.topic, tp.partition): offset
            for request in requests
            for tp, offset in request.offsets.items()
        }
        if not wanted:
            return False
        admin = AdminClient(self.kafka.librdkafka_config())
        asked = ConsumerGroupTopicPartitions(
            self.group_id, [RdTopicPartition(topic, partition) for topic, partition in wanted]
        )
        futures = admin.list_consumer_group_offsets(
            [asked], require_stable=True, request_timeout=OFFSETS_TIMEOUT_S
        )
        answer = await asyncio.wrap_future(futures[self.group_id])
        committed: dict[tuple[str, int], int] = {}
        for tp in answer.topic_partitions:
            if tp.error is not None:  # e.g. UNSTABLE_OFFSET_COMMIT: not known yet, ask again
                raise KafkaException(tp.error)
            committed[(tp.topic, tp.partition)] = tp.offset
        return all(committed.get(place, -1) >= offset for place, offset in wanted.items())

    def _retire(self, txn: _Txn) -> None:
        """Give up `txn` after an abort or a fatal error: the next attempt initialises a new
        producer under the same transactional id (a new epoch, its sequences from 0). A stuck
        one is kept (its thread is still inside librdkafka) and replaced as before."""
        if self._txn is txn and not txn.stuck:
            self._txn = None
            txn.close()

    async def _in_transaction(
        self, txn: _Txn, what: str, call: Callable[[float], Any], timeout_s: float
    ) -> None:
        """`call` (`send_offsets_to_transaction`, `commit_transaction`) on the open
        transaction; a retriable failure that needs no abort is tried again in place, as
        librdkafka documents for both (a commit may be under way: it must not be aborted)."""
        while True:
            try:
                await txn.call(what, call, timeout_s)
                return
            except KafkaException as exc:
                error = error_of(exc)
                if (
                    error is None
                    or not error.retriable()
                    or error.txn_requires_abort()
                    or txn.stuck
                ):
                    raise
                self.progress.check()
                await self.progress.pause(0.2)

    async def _abort(self, txn: _Txn) -> None:
        """Abort the open transaction; a producer that cannot (fatal, stuck) is replaced."""
        while not txn.stuck:
            try:
                await txn.call("abort_transaction", txn.producer.abort_transaction, CALL_TIMEOUT_S)
                return
            except KafkaException as exc:
                error = error_of(exc)
                if error is not None and error.retriable():
                    self.progress.check()
                    await self.progress.pause(0.2)
                    continue
                # Fenced, fatal, or no transaction open (it failed before begin): a new
                # producer re-initialises under the same id, which aborts whatever is open.
                log.info("replacing the transactional producer (%s)", exc)
                self._retire(txn)
                return

    async def stop(self) -> None:
        if self._committer is not None:
            self._committer.cancel()
        txn, self._txn = self._txn, None
        if txn is not None and not txn.stuck:
            await txn.call("flush", txn.producer.flush, 5.0)
            txn.close()
