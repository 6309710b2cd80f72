"""`FileEvents`: handlers for one storage instance's canonical event topic.

The consumer side of the product: it reads `files.events.<instance>` with `read_committed`,
runs the registered handlers per event, and commits an offset only once its event is done
with (handled, skipped as a duplicate, or dead-lettered after its retries).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from datetime import timedelta
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CorruptRecordException, IllegalStateError, KafkaError
from aiokafka.structs import ConsumerRecord

from fileevents.codec import UnreadableRecord
from fileevents.deadletter import DeadLetterWriter, describe
from fileevents.dedupe import DedupeStore, check_store, store_name
from fileevents.errors import OnError, log_failure
from fileevents.metrics import FileEventsMetrics, serve
from fileevents.partition import PartitionWorker
from fileevents.processing import EventProcessor, Outcome
from fileevents.registry import H, Registry, Selector, check_timeout
from fileevents.retry import RetryPolicy
from streams.kafka_settings import KafkaAccessError, KafkaSettings, check_access

logger = logging.getLogger("fileevents")

_FIXED_CONSUMER_SETTINGS = frozenset(
    {"bootstrap_servers", "group_id", "enable_auto_commit", "isolation_level"}
)
_FIXED_PRODUCER_SETTINGS = frozenset({"bootstrap_servers", "acks", "enable_idempotence"})
_FETCH_TIMEOUT_MS = 200
MISSING_TOPIC_EVERY_S = 5.0
"""While the topic does not exist: one log line naming it this often (checked every second)."""
_CAREFUL_FETCH_TIMEOUT_MS = 1000
_UNREADABLE = (CorruptRecordException, UnicodeDecodeError)
"""What `getmany` raises for a record it cannot parse: aiokafka's Python record reader wraps
the cause in `CorruptRecordException`, its C reader lets a `UnicodeDecodeError` out."""


DEFAULT_HANDLER_TIMEOUT = timedelta(seconds=60)
"""How long one handler run may take unless said otherwise: well under the consumer's
`max_poll_interval_ms` (300 s), past which the group would evict this member."""


def _connection(
    bootstrap_servers: str | list[str] | None, kafka: KafkaSettings | None
) -> KafkaSettings:
    """`kafka`, else the `KAFKA_*` environment variables with `bootstrap_servers` winning."""
    import os

    servers = (
        ",".join(bootstrap_servers) if isinstance(bootstrap_servers, list) else bootstrap_servers
    )
    if kafka is not None:
        if servers is not None and servers != kafka.bootstrap_servers:
            raise ValueError("FileEvents: give bootstrap_servers or kafka, not both")
        return kafka
    if servers is None and not os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        raise ValueError(
            "FileEvents needs bootstrap_servers, kafka=KafkaSettings(...), or the environment "
            "variable KAFKA_BOOTSTRAP_SERVERS"
        )
    return KafkaSettings.from_environ(bootstrap_servers=servers)


def default_topic(instance: str) -> str:
    """The stream's output topic of `instance`."""
    return f"files.events.{instance}"


