"""A stage's group member on librdkafka: batches handed to a handler, offsets committed after
it (or by its transactions), partitions moving incrementally.

A dedicated thread drives the confluent_kafka.Consumer: `consume(max_records, within)`
there, and each batch is handed to the event loop, which handles it (under `lock`) while the
thread already fetches the next one (at most one batch waits). Every other call on the
consumer (commit, seek, committed, position, group metadata) is made by that thread too, as
a command the loop queues and awaits: a call from a second thread while one is in `consume`
can block the event loop (measured: `consumer_group_metadata()` from the loop hung for good
while the thread consumed). Polling from the loop with timeout 0 would avoid the thread but
not the wait for the rebalance callbacks, which librdkafka runs inside `consume` and which
must wait for the loop (draining, restoring) before the assignment changes: here they do,
in the thread, while the loop works.

Incremental rebalancing (KIP-848 `group.protocol=consumer`, or classic with the
cooperative-sticky assignor): `on_assign`, `on_revoke` and `on_lost` carry only the
partitions that change. A revoke waits for the batch in hand and the work it left running
(`drain`), then lets the partitions go (`release`: their local state handles closed); an
assign first reads the partitions' committed offsets (read_committed: this waits for any
transaction still open on them, which a previous owner's outputs and changelog belong to),
then runs `on_assigned` with the whole assignment (state opened and restored where it is
behind), before any record of them is handled. The other partitions keep flowing meanwhile.

A batch fetched before a revoke keeps only the records of partitions still owned. After an
emit transaction was given up (streams.engine.librdkafka.transactions.PartitionsMoved) the member
rewinds every partition it owns to its committed offset (`rewind`): records fetched before
that are dropped until each partition reads its committed offset again (the repartition topic
is written without transactions, so its offsets are dense: the committed offset is a record).

A record librdkafka cannot read (a compressed batch it cannot decompress, one that fails its
CRC, an unknown format) is reported by `consume()` as an error message tied to the partition
and to the batch's first offset, on every fetch, and nothing after it on that partition is
handed over: the member steps past it (seeks one offset on) and hands the stage an
`Unreadable` in its place, which the stage dead-letters and commits like any record. A
partition whose position does not move while records wait on it is named by `view()`
(`stalled`), whatever the cause.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as RdTopicPartition

from streams.engine.batches import Batch, StageMeter
from streams.engine.librdkafka import librdkafka_log, settle
from streams.engine.membership import remove_predecessor
from streams.engine.records import TopicPartition
from streams.kafka_settings import KafkaSettings

log = logging.getLogger(__name__)

Result = TypeVar("Result")
CALL_TIMEOUT_S = 30.0
TROUBLE_FRESH_S = 12.0
"""librdkafka reconnects at least every reconnect.backoff.max.ms (10 s), saying so each time."""
QUIET_ERRORS = frozenset({KafkaError._PARTITION_EOF, KafkaError._TIMED_OUT})
UNREADABLE_ERRORS = frozenset(
    {KafkaError._BAD_COMPRESSION, KafkaError._BAD_MSG, KafkaError._NOT_IMPLEMENTED}
)
"""The errors librdkafka reports for a record it fetched and cannot read, tied to its offset
(rdkafka_msgset_reader.c: decompression failed, possibly because the output would exceed
receive.message.max.bytes; a CRC mismatch with check.crcs; an unsupported format or codec).
It reports them on every fetch, at the compressed batch's first offset, and hands over
nothing after them on that partition: the member steps past them (RdBatchLoop._step_past)."""
PARTITION_STALL_S = 10.0
"""A partition whose position has not moved for this long while records wait on it is
reported (`RdBatchLoop.view`): the stage may handle other partitions meanwhile."""
UNRELEASED_INSTANCE_ID = KafkaError(KafkaError.UNRELEASED_INSTANCE_ID).str()
"""librdkafka's words for the broker's UNRELEASED_INSTANCE_ID, which the text of the fatal
error it raises for it quotes (that error's code is _FATAL; confluent-kafka does not expose
the original code)."""
REJOIN_AT_ONCE_EVERY_S = 60.0
"""A member removes its predecessor and rejoins at once at most this often; a second live
holder of its instance id (ruled out by construction) would otherwise remove it in turn, in a
loop: it then pauses as after any other failure."""


def consumer_config(
    connection: dict[str, Any],
    *,
    client_id: str,
    group_id: str,
    group_instance_id: str | None,
    group_protocol: str,
    session_timeout_s: float,
    max_record_bytes: int | None = None,
) -> dict[str, Any]:
    """librdkafka properties of a stage member. With `group.protocol=consumer` the session
    timeout, heartbeat and assignor are the group's (librdkafka refuses them client-side):
    streams.engine.librdkafka.group_config sets the first two. `max_record_bytes`: the
    topics' max.message.bytes, which bounds what one fetch may bring in and inflate
    (`fetch_bounds`)."""
    config: dict[str, Any] = {
        **connection,
        "client.id": client_id,
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "max.partition.fetch.bytes": 4 * 1024 * 1024,
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        "group.protocol": group_protocol,
    }
    if max_record_bytes is not None:
        config.update(fetch_bounds(max_record_bytes))
    if group_instance_id:
        config["group.instance.id"] = group_instance_id
    if group_protocol == "classic":
        config["partition.assignment.strategy"] = "cooperative-sticky"
        config["session.timeout.ms"] = int(session_timeout_s * 1000)
        config["heartbeat.interval.ms"] = int(session_timeout_s * 1000 / 5)
    return config


FETCH_QUEUE_BACKOFF_MS = 10
"""How long librdkafka postpones a partition's next fetch once the member's queue holds more
than `queued.max.messages.kbytes` (librdkafka's default: 1,000 ms, CONFIGURATION.md). The
stages bound that queue to a few records' worth (`fetch_bounds`), so a stage catching up on a
backlog fills it at every fetch; with the default it then sat idle for up to a second after
draining it (the state restore did: streams.engine.store RESTORE_FETCH_BACKOFF_MS)."""

HEADROOM_BYTES = 64 * 1024
"""Above a topic's max.message.bytes: a record batch's own framing around its largest record."""


def fetch_bounds(max_record_bytes: int) -> dict[str, int]:
    """librdkafka properties bounding the memory one fetch costs, from the topics' limit.

    What librdkafka bounds (CONFIGURATION.md, rdkafka_msgset_reader.c, rdkafka_zstd.c):
    `fetch.max.bytes` (per fetch) and `max.partition.fetch.bytes` (per partition) count the
    bytes as the broker sends them, compressed; a batch larger than both still comes whole
    (KIP-74), and a topic's max.message.bytes bounds a batch, compressed. librdkafka then
    decompresses every batch of the response before any is handed over, and a zstd batch
    only into a buffer of at most `receive.message.max.bytes` (it guesses twice the
    compressed size, then grows it threefold until the output fits or would exceed that:
    then `_BAD_COMPRESSION`, an unreadable record). So that cap is three times a whole raw
    record, with which one always decompresses, and is what one zstd batch may inflate to
    (it was 100 MB; 30 records of 48 MB on 300 KB of topic cost 1.4 GB). gzip, lz4 and
    snappy are decompressed without such a cap: their ratio (about 1,000:1 at most for
    gzip, 255:1 for lz4) bounds them. `queued.max.messages.kbytes` bounds what waits
    decompressed in the member's queue between fetches."""
    whole = max_record_bytes + HEADROOM_BYTES
    return {
        "fetch.max.bytes": whole,
        "max.partition.fetch.bytes": whole,
        "receive.message.max.bytes": 3 * whole + 512,  # at least fetch.max.bytes + 512
        "queued.max.messages.kbytes": 4 * whole // 1024,
    }


class _ConsumerFatal(Exception):
    """librdkafka gave this consumer up for good: a new one must join."""


class Unreadable:
    """Stands in, in a batch, for a record librdkafka cannot read: what is known of it (its
    partition, offset and librdkafka's error), with the calls of a confluent_kafka.Message a
    stage makes (no key, value or headers), so that it is dead-lettered and committed in
    offset order like any other record."""

    __slots__ = ("_offset", "_partition", "_topic", "reason")

    def __init__(self, topic: str, partition: int, offset: int, reason: str) -> None:
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self.reason = reason

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> None:
        return None

    def value(self) -> None:
        return None

    def headers(self) -> None:
        return None

    def error(self) -> str:
        return self.reason

    def describe(self) -> str:
        return (
            f"the record at {self._topic}[{self._partition}]@{self._offset} cannot be read: "
            f"{self.reason}"
        )


def headers_unreadable(message: Message, error: Exception) -> str:
    """Why a record whose headers confluent-kafka cannot read is dead-lettered, and where it
    is: `Message.headers()` raises SystemError, caused by a UnicodeDecodeError, for a header
    name that is not UTF-8 (Kafka allows any bytes there)."""
    cause = error.__cause__ or error.__context__
    if isinstance(cause, UnicodeDecodeError):
        what = f"a header name is not UTF-8 ({cause.object!r}: {cause.reason})"
    else:
        what = f"{type(error).__name__}: {error}"
    return (
        f"the headers of the record at {message.topic()}[{message.partition()}]@"
        f"{message.offset()} cannot be read: {what}"
    )


def _tp(partition: RdTopicPartition) -> TopicPartition:
    return TopicPartition(partition.topic, partition.partition)


class RdBatchLoop:
    """Consume `topics` as one group member; call `handle` per batch; commit after it
    (`commits_offsets`), else `handle`'s transactions commit them."""

    def __init__(
        self,
        name: str,
        config: dict[str, Any],
        topics: list[str],
        handle: Callable[[Batch], Awaitable[None]],
        *,
        commits_offsets: bool,
        max_records: int,
        within_ms: int,
        on_assigned: Callable[[set[TopicPartition]], Awaitable[None]] | None = None,
        release: Callable[[set[TopicPartition]], None] | None = None,
        drain: Callable[[], Awaitable[None]] | None = None,
        resume: Callable[[], None] | None = None,
        fence: Callable[[set[TopicPartition]], None] | None = None,
        kafka: KafkaSettings | None = None,
    ) -> None:
        self.name = name
        self.topics = topics
        self.handle = handle
        self.commits_offsets = commits_offsets
        self.max_records = max_records
        self.within_s = within_ms / 1000
        self.on_assigned = on_assigned
        self.release = release
        """Called with the partitions kept after a revoke or loss (their state stays open)."""
        self.drain = drain
        self.resume = resume
        """Called once the member rewound after PartitionsMoved (the transactions commit again)."""
        self.fence = fence
        """Called (in the poll thread, blocking) with newly assigned partitions before their
        committed offsets are read: fences their previous writers (engine upgrades)."""
        self.kafka = kafka
        """The connection for removing a killed predecessor's static member (`_poll`)."""
        self._config = {**config, "error_cb": self._error, "logger": librdkafka_log()}
        self.consumer = Consumer(self._config)
        self.lock = asyncio.Lock()
        self.assigned = asyncio.Event()
        self.owned: set[TopicPartition] = set()
        self.answered_at: float | None = None
        """When a fetch last returned records."""
        self._trouble_at: float | None = None
        """When librdkafka last said it cannot reach a broker."""
        self._next: dict[TopicPartition, int] = {}
        """Per partition, the next offset to hand on: what comes before was handed already."""
        self._rewinding: dict[TopicPartition, int] = {}
        """Partitions rewound to this offset: records after it are dropped until it comes."""
        self._rewind_wanted = False
        self._fetching_from: dict[TopicPartition, int] = {}
        """Per partition, where the member last had librdkafka fetch from (its committed
        offset when assigned, one past an unreadable record after stepping past it): an
        unreadable batch reported at an earlier offset holds the record there."""
        self._positions: dict[TopicPartition, tuple[int, float]] = {}
        """Per partition: its last known position, and since when it has not moved."""
        self.stalled: list[str] = []
        """The partitions whose position has not moved for PARTITION_STALL_S while records
        wait on them, as of the last `view()`: `topic[partition]: why`."""
        self._failure: BaseException | None = None
        self._stopped = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._commands: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.Future[Any]]] = (
            queue.SimpleQueue()
        )
        self._wake = threading.Event()
        """Set when the loop took the batch handed over, or queued a command."""
        self._handoff: list[Message | Unreadable] | None = None
        self._arrived: asyncio.Event | None = None
        self.group_metadata: object = None
        """The consumer's group metadata as of its last fetch or rebalance (exactly-once v2)."""
        self._thread: threading.Thread | None = None
        self._closed: asyncio.Future[None] | None = None
        self.revoked_count = 0
        self.assigned_count = 0

    @property
    def ready(self) -> bool:
        return self.assigned.is_set()

    # -- the poll thread ---------------------------------------------------------------

    def _call(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` on the event loop and wait for it (from the poll thread)."""
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(work, self._loop)
        try:
            # Meanwhile the loop may need the consumer (a commit of the batch in hand,
            # which the revoke waits for): serve its commands.
            while True:
                try:
                    future.result(timeout=0.01)
                    break
                except concurrent.futures.TimeoutError:
                    self._serve_commands()
        except concurrent.futures.CancelledError:
            pass
        except Exception as exc:
            self._failure = self._failure or exc

    def _on_assign(self, consumer: Consumer, partitions: list[RdTopicPartition]) -> None:
        assigned = {_tp(partition) for partition in partitions}
        if assigned and self.fence is not None:
            self.fence(assigned)
        if assigned:
            try:  # waits for transactions still open on them (require_stable)
                committed = consumer.committed(partitions, timeout=CALL_TIMEOUT_S)
            except KafkaException as exc:
                log.warning("%s: reading committed offsets failed (%s)", self.name, exc)
            else:
                for partition in committed:
                    self._fetching_from.pop(_tp(partition), None)
                    self._positions.pop(_tp(partition), None)
                    if partition.offset >= 0:
                        self._fetching_from[_tp(partition)] = partition.offset
        self.group_metadata = consumer.consumer_group_metadata()
        self._call(self._assigned(assigned))

    def _on_revoke(self, consumer: Consumer, partitions: list[RdTopicPartition]) -> None:
        self.group_metadata = consumer.consumer_group_metadata()
        self._call(self._revoked({_tp(partition) for partition in partitions}, lost=False))

    def _on_lost(self, consumer: Consumer, partitions: list[RdTopicPartition]) -> None:
        self._call(self._revoked({_tp(partition) for partition in partitions}, lost=True))

    def _poll(self) -> None:
        assert self._loop is not None
        delay = 1.0
        removed_at: float | None = None
        try:
            while not self._stopped.is_set():
                try:
                    self._consume()
                except _ConsumerFatal as exc:
                    # Not a crash: let everything go, join again. KIP-848's
                    # UNRELEASED_INSTANCE_ID is a worker restarted under its static id while its
                    # killed predecessor is still a member (until the group's session timeout,
                    # 45 s at least): that member is removed, and this one joins at once.
                    log.error("%s: the consumer failed (%s)", self.name, exc)
                    self._call(self._revoked(set(self.owned), lost=True))
                    self._loop.call_soon_threadsafe(self.assigned.clear)  # /ready: not ours
                    self._close()
                    pause = delay
                    if UNRELEASED_INSTANCE_ID in str(exc) and self._remove_predecessor():
                        now = time.monotonic()
                        if removed_at is None or now - removed_at >= REJOIN_AT_ONCE_EVERY_S:
                            pause, removed_at = 0.0, now
                    log.warning(
                        "%s: joining the group again %s",
                        self.name,
                        f"in {pause:.0f} s" if pause else "at once",
                    )
                    self._wait(pause)
                    if pause:
                        delay = min(delay * 2, 10.0)
                    self.consumer = Consumer(self._config)
        except BaseException as exc:
            self._failure = self._failure or exc
        finally:
            self._close()
            self._loop.call_soon_threadsafe(self._set_closed)

    def _remove_predecessor(self) -> bool:
        """In the poll thread, after UNRELEASED_INSTANCE_ID: remove the static member holding
        this member's group.instance.id, a killed previous life of this worker (the id is
        exclusive to one running worker by construction, and a second live holder would be
        fenced anyway by the emit member's transactional.id, derived from it:
        streams.engine.membership.remove_predecessor). Whether it was removed."""
        group_id = self._config.get("group.id")
        instance_id = self._config.get("group.instance.id")
        kafka = self.kafka
        if kafka is None or not group_id or not instance_id:
            return False
        outcomes: list[str] = []

        async def remove() -> None:  # on the event loop: the aiokafka client lives there
            started = time.monotonic()
            removal = await remove_predecessor(kafka, group_id, instance_id)
            outcomes.append(removal.outcome)
            log.log(
                logging.INFO if removal.removed else logging.WARNING,
                "%s: removing the killed predecessor's static member %s from group %s: %s "
                "in %.0f ms",
                self.name,
                instance_id,
                group_id,
                removal.outcome,
                (time.monotonic() - started) * 1000,
            )

        self._call(remove())
        return outcomes == ["removed"]

    def _wait(self, seconds: float) -> None:
        """Pause the poll thread, serving the loop's commands meanwhile."""
        deadline = time.monotonic() + seconds
        while not self._stopped.is_set() and time.monotonic() < deadline:
            self._serve_commands()
            self._wake.wait(0.05)
            self._wake.clear()

    def _close(self) -> None:
        self._serve_commands()
        try:
            self.consumer.close()  # revokes (or, static, keeps) the assignment
        except Exception as exc:
            log.debug("%s: closing the consumer: %s", self.name, exc)
        self._serve_commands()

    def _consume(self) -> None:
        assert self._loop is not None
        self.consumer.subscribe(
            self.topics,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        while not self._stopped.is_set():
            self._serve_commands()
            if self._handoff is not None:  # the loop has not taken the last one yet
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            messages = self.consumer.consume(self.max_records, self.within_s)
            self.group_metadata = self.consumer.consumer_group_metadata()
            if not messages:
                continue
            stepped: set[TopicPartition] = set()
            data = [
                usable
                for message in messages
                if (usable := self._usable(message, stepped)) is not None
            ]
            if data:
                self.answered_at = time.monotonic()
                self._handoff = data
                self._loop.call_soon_threadsafe(self._set_arrived)

    def _set_arrived(self) -> None:
        if self._arrived is not None:
            self._arrived.set()

    def _serve_commands(self) -> None:
        assert self._loop is not None
        while True:
            try:
                command, future = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                result = command()
            except BaseException as exc:
                self._loop.call_soon_threadsafe(settle, future, None, exc)
            else:
                self._loop.call_soon_threadsafe(settle, future, result, None)

    async def _do(self, command: Callable[[], Result]) -> Result:
        """Run `command` (a call on the consumer) in the poll thread; its result."""
        assert self._loop is not None
        future: asyncio.Future[Result] = self._loop.create_future()
        if self._closed is not None and self._closed.done():
            raise RuntimeError(f"{self.name}: the consumer is closed")
        self._commands.put((command, future))
        self._wake.set()
        return await future

    def _set_closed(self) -> None:
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def _usable(
        self, message: Message, stepped: set[TopicPartition]
    ) -> Message | Unreadable | None:
        """The record to hand on for `message`: itself, an Unreadable in its place, or None
        (an error that is no record's). `stepped`: the partitions stepped past an unreadable
        record in this fetch (librdkafka may report one several times in one fetch)."""
        error = message.error()
        if error is None:
            return message
        if error.fatal() or error.code() == KafkaError._FATAL:
            raise _ConsumerFatal(error.str())
        if error.code() in UNREADABLE_ERRORS:
            return self._step_past(message, error, stepped)
        if error.code() not in QUIET_ERRORS:
            log.warning("%s: %s", self.name, error)
        return None

    def _step_past(
        self, message: Message, error: KafkaError, stepped: set[TopicPartition]
    ) -> Unreadable | None:
        """In the poll thread: librdkafka cannot read the record `message` names (it would
        report it on every fetch, and hand over nothing after it): seek one past it, and an
        Unreadable in its place. librdkafka names a compressed batch by its first offset
        whatever offset it was fetched from: reported below where the member had it fetch
        from, the record there is the unreadable one (of the same batch)."""
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        if topic is None or partition is None or offset is None or offset < 0:
            log.warning("%s: %s", self.name, error)
            return None
        tp = TopicPartition(topic, partition)
        if tp in stepped or tp not in self.owned:
            return None  # reported again in this fetch, or no longer this member's
        stepped.add(tp)
        fetching_from = self._fetching_from.get(tp)
        if fetching_from is not None and offset < fetching_from:
            offset = fetching_from
        try:
            self.consumer.seek(RdTopicPartition(topic, partition, offset + 1))
        except KafkaException as exc:
            log.warning("%s: stepping past %s[%d]@%d failed (%s)", self.name, *tp, offset, exc)
            return None
        self._fetching_from[tp] = offset + 1
        reason = f"{error.name()}: {error.str()}"
        log.warning(
            "%s: %s[%d]@%d cannot be read (%s): dead-lettered, reading on from %d",
            self.name,
            topic,
            partition,
            offset,
            reason,
            offset + 1,
        )
        return Unreadable(topic, partition, offset, reason)

    def _error(self, error: KafkaError) -> None:
        if error.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            self._trouble_at = time.monotonic()
            log.debug("%s: %s", self.name, error)
        else:
            log.log(logging.ERROR if error.fatal() else logging.WARNING, "%s: %s", self.name, error)

    # -- the event loop ----------------------------------------------------------------

    async def _assigned(self, assigned: set[TopicPartition]) -> None:
        async with self.lock:
            if self.drain is not None:
                await self.drain()
            self.owned |= assigned
            for tp in assigned:
                self._next.pop(tp, None)
                self._rewinding.pop(tp, None)
            self.assigned_count += 1
            if self.on_assigned is not None and (assigned or self.assigned_count == 1):
                await self.on_assigned(set(self.owned))
            if assigned or self.assigned_count == 1:  # KIP-848 also assigns nothing new
                log.info(
                    "%s: assigned %s (now %d partitions)",
                    self.name,
                    ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(assigned))
                    or "nothing",
                    len(self.owned),
                )
            self.assigned.set()

    async def _revoked(self, revoked: set[TopicPartition], lost: bool) -> None:
        async with self.lock:
            if self.drain is not None:
                await self.drain()
            self.owned -= revoked
            for tp in revoked:
                self._next.pop(tp, None)
                self._rewinding.pop(tp, None)
                self._fetching_from.pop(tp, None)
                self._positions.pop(tp, None)
            self.revoked_count += 1
            if self.release is not None and revoked:
                self.release(set(self.owned))
            log.info(
                "%s: %s %s (keeps %d partitions)",
                self.name,
                "lost" if lost else "revoked",
                ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(revoked)) or "nothing",
                len(self.owned),
            )
            if lost:
                # Whatever was in flight for them aborted or will: rewind what is kept.
                self._rewind_wanted = True

    def moved(self) -> None:
        """An emit transaction was given up (PartitionsMoved): rewind before the next batch."""
        self._rewind_wanted = True

    def skips(self, tp: TopicPartition, first_offset: int) -> bool:
        """Whether a batch's records of `tp` from `first_offset` on must be dropped: fetched
        before a rewind that has not reached them."""
        resume_at = self._rewinding.get(tp)
        if resume_at is None:
            return False
        if first_offset > resume_at:
            return True
        del self._rewinding[tp]
        return False

    async def _rewind(self) -> None:
        """Every owned partition back to its committed offset (under the lock)."""
        if self.drain is not None:
            await self.drain()  # what still commits now fails as moved, and is dropped
        self._rewind_wanted = False
        owned = sorted(self.owned)
        if owned:
            wanted = [RdTopicPartition(tp.topic, tp.partition) for tp in owned]
            committed = await self._do(lambda: self.consumer.committed(wanted, CALL_TIMEOUT_S))
            for partition in committed:
                tp = _tp(partition)
                if partition.offset == OFFSET_INVALID or partition.offset < 0:
                    if tp not in self._next:
                        continue  # never committed, nothing handed on: nothing to read again
                    # Never committed: from the start of the log (auto.offset.reset earliest).
                    low = await self._do(_low_watermark(self.consumer, partition))
                    partition = RdTopicPartition(tp.topic, tp.partition, low)
                try:
                    await self._do(_seek(self.consumer, partition))
                except KafkaException as exc:
                    log.info("%s: rewinding %s failed (%s)", self.name, tp, exc)
                    continue
                self._rewinding[tp] = partition.offset
                self._next[tp] = partition.offset
                self._fetching_from[tp] = partition.offset
            log.warning(
                "%s: rewound %d partitions to their committed offsets", self.name, len(owned)
            )
        if self.resume is not None:
            self.resume()

    def _batch(self, messages: list[Message | Unreadable]) -> Batch:
        """The records of partitions still owned, not handed on before, per partition."""
        batch: Batch = {}
        places: dict[tuple[str | None, int | None], tuple[list[Any], int] | None] = {}
        """Per (topic, partition): its records in `batch` and the first offset not handed on
        yet, or None when not owned (the lookups once per partition, not per record)."""
        for message in messages:
            place = (message.topic(), message.partition())
            if place not in places:
                tp = TopicPartition(place[0] or "", place[1] or 0)  # a fetched record has both
                places[place] = (
                    (batch.setdefault(tp, []), self._next.get(tp, 0)) if tp in self.owned else None
                )
            known = places[place]
            if known is None:
                continue
            if (message.offset() or 0) < known[1]:
                continue  # read again after a rewind that earlier records already reached
            known[0].append(message)
        for tp in [tp for tp, records in batch.items() if not records]:
            del batch[tp]
        for tp, records in list(batch.items()):
            if self.skips(tp, records[0].offset() or 0):
                del batch[tp]
            else:
                self._next[tp] = (records[-1].offset() or 0) + 1
        return batch

    async def start(self) -> None:
        """Start the poll thread (librdkafka connects in the background)."""
        self._loop = asyncio.get_running_loop()
        self._arrived = asyncio.Event()
        self._closed = self._loop.create_future()
        self._thread = threading.Thread(target=self._poll, name=f"{self.name}-poll", daemon=True)
        self._thread.start()

    async def run(self) -> None:
        """Until cancelled or the poll thread fails."""
        assert self._arrived is not None
        arrived = self._arrived
        meter = StageMeter(self.name)
        commit = self.commit if self.commits_offsets else None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(arrived.wait(), 0.5)
            arrived.clear()
            messages, self._handoff = self._handoff or [], None
            self._wake.set()  # the thread fetches the next batch while this one is handled
            self._raise_if_failed()
            async with self.lock:
                if self._rewind_wanted:
                    await self._rewind()
                if not messages:
                    continue
                batch = self._batch(messages)
                if not batch:
                    continue
                await meter.run(batch, self.handle, commit, time.monotonic())

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"{self.name}: the consumer failed") from self._failure

    async def commit(self, batch: Batch) -> None:
        """Commit the offsets just past each partition's last record of `batch`."""
        offsets = [
            RdTopicPartition(tp.topic, tp.partition, (records[-1].offset() or 0) + 1)
            for tp, records in batch.items()
            if records
        ]
        try:
            await self._do(lambda: self.consumer.commit(offsets=offsets, asynchronous=False))
        except KafkaException as exc:
            # The group moved on, or Kafka is away: the next owner (or the next commit)
            # covers these records; a repeat is a duplicate the emit stage drops.
            log.warning("%s: committing offsets failed (%s)", self.name, exc)

    async def view(self) -> tuple[int | None, float | None]:
        """The lag over the owned partitions whose end is known, and when Kafka last
        answered (for streams.progress.StallWatch)."""
        owned = [RdTopicPartition(tp.topic, tp.partition) for tp in self.owned]
        lag: int | None = None
        if owned:
            try:
                lag = await asyncio.wait_for(self._do(lambda: self._lag(owned)), 0.25)
            except (TimeoutError, KafkaException, RuntimeError):
                lag = None
        return lag, self._answered()

    def _answered(self) -> float | None:
        """librdkafka fetches in the background and says nothing when it succeeds: Kafka is
        taken to answer unless it reported a broker unreachable within TROUBLE_FRESH_S and
        no records came since (it repeats that at each failed reconnect)."""
        now = time.monotonic()
        trouble = self._trouble_at
        if (
            trouble is not None
            and now - trouble < TROUBLE_FRESH_S
            and (self.answered_at is None or self.answered_at < trouble)
        ):
            return self.answered_at
        return now

    def _lag(self, owned: list[RdTopicPartition]) -> int | None:
        """In the poll thread: high watermark minus position, over the known ones (before
        the first record of a partition, librdkafka knows no position: the offset it fetches
        from, its committed one, stands in). Notes the partitions whose position has not
        moved for PARTITION_STALL_S while records wait on them (`stalled`)."""
        lag: int | None = None
        now = time.monotonic()
        stalled: list[str] = []
        for partition in self.consumer.position(owned):
            tp = _tp(partition)
            _, high = self.consumer.get_watermark_offsets(partition, cached=True)
            position = partition.offset
            if position < 0:
                position = self._fetching_from.get(tp, -1)
            if high is None or high < 0 or position < 0:
                continue  # nothing consumed yet, nothing committed: no position known
            waiting = max(0, high - position)
            lag = (lag or 0) + waiting
            known = self._positions.get(tp)
            if known is None or known[0] != position or not waiting:
                self._positions[tp] = (position, now)
            elif now - known[1] >= PARTITION_STALL_S:
                stalled.append(
                    f"{tp.topic}[{tp.partition}]: {waiting} records waiting, its position "
                    f"{position} unmoved for {now - known[1]:.0f} s"
                )
        self.stalled = stalled
        return lag

    async def stop(self, abandon: bool = False) -> None:
        """Leave (the poll thread closes the consumer, whose revoke still reaches the loop).
        `abandon`: the worker is failing; the revoke does not wait for work in flight (which
        may be what failed, waiting for this)."""
        if abandon:
            self.drain = None
        self._stopped.set()
        self._wake.set()
        if self._closed is not None:
            await self._closed


def _seek(consumer: Consumer, partition: RdTopicPartition) -> Callable[[], None]:
    def seek() -> None:
        consumer.seek(partition)

    return seek


def _low_watermark(consumer: Consumer, partition: RdTopicPartition) -> Callable[[], int]:
    def low() -> int:
        return int(consumer.get_watermark_offsets(partition, timeout=CALL_TIMEOUT_S)[0])

    return low
