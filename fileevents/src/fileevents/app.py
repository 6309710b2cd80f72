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
from aiokafka.errors import (
    CorruptRecordException,
    IllegalStateError,
    KafkaError,
    UnsupportedCodecError,
)
from aiokafka.structs import ConsumerRecord

from fileevents import localstack
from fileevents.codec import UnreadableRecord
from fileevents.deadletter import DeadLetterWriter, describe
from fileevents.dedupe import AnyDedupeStore, batching, check_store, store_name
from fileevents.errors import WAIT_TIMEOUT, OnError, log_failure
from fileevents.kafka_settings import KafkaAccessError, KafkaSettings, check_access
from fileevents.metrics import FileEventsMetrics, serve
from fileevents.partition import (
    Dispatcher,
    PartitionState,
    decode_finished,
)
from fileevents.processing import EventProcessor, Outcome
from fileevents.registry import H, Registry, Selector, check_timeout, handler_name
from fileevents.retry import RetryPolicy

logger = logging.getLogger("fileevents")

_FIXED_CONSUMER_SETTINGS = frozenset(
    {"bootstrap_servers", "group_id", "enable_auto_commit", "isolation_level"}
)
_FIXED_PRODUCER_SETTINGS = frozenset({"bootstrap_servers", "acks", "enable_idempotence"})
_FETCH_TIMEOUT_MS = 200
_FETCH_MAX_RECORDS = 500
"""The most records one fetch hands out (over every partition): with `Dispatcher.full`, what
bounds the records the loop holds."""
_HOLD_BACK_MAX_S = 10.0
"""The longest the fetch loop waits for room before fetching anyway: a `getmany` at least
this often keeps the member in its group (`max_poll_interval_ms`), however slow the handlers."""
MISSING_TOPIC_EVERY_S = 5.0
"""While the topic does not exist: one log line naming it this often (checked every second)."""
_CAREFUL_FETCH_TIMEOUT_MS = 1000
_UNREADABLE = (CorruptRecordException, UnicodeDecodeError, UnsupportedCodecError)
"""What `getmany` raises for a record it cannot parse: aiokafka's Python record reader wraps
the cause in `CorruptRecordException`, its C reader lets a `UnicodeDecodeError` out; a batch
compressed with a codec whose Python library is not installed (lz4, zstd, snappy are
optional for aiokafka) raises `UnsupportedCodecError`: whoever may write the topic could
otherwise stop every consumer with one such record."""


DEFAULT_MAX_CONCURRENCY = 64
"""How many events run at once by default (over every partition; never two of one key):
enough for handlers that wait on I/O, few enough for a database's connection pool."""

DEFAULT_HANDLER_TIMEOUT = timedelta(seconds=60)
"""How long one handler run may take unless said otherwise: well under the consumer's
`max_poll_interval_ms` (300 s), past which the group would evict this member."""


def _connection(
    bootstrap_servers: str | list[str] | None, kafka: KafkaSettings | None
) -> KafkaSettings:
    """`kafka`, else the `KAFKA_*` environment variables with `bootstrap_servers` winning;
    with neither an address nor KAFKA_BOOTSTRAP_SERVERS, the running `make run` stack's
    Kafka, else 127.0.0.1:9092 (KafkaSettings' default)."""
    import os

    servers = (
        ",".join(bootstrap_servers) if isinstance(bootstrap_servers, list) else bootstrap_servers
    )
    if kafka is not None:
        if servers is not None and servers != kafka.bootstrap_servers:
            raise ValueError("FileEvents: give bootstrap_servers or kafka, not both")
        return kafka
    if servers is None and not os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        # Nothing says where Kafka is: the stack `make run` started, wherever its ports are
        # (fileevents.localstack), else the local broker's address, 127.0.0.1:9092.
        stack = localstack.belongs_to(os.environ)
        if stack is not None:
            logger.info(
                "Kafka at %s: the stack `make run` started (%s)",
                stack.bootstrap,
                localstack.stack_file(),
            )
            return KafkaSettings.from_environ({**stack.kafka, **os.environ})
    return KafkaSettings.from_environ(bootstrap_servers=servers)


def default_topic(instance: str) -> str:
    """The stream's output topic of `instance`."""
    return f"files.events.{instance}"