class FileEvents:
    """Register handlers with `on`, then `await run()`.

    `group_id` and `instance` (or an explicit `topic`) are required, and where Kafka is:
    `kafka=KafkaSettings(...)` (streams.kafka_settings: address, TLS, SASL), or
    `bootstrap_servers` with TLS and SASL from the `KAFKA_*` environment variables the rest
    of the product reads (`KAFKA_SECURITY_PROTOCOL`, `KAFKA_SASL_USERNAME`, ...), or those
    variables alone (`KAFKA_BOOTSTRAP_SERVERS`). Refused credentials or an untrusted
    certificate make `run()` raise `KafkaAccessError`, one line naming the setting.
    `dedupe`: an optional `DedupeStore`, ids kept for `dedupe_ttl`, each under its consumer
    group and provider scope; for `dedupe_legacy_window` (default `dedupe_ttl`; 0: never)
    after `run()` starts, an id not found is also looked up as recorded before scopes
    (fileevents.dedupe, fileevents/README.md "Upgrading"). `on_error`: called for
    every failure (default: log it). `retry`: attempts and backoff before an event is
    dead-lettered to `dead_letter_topic` (default `<topic>.dead-letter`). `commit_interval`:
    the shortest time between two offset commits. `max_buffered`: records fetched ahead per
    partition before fetching it pauses. `handler_timeout`: how long one handler run may
    take before it is cancelled and counts as failed (None: no limit; `on(..., timeout=)`
    sets it per handler). `metrics`: the Prometheus collector the counts go to (default: a
    new one, `self.metrics`); `metrics_port`: serve it on `metrics_host:metrics_port` at
    `/metrics` while `run()` runs. `consumer_config` / `producer_config`: more
    aiokafka settings (`group_instance_id`, timeouts; they win over `kafka`'s); the ones the
    guarantees rest on (auto commit off, `read_committed`, `acks=all`, idempotence) cannot
    be changed.
    """

    def __init__(
        self,
        *,
        bootstrap_servers: str | list[str] | None = None,
        group_id: str,
        kafka: KafkaSettings | None = None,
        instance: str | None = None,
        topic: str | None = None,
        dedupe: DedupeStore | None = None,
        dedupe_ttl: timedelta = timedelta(hours=24),
        dedupe_legacy_window: timedelta | None = None,
        on_error: OnError = log_failure,
        retry: RetryPolicy | None = None,
        dead_letter_topic: str | None = None,
        commit_interval: timedelta = timedelta(seconds=1),
        max_buffered: int = 1000,
        handler_timeout: timedelta | None = DEFAULT_HANDLER_TIMEOUT,
        metrics: FileEventsMetrics | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        handle_signals: bool = True,
        consumer_config: Mapping[str, Any] | None = None,
        producer_config: Mapping[str, Any] | None = None,
    ) -> None:
        if topic is None:
            if instance is None:
                raise ValueError("FileEvents needs an `instance` (or a `topic`)")
            topic = default_topic(instance)
        if not group_id:
            raise ValueError("FileEvents needs a `group_id`: commits belong to a consumer group")
        if dedupe_ttl <= timedelta(0):
            raise ValueError("dedupe_ttl must be positive")
        if dedupe_legacy_window is not None and dedupe_legacy_window < timedelta(0):
            raise ValueError("dedupe_legacy_window must not be negative")
        if max_buffered < 1:
            raise ValueError("max_buffered must be at least 1")
        check_timeout("handler_timeout", handler_timeout)
        if metrics_port is not None and not 0 <= metrics_port <= 65535:
            raise ValueError(f"metrics_port must be a TCP port (0-65535), got {metrics_port}")
        for given, fixed in (
            (consumer_config, _FIXED_CONSUMER_SETTINGS),
            (producer_config, _FIXED_PRODUCER_SETTINGS),
        ):
            clash = sorted(fixed & set(given or {}))
            if clash:
                raise ValueError(f"these settings are fixed by FileEvents: {', '.join(clash)}")
        self.kafka = _connection(bootstrap_servers, kafka)
        """How both clients connect (address, TLS, SASL)."""
        self.bootstrap_servers = self.kafka.bootstrap_servers
        self.group_id = group_id
        self.topic = topic
        self.dead_letter_topic = dead_letter_topic or f"{topic}.dead-letter"
        self.dedupe = dedupe
        self.dedupe_ttl = dedupe_ttl
        self.dedupe_legacy_window = (
            dedupe_ttl if dedupe_legacy_window is None else dedupe_legacy_window
        )
        """How long after `run()` starts ids recorded before scopes are still read."""
        self.on_error = on_error
        self.retry = retry or RetryPolicy()
        self.commit_interval = commit_interval
        self.max_buffered = max_buffered
        self.handler_timeout = handler_timeout
        self.metrics = metrics or FileEventsMetrics()
        """The Prometheus collector of this consumer (see fileevents/metrics.py)."""
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.handle_signals = handle_signals
        self.consumer_config = dict(consumer_config or {})
        self.producer_config = dict(producer_config or {})
        self.outcomes: Counter[str] = Counter()
        """How many records ended each way (`Outcome` values), since this object exists."""
        self._registry = Registry()
        self._running = False
        self._stop_requested = asyncio.Event()
        self._run_task: asyncio.Task[Any] | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._processor: EventProcessor | None = None
        self._workers: dict[TopicPartition, PartitionWorker] = {}
        self._done: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._commit_lock = asyncio.Lock()
        self._to_commit = asyncio.Event()
        self._reset_earliest = True

    # -- registration -------------------------------------------------------------------

    def on(self, selector: Selector = "*", *, timeout: timedelta | None = None) -> Callable[[H], H]:
        """Decorator: run the handler for events of type `selector` (`created`, `deleted`,
        or `*` for all). Handlers are `async def handler(event)` or
        `async def handler(event, context)`; the context is an `EventContext`.
        `timeout`: how long one run may take (default: `handler_timeout`); past it the
        handler is cancelled and the run counts as failed (retried, then dead-lettered)."""
        check_timeout(f"on({selector!r}, timeout=...)", timeout)

        def register(handler: H) -> H:
            self._registry.add(selector, handler, timeout)
            return handler

        return register

    def add_handler(self, selector: Selector, handler: H, *, timeout: timedelta | None = None) -> H:
        """`on` without the decorator."""
        return self.on(selector, timeout=timeout)(handler)

    @property
    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions this consumer handles right now (empty when not running)."""
        return frozenset(self._workers)

    # -- running ------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask `run` to stop gracefully: fetch no more, finish the event in progress on each
        partition, commit, return. Safe to call from a signal handler on the loop."""
        self._stop_requested.set()
        for worker in self._workers.values():
            worker.request_stop()  # at once: no event starts after this call

    async def run(self) -> None:
        """Consume until `stop()`, SIGTERM or SIGINT (graceful), or cancellation (abrupt:
        handlers in progress are cancelled and their events stay uncommitted)."""
        if self._running:
            raise RuntimeError("FileEvents.run is already running")
        if not len(self._registry):
            raise RuntimeError("no handler registered: use @events.on(...) before run()")
        self._running = True
        self._to_commit = asyncio.Event()
        self._commit_lock = asyncio.Lock()
        self._run_task = asyncio.current_task()
        try:
            await self._run()
        finally:
            self._running = False
            self._run_task = None
            self._stop_requested.clear()  # a later run() starts afresh

    async def _run(self) -> None:
        if self.metrics_port is None:
            await self._run_clients()
            return
        # First: a port in use stops run() before anything else is started.
        exposition = await serve(self.metrics, self.metrics_host, self.metrics_port)
        try:
            await self._run_clients()
        finally:
            await exposition.cleanup()

    async def _run_clients(self) -> None:
        if self.dedupe is not None:  # first: a store that does not answer stops run() at once
            await check_store(self.dedupe)
            logger.info(
                "dedupe store %s answers; handled ids kept %s",
                store_name(self.dedupe),
                self.dedupe_ttl,
            )
        connection = self.kafka.aiokafka_args()
        producer = AIOKafkaProducer(
            **{**connection, **self.producer_config},
            acks="all",
            enable_idempotence=True,
        )
        settings: dict[str, Any] = {"auto_offset_reset": "earliest", **self.consumer_config}
        self._reset_earliest = settings["auto_offset_reset"] == "earliest"
        # As in the Java client: a rebalance waits for a member's revoke callback (the
        # events in progress) as long as a poll may take, not only a session timeout.
        settings.setdefault("rebalance_timeout_ms", settings.get("max_poll_interval_ms", 300_000))
        consumer = AIOKafkaConsumer(
            **{**connection, **settings},
            group_id=self.group_id,
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        self._processor = EventProcessor(
            self._registry,
            self.group_id,
            self.retry,
            DeadLetterWriter(producer, self.dead_letter_topic),
            self.on_error,
            self.dedupe,
            self.dedupe_ttl,
            self.handler_timeout,
            self.metrics,
            self.topic,
            self.dedupe_legacy_window,
        )
        try:
            try:
                await producer.start()
                await consumer.start()
            except KafkaError:
                problem = await check_access(self.kafka)
                if problem is not None:  # refused: one line naming the setting to fix
                    raise KafkaAccessError(problem[0]) from None
                raise
            self._consumer = consumer
            with self._signals():
                if await self._topic_exists(consumer):
                    consumer.subscribe([self.topic], listener=_Listener(self))
                    logger.info("consuming %s as group %s", self.topic, self.group_id)
                    await self._consume(consumer)
        finally:
            self._consumer = None
            await consumer.stop()  # leaves the group (unless static membership is used)
            await producer.stop()
            logger.info("stopped consuming %s as group %s", self.topic, self.group_id)

    async def _topic_exists(self, consumer: AIOKafkaConsumer) -> bool:
        """Wait for the topic to exist, saying so every MISSING_TOPIC_EVERY_S; False if asked
        to stop meanwhile. Checked before subscribing: a subscription's metadata requests let
        a broker with `auto.create.topics.enable` create it, without the stream's settings."""
        loop = asyncio.get_running_loop()
        said_at: float | None = None
        while self.topic not in await consumer.topics():
            if said_at is None or loop.time() - said_at >= MISSING_TOPIC_EVERY_S:
                logger.warning(
                    "topic %s does not exist: waiting for it (the stream creates "
                    "files.events.<instance> for each instance in its config; "
                    "`python -m streams topics` lists them)",
                    self.topic,
                )
                said_at = loop.time()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_requested.wait(), 1.0)
            if self._stop_requested.is_set():
                return False
        return True

    async def _consume(self, consumer: AIOKafkaConsumer) -> None:
        committer = asyncio.create_task(self._commit_continuously(), name="fileevents:commit")
        graceful = False
        try:
            await self._fetch(consumer, committer)
            graceful = True
        finally:
            committer.cancel()
            await asyncio.wait([committer])
            workers = list(self._workers.values())
            self._workers.clear()
            if graceful:
                await asyncio.gather(*(worker.stop() for worker in workers))
            else:
                await asyncio.gather(*(worker.cancel() for worker in workers))
            await self._commit()
            self._done.clear()
            self._committed.clear()

    async def _fetch(self, consumer: AIOKafkaConsumer, committer: asyncio.Task[None]) -> None:
        """Fetch and hand records to their partition's worker until asked to stop."""
        while not self._stop_requested.is_set():
            if committer.done():
                raise RuntimeError("the commit task ended") from committer.exception()
            for worker in self._workers.values():
                crash = worker.crash()
                if crash is not None:
                    raise RuntimeError(f"the worker of {worker.tp} crashed") from crash
                if worker.paused and worker.backlog <= self.max_buffered // 2:
                    consumer.resume(worker.tp)
                    worker.paused = False
            try:
                batches = await consumer.getmany(timeout_ms=_FETCH_TIMEOUT_MS)
            except _UNREADABLE as exc:
                await self._step_past_unreadable(consumer, exc)
                continue
            for tp, records in batches.items():
                self._hand_out(consumer, tp, records)

    def _hand_out(
        self,
        consumer: AIOKafkaConsumer,
        tp: TopicPartition,
        records: list[ConsumerRecord[bytes, bytes]],
    ) -> None:
        owner = self._workers.get(tp)
        if owner is None:
            # Assigned but not announced yet, or being revoked: not ours to handle
            # now. Fetch them again later rather than skip them.
            with contextlib.suppress(IllegalStateError):
                consumer.seek(tp, records[0].offset)
            return
        owner.add(records)
        if owner.backlog >= self.max_buffered and not owner.paused:
            consumer.pause(tp)
            owner.paused = True

    async def _step_past_unreadable(self, consumer: AIOKafkaConsumer, error: Exception) -> None:
        """aiokafka could not parse a fetched record (a header name that is not UTF-8, a
        bad CRC): it raises from `getmany` on every try without naming the partition, and
        drops the records it had read for every partition in that call. So: rewind every
        partition to the record its worker expects next, then read each one record at a
        time; the offset from which reading fails, when reading from one past it works, is
        the unreadable record's, which goes to its worker as an `UnreadableRecord` (and so
        to the dead-letter topic, in offset order, then committed)."""
        logger.warning("a fetched record cannot be read (%s): reading one at a time", error)
        for tp, worker in list(self._workers.items()):
            with contextlib.suppress(IllegalStateError):
                if worker.next_offset >= 0:
                    consumer.seek(tp, worker.next_offset)
                    continue
                # Nothing queued yet: where this member started, the group's offset.
                committed = (await consumer.seek_to_committed(tp)).get(tp)
                if committed == 0:
                    consumer.seek(tp, 0)
                elif committed is None and self._reset_earliest:
                    await consumer.seek_to_beginning(tp)
        for tp in list(self._workers):
            await self._read_carefully(consumer, tp)

    async def _read_carefully(self, consumer: AIOKafkaConsumer, tp: TopicPartition) -> None:
        """Read `tp` one record at a time, up to `max_buffered` records or its end."""
        failed: list[int] = []
        reason = ""
        for _ in range(self.max_buffered + 1):
            worker = self._workers.get(tp)
            if worker is None or worker.paused or self._stop_requested.is_set():
                return
            try:
                position = await consumer.position(tp)
                try:
                    batches = await consumer.getmany(
                        tp, timeout_ms=_CAREFUL_FETCH_TIMEOUT_MS, max_records=1
                    )
                except _UNREADABLE as exc:
                    failed.append(position)
                    reason = describe(exc)
                    consumer.seek(tp, position + 1)
                    continue
            except IllegalStateError:
                return  # revoked meanwhile
            records = batches.get(tp, [])
            if failed:
                worker.add([UnreadableRecord.at(tp, failed[0], failed[-1], reason)])
                failed = []
            if not records:
                return
            self._hand_out(consumer, tp, records)
        worker = self._workers.get(tp)
        if failed and worker is not None:
            worker.add([UnreadableRecord.at(tp, failed[0], failed[-1], reason)])

    async def _process(self, record: ConsumerRecord[bytes, bytes], stopping: asyncio.Event) -> bool:
        assert self._processor is not None
        outcome = await self._processor.process(record, stopping)
        self.outcomes[outcome.value] += 1
        self.metrics.records.labels(self.topic, self.group_id, outcome.value).inc()
        return outcome is not Outcome.INTERRUPTED

    def _mark_done(self, tp: TopicPartition, next_offset: int) -> None:
        self._done[tp] = next_offset
        self._to_commit.set()

    # -- commits and rebalances ---------------------------------------------------------

    async def _commit_continuously(self) -> None:
        """Commit what is done soon after it is, at most once per `commit_interval`."""
        while True:
            await self._to_commit.wait()
            self._to_commit.clear()
            await self._commit()
            await asyncio.sleep(self.commit_interval.total_seconds())  # a rate limit only

    async def _commit(self, partitions: Collection[TopicPartition] | None = None) -> None:
        """Commit the next offset after the last done record of each (or each given)
        partition; the records before it on that partition are all done too."""
        consumer = self._consumer
        if consumer is None:
            return
        async with self._commit_lock:
            assigned = consumer.assignment()
            offsets = {
                tp: offset
                for tp, offset in self._done.items()
                if (partitions is None or tp in partitions)
                and tp in assigned
                and self._committed.get(tp) != offset
            }
            if not offsets:
                return
            try:
                await consumer.commit(offsets)
            except (KafkaError, IllegalStateError) as exc:
                logger.warning(
                    "could not commit %s (%s): those events will be delivered again", offsets, exc
                )
                return
            self._committed.update(offsets)

    async def _revoked(self, revoked: set[TopicPartition]) -> None:
        """Before a rebalance hands `revoked` to others: finish, commit, forget them.

        The workers leave `_workers` before anything is awaited, so the fetch loop hands them
        nothing more; records they had queued but not handled are simply not committed."""
        workers = [self._workers.pop(tp) for tp in revoked if tp in self._workers]
        await asyncio.gather(*(worker.stop() for worker in workers))
        await self._commit(revoked)
        for tp in revoked:
            self._done.pop(tp, None)
            self._committed.pop(tp, None)

    def _assigned(self, assigned: set[TopicPartition]) -> None:
        """After a rebalance: one worker per partition, starting at its committed offset."""
        if self._stop_requested.is_set():
            return  # stopping: nothing more will be handed out
        for tp in assigned:
            if tp not in self._workers:
                self._workers[tp] = PartitionWorker(tp, self._process, self._mark_done)

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        """SIGTERM and SIGINT stop gracefully; a second one cancels `run` outright."""
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(signum, self._on_signal, signum)
                except (NotImplementedError, RuntimeError):  # pragma: no cover - not on Unix
                    continue
                installed.append(signum)
        try:
            yield
        finally:
            for signum in installed:
                loop.remove_signal_handler(signum)

    def _on_signal(self, signum: signal.Signals) -> None:
        if not self._stop_requested.is_set():
            logger.info("%s: finishing the events in progress, then stopping", signum.name)
            self.stop()
        elif self._run_task is not None:
            logger.warning("%s again: stopping at once", signum.name)
            self._run_task.cancel()


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Commits what is done before partitions move, so the next owner starts right after."""

    def __init__(self, events: FileEvents) -> None:
        self._events = events

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._events._revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._events._assigned(assigned)