class FileEvents:
    """Register handlers with `on`, then `await run()`.

    `group_id` and `instance` (or an explicit `topic`) are required, and where Kafka is:
    `kafka=KafkaSettings(...)` (fileevents.kafka_settings: address, TLS, SASL), or
    `bootstrap_servers` with TLS and SASL from the `KAFKA_*` environment variables the rest
    of the product reads (`KAFKA_SECURITY_PROTOCOL`, `KAFKA_SASL_USERNAME`, ...), or those
    variables alone (`KAFKA_BOOTSTRAP_SERVERS`); with none of them, the stack `make run` runs,
    else 127.0.0.1:9092. Refused credentials or an untrusted
    certificate make `run()` raise `KafkaAccessError`, one line naming the setting.
    `dedupe`: an optional `DedupeStore`, ids kept for `dedupe_ttl`, each under its consumer
    group and provider scope; for `dedupe_legacy_window` (default `dedupe_ttl`; 0: never)
    after `run()` starts, an id not found is also looked up as recorded before scopes
    (fileevents.dedupe, fileevents/README.md "Upgrading"). `on_error`: called for
    every failure (default: log it). `retry`: attempts and backoff before an event is
    dead-lettered to `dead_letter_topic` (default `<topic>.dead-letter`). `commit_interval`:
    the shortest time between two offset commits. `max_buffered`: records of a partition
    handed out and not yet behind its commit point before fetching it pauses.
    `max_concurrency`: how many events run at once, over every partition, never two of one
    key (fileevents.partition). `handler_timeout`: how long one handler run may
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
        dedupe: AnyDedupeStore | None = None,
        dedupe_ttl: timedelta = timedelta(hours=24),
        dedupe_legacy_window: timedelta | None = None,
        on_error: OnError = log_failure,
        retry: RetryPolicy | None = None,
        dead_letter_topic: str | None = None,
        commit_interval: timedelta = timedelta(seconds=1),
        max_buffered: int = 1000,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
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
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int):
            raise TypeError(f"max_concurrency must be an int, got {type(max_concurrency).__name__}")
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
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
        if dedupe is not None:
            batching(dedupe)  # a TypeError now, naming what a store needs
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
        self.max_concurrency = max_concurrency
        self.handler_timeout = handler_timeout
        self.metrics = metrics or FileEventsMetrics()
        """The Prometheus collector of this consumer (see fileevents/metrics.py)."""
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.handle_signals = handle_signals
        self.consumer_config = dict(consumer_config or {})
        self.producer_config = dict(producer_config or {})
        self.outcomes: Counter[str] = Counter()
        """How many records ended each way (`Outcome` values), since this object exists;
        `fileevents_records_total` is counted from it."""
        self.metrics.follow_outcomes(self.topic, self.group_id, self.outcomes)
        self._registry = Registry()
        self._running = False
        self._stop_requested = asyncio.Event()
        self._run_task: asyncio.Task[Any] | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._processor: EventProcessor | None = None
        self._partitions: dict[TopicPartition, PartitionState] = {}
        self._dispatcher: Dispatcher | None = None
        self._committed: dict[TopicPartition, tuple[int, str]] = {}
        self._commit_lock = asyncio.Lock()
        self._to_commit = asyncio.Event()
        self._released = asyncio.Event()
        """Set when a held partition may be fetched again (`_mark_done`)."""
        self._polled_at = 0.0
        """When (loop time) `getmany` was last called."""
        self._reset_earliest = True

    # -- registration -------------------------------------------------------------------

    def on(self, selector: Selector = "*", *, timeout: timedelta | None = None) -> Callable[[H], H]:
        """Decorator: run the handler for events of type `selector` (`created`, `deleted`,
        or `*` for all). Handlers are `async def handler(event)` or
        `async def handler(event, context)`; the context is an `EventContext`.
        `timeout`: how long one run may take (default: `handler_timeout`); past it the
        handler is cancelled and the run counts as failed (retried, then dead-lettered).

        Used without parentheses (`@events.on`), it raises `TypeError` naming the fix: the
        function would otherwise be taken for the selector and never run."""
        if callable(selector):
            name = handler_name(selector)
            raise TypeError(
                f'@events.on needs parentheses: write @events.on("*") (every event) or '
                f'@events.on("created") / @events.on("deleted") above {name}'
            )
        if not isinstance(selector, str):
            raise TypeError(f"on(selector): expected 'created', 'deleted' or '*', got {selector!r}")
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
        return frozenset(self._partitions)

    # -- running ------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask `run` to stop gracefully: fetch no more, finish the events in progress (their
        current attempt), commit, return. Safe to call from a signal handler on the loop."""
        self._stop_requested.set()
        for state in self._partitions.values():
            state.stopping.set()  # at once: no event starts after this call

    async def run(self) -> None:
        """Consume until `stop()`, SIGTERM or SIGINT (graceful), or cancellation (abrupt:
        handlers in progress are cancelled and their events stay uncommitted)."""
        if self._running:
            raise RuntimeError("FileEvents.run is already running")
        if not len(self._registry):
            raise RuntimeError("no handler registered: use @events.on(...) before run()")
        self._running = True
        self._to_commit = asyncio.Event()
        self._released = asyncio.Event()
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
            with contextlib.suppress(*WAIT_TIMEOUT):
                await asyncio.wait_for(self._stop_requested.wait(), 1.0)
            if self._stop_requested.is_set():
                return False
        return True

    async def _consume(self, consumer: AIOKafkaConsumer) -> None:
        committer = asyncio.create_task(self._commit_continuously(), name="fileevents:commit")
        processor = self._processor
        assert processor is not None
        processor.on_outcome = self._count
        dispatcher = Dispatcher(
            processor.run,
            self._mark_done,
            self.max_concurrency,
            self._skipped,
            processor.prepare,
            self._recorded,
        )
        processor.on_recorded = dispatcher.recorded
        self._dispatcher = dispatcher
        graceful = False
        try:
            await self._fetch(consumer, committer, dispatcher)
            graceful = True
        finally:
            committer.cancel()
            await asyncio.wait([committer])
            states = list(self._partitions.values())
            self._partitions.clear()
            if graceful:
                await dispatcher.drain(states)
            for state in states:
                state.stopping.set()
            await dispatcher.close()  # cancels what still runs (not graceful)
            await processor.close()  # dedupe writes not acknowledged by now stay uncommitted
            self._dispatcher = None
            await self._commit(states)
            self._committed.clear()
            self.metrics.in_flight.labels(self.topic, self.group_id).set(0)

    async def _fetch(
        self, consumer: AIOKafkaConsumer, committer: asyncio.Task[None], dispatcher: Dispatcher
    ) -> None:
        """Fetch and hand records to the dispatcher until asked to stop."""
        in_flight = self.metrics.in_flight.labels(self.topic, self.group_id)
        loop = asyncio.get_running_loop()
        fetched_at = loop.time()
        while not self._stop_requested.is_set():
            if committer.done():
                raise RuntimeError("the commit task ended") from committer.exception()
            crash = dispatcher.crash()
            if crash is not None:
                raise RuntimeError("a handler task crashed") from crash
            in_flight.set(dispatcher.in_flight)
            for state in self._partitions.values():
                if state.paused and state.backlog <= self.max_buffered // 2:
                    state.paused = False
                self._lag(consumer, state)
            if dispatcher.full() and loop.time() - fetched_at < _HOLD_BACK_MAX_S:
                # Enough records can start: fetch once half of them have.
                with contextlib.suppress(*WAIT_TIMEOUT):
                    await asyncio.wait_for(dispatcher.room.wait(), _FETCH_TIMEOUT_MS / 1000)
                continue
            fetched_at = loop.time()
            try:
                batches = await self._fetch_open(consumer)
            except _UNREADABLE as exc:
                await self._step_past_unreadable(consumer, exc)
                continue
            for tp, records in batches.items():
                self._hand_out(consumer, tp, records)

    async def _fetch_open(
        self, consumer: AIOKafkaConsumer
    ) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
        """Fetched records of the partitions not held back (`PartitionState.paused`).

        A partition at its `max_buffered` is held rather than paused in aiokafka: pausing
        drops the records aiokafka already fetched for it (refetched from the broker after
        `resume`, the consumer waiting for them), while a held partition's stay in
        aiokafka's buffer (one fetch response at most: aiokafka asks for more of a partition
        only once its buffer is drained) and are handed out as soon as it is released. The
        wait for records ends early when a held partition is released meanwhile."""
        partitions = self._partitions
        batches: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]
        if not any(state.paused for state in partitions.values()):
            self._polled_at = asyncio.get_running_loop().time()
            batches = await consumer.getmany(
                timeout_ms=_FETCH_TIMEOUT_MS, max_records=_FETCH_MAX_RECORDS
            )
            return batches
        self._released.clear()
        open_ = [tp for tp, state in partitions.items() if not state.paused]
        if not open_:  # every partition held: wait for one to be released
            loop = asyncio.get_running_loop()
            if loop.time() - self._polled_at >= _HOLD_BACK_MAX_S:
                # A poll, so the member stays in its group (`max_poll_interval_ms`) however
                # slow the handlers: paused, the held partitions hand nothing out.
                held = list(partitions)
                try:
                    consumer.pause(*held)
                    batches = await consumer.getmany(timeout_ms=0, max_records=1)
                except IllegalStateError:  # one was revoked meanwhile: the rebalance polls
                    batches = {}
                finally:
                    for tp in held:
                        with contextlib.suppress(IllegalStateError):
                            consumer.resume(tp)
                self._polled_at = loop.time()
                return batches
            with contextlib.suppress(*WAIT_TIMEOUT):
                await asyncio.wait_for(self._released.wait(), _FETCH_TIMEOUT_MS / 1000)
            return {}
        self._polled_at = asyncio.get_running_loop().time()
        released = asyncio.ensure_future(self._released.wait())
        fetch = asyncio.ensure_future(
            consumer.getmany(*open_, timeout_ms=_FETCH_TIMEOUT_MS, max_records=_FETCH_MAX_RECORDS)
        )
        try:
            await asyncio.wait([fetch, released], return_when=asyncio.FIRST_COMPLETED)
        finally:
            released.cancel()
            if not fetch.done():
                fetch.cancel()  # waiting for records: none taken yet
                await asyncio.wait([fetch])
        if fetch.cancelled():
            return {}
        batches = fetch.result()
        return batches

    def _hand_out(
        self,
        consumer: AIOKafkaConsumer,
        tp: TopicPartition,
        records: list[ConsumerRecord[bytes, bytes]],
    ) -> None:
        owner = self._partitions.get(tp)
        dispatcher = self._dispatcher
        if owner is None or dispatcher is None:
            # Assigned but not announced yet, or being revoked: not ours to handle
            # now. Fetch them again later rather than skip them.
            with contextlib.suppress(IllegalStateError):
                consumer.seek(tp, records[0].offset)
            return
        dispatcher.add(owner, records)
        if owner.backlog >= self.max_buffered:
            owner.paused = True  # held: not fetched from aiokafka's buffer (`_fetch_open`)

    def _lag(self, consumer: AIOKafkaConsumer, state: PartitionState) -> None:
        """The partition's lag: records up to its last stable offset not done with yet."""
        end = consumer.last_stable_offset(state.tp)
        if end is None or end < 0:
            end = consumer.highwater(state.tp)
        point = state.commit_point()
        if end is None or point is None:
            return
        self.metrics.lag.labels(self.topic, self.group_id, str(state.tp.partition)).set(
            max(0, end - point)
        )

    async def _step_past_unreadable(self, consumer: AIOKafkaConsumer, error: Exception) -> None:
        """aiokafka could not parse a fetched record (a header name that is not UTF-8, a
        bad CRC): it raises from `getmany` on every try without naming the partition, and
        drops the records it had read for every partition in that call. So: rewind every
        partition to the record its worker expects next, then read each one record at a
        time; the offset from which reading fails, when reading from one past it works, is
        the unreadable record's, which goes to its worker as an `UnreadableRecord` (and so
        to the dead-letter topic, in offset order, then committed)."""
        logger.warning("a fetched record cannot be read (%s): reading one at a time", error)
        for tp, state in list(self._partitions.items()):
            with contextlib.suppress(IllegalStateError):
                if state.next_offset >= 0:
                    consumer.seek(tp, state.next_offset)
                    continue
                # Nothing queued yet: where this member started, the group's offset.
                committed = (await consumer.seek_to_committed(tp)).get(tp)
                if committed == 0:
                    consumer.seek(tp, 0)
                elif committed is None and self._reset_earliest:
                    await consumer.seek_to_beginning(tp)
        for tp in list(self._partitions):
            await self._read_carefully(consumer, tp)

    async def _read_carefully(self, consumer: AIOKafkaConsumer, tp: TopicPartition) -> None:
        """Read `tp` one record at a time, up to `max_buffered` records or its end."""
        failed: list[int] = []
        reason = ""
        for _ in range(self.max_buffered + 1):
            state = self._partitions.get(tp)
            if state is None or state.paused or self._stop_requested.is_set():
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
                self._hand_out(
                    consumer, tp, [UnreadableRecord.at(tp, failed[0], failed[-1], reason)]
                )
                failed = []
            if not records:
                return
            self._hand_out(consumer, tp, records)
        if failed and tp in self._partitions:
            self._hand_out(consumer, tp, [UnreadableRecord.at(tp, failed[0], failed[-1], reason)])

    def _recorded(self, records: int) -> None:
        self._count(Outcome.HANDLED, records)

    def _count(self, outcome: Outcome, records: int = 1) -> None:
        self.outcomes[outcome._value_] += records  # `.value` is a property: slower

    def _skipped(self, records: int) -> None:
        self._count(Outcome.DONE_BEFORE, records)

    def _mark_done(self, state: PartitionState) -> None:
        self._to_commit.set()
        if state.paused and state.backlog <= self.max_buffered // 2:
            # At once, not at the fetch loop's next turn: it may be waiting for records of
            # the other partitions (`_fetch_open`).
            state.paused = False
            self._released.set()

    # -- commits and rebalances ---------------------------------------------------------

    async def _commit_continuously(self) -> None:
        """Commit what is done soon after it is, at most once per `commit_interval`."""
        while True:
            await self._to_commit.wait()
            self._to_commit.clear()
            await self._commit()
            await asyncio.sleep(self.commit_interval.total_seconds())  # a rate limit only

    async def _commit(self, states: Collection[PartitionState] | None = None) -> None:
        """Commit, for each partition (or each of `states`), the lowest offset not done with
        yet, with the offsets done above it in the commit's metadata (fileevents.partition)."""
        consumer = self._consumer
        if consumer is None:
            return
        async with self._commit_lock:
            assigned = consumer.assignment()
            offsets: dict[TopicPartition, tuple[int, str]] = {}
            for state in self._partitions.values() if states is None else states:
                point = state.commit_point()
                if point is None or state.tp not in assigned:
                    continue
                commit = (point, state.metadata())
                if self._committed.get(state.tp) != commit:
                    offsets[state.tp] = commit
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

        The partitions leave `_partitions` before anything is awaited, so the fetch loop
        hands them nothing more; records queued but not started are simply not committed."""
        states = [self._partitions.pop(tp) for tp in revoked if tp in self._partitions]
        if self._dispatcher is not None:
            await self._dispatcher.drain(states)
        await self._commit(states)
        for tp in revoked:
            self._committed.pop(tp, None)
            with contextlib.suppress(KeyError):
                self.metrics.lag.remove(self.topic, self.group_id, str(tp.partition))

    async def _assigned(self, assigned: set[TopicPartition]) -> None:
        """After a rebalance: the new partitions, each starting at its committed offset and
        skipping the offsets its commit metadata records as done (fileevents.partition)."""
        if self._stop_requested.is_set():
            return  # stopping: nothing more will be handed out
        new = [tp for tp in assigned if tp not in self._partitions]
        done_before = await self._done_before(new)
        for tp in new:
            if tp not in self._partitions:
                self._partitions[tp] = PartitionState(tp, done_before.get(tp))

    async def _done_before(
        self, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, set[int]]:
        """Per partition, the offsets above its committed one that its commit's metadata
        records as done with; nothing where it cannot be read (then they run again)."""
        consumer = self._consumer
        coordinator = getattr(consumer, "_coordinator", None)  # aiokafka has no public call
        if not partitions or coordinator is None:
            return {}
        try:
            committed = await coordinator.fetch_committed_offsets(partitions)
        except Exception as exc:  # at least once still holds: they are run again
            logger.warning("could not read the commit metadata of %s (%s)", partitions, exc)
            return {}
        found: dict[TopicPartition, set[int]] = {}
        for tp, offset_and_metadata in committed.items():
            offsets = decode_finished(offset_and_metadata.offset, offset_and_metadata.metadata)
            if offsets:
                found[tp] = offsets
        return found

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
        await self._events._assigned(assigned)
