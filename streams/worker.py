"""The Faust application (`faust -A streams worker`): two batch stages, one state store.

    raw topics --normalize--> repartition topic (key = instance/bucket/key) --emit--> outputs

`normalize` parses each delivery, applies each instance's rules and repartitions by
(instance, bucket, key); `emit` dedupes and orders per key with co-partitioned state
(streams.store) and writes the output, stale and dead-letter topics. Faust runs the process
(start-up, signals, the web server for /metrics and /ready, the sweeper timer); the stages
consume with their own aiokafka group members in batches (streams.consuming), because Faust's
per-event stream machinery costs several times the work itself (BENCHMARKS.md).

Guarantees: `normalize` commits its input offsets after Kafka acknowledged the batch's keyed
and dead-letter records (at least once; a repeat is a duplicate the emit stage drops).
`emit` with `exactly_once` (the default) commits each input partition's outputs, changelog
records and offsets in one transaction (streams.transactions); with `at_least_once` it writes
outputs, then the changelog, then commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from streams import failpoints, metrics
from streams.config import ConfigError, Settings, load_settings
from streams.consuming import Batch, BatchLoop
from streams.emitting import (
    MARKS,
    SEEN,
    EmitPlan,
    KeyedInput,
    PendingState,
    decode_expiry,
    plan_batch,
)
from streams.offsets import adopt_committed_offsets
from streams.records import RawRecord, header_text, headers_dict
from streams.routing import route
from streams.sending import RecordSender
from streams.store import SWEEP_FLUSH_KEYS, StateStore
from streams.topics import MARKS_TABLE, SEEN_TABLE, changelog_topic, ensure_topics, topology
from streams.transactions import PartitionTransactions

log = logging.getLogger(__name__)

SWEEP_LIMIT = 50_000
MAX_PARTS_IN_FLIGHT = 2
"""Per partition: emit parts planned ahead while earlier ones are written."""
STOP_GRACE_S = 30.0
"""How long a stopping worker waits for each stage's batch in flight."""


def _load() -> Settings:
    try:
        return load_settings()
    except ConfigError as exc:
        # A configuration mistake stops start-up with one line naming the field.
        print(f"storage-events: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _check_data_dir(path: Path) -> None:
    """The RocksDB state directory must be a writable directory. Say so in one line and
    stop (exit 2) rather than failing deep inside RocksDB with a traceback."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        print(
            f"storage-events: the state directory {str(path)!r} (STREAMS_DATA_DIR, "
            f"stream.data_dir) is not a writable directory: {exc.strerror or exc}",
            file=sys.stderr,
        )
        raise SystemExit(2) from None


settings = _load()
_check_data_dir(settings.stream.data_dir)


def _consumer(group_id: str, member: str) -> AIOKafkaConsumer:
    stream = settings.stream
    return AIOKafkaConsumer(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        client_id=f"{stream.app_id}-{member}",
        group_id=group_id,
        group_instance_id=(
            f"{stream.group_instance_id}-{member}" if stream.group_instance_id else None
        ),
        session_timeout_ms=int(stream.session_timeout_s * 1000),
        heartbeat_interval_ms=int(stream.session_timeout_s * 1000 / 5),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )


@dataclass(slots=True)
class _Part:
    """One partition's share of an emit batch, planned, until its state is applied."""

    plan: EmitPlan
    done: asyncio.Future[None] = field(init=False)


class Pipeline:
    """The two stages, their producers and the state store of one worker."""

    def __init__(self, stop_on_failure: Callable[[str, BaseException], Awaitable[None]]) -> None:
        stream = settings.stream
        self.stop_on_failure = stop_on_failure
        """Called with the stage's name when work running outside a stage's loop fails."""
        self.normalize_group = f"{stream.app_id}-normalize"
        self.emit_group = f"{stream.app_id}-emit"
        self.sender = RecordSender(settings.kafka.bootstrap_servers, f"{stream.app_id}-sender")
        self.transactions = (
            PartitionTransactions(settings.kafka.bootstrap_servers, stream.app_id, self.emit_group)
            if stream.processing_guarantee == "exactly_once"
            else None
        )
        self.store = StateStore(
            stream.data_dir / f"{stream.app_id}-state",
            {
                SEEN: changelog_topic(settings, SEEN_TABLE),
                MARKS: changelog_topic(settings, MARKS_TABLE),
            },
        )
        self._emitting: dict[int, list[_Part]] = {}
        """Per partition, the emit parts planned but not yet in the local state, oldest first."""
        within_ms = int(stream.batch_within_s * 1000)
        self.normalize = BatchLoop(
            "normalize",
            _consumer(self.normalize_group, "normalize"),
            [topic.name for topic in stream.raw_topics],
            self.handle_raw_batch,
            commits_offsets=True,
            max_records=stream.batch_size,
            within_ms=within_ms,
        )
        self.emit = BatchLoop(
            "emit",
            _consumer(self.emit_group, "emit"),
            [stream.repartition_topic],
            self.handle_keyed_batch,
            commits_offsets=self.transactions is None,
            max_records=stream.batch_size,
            within_ms=within_ms,
            on_assigned=self.restore,
            drain=self.drain_emits,
        )

    @property
    def ready(self) -> bool:
        return self.normalize.ready and self.emit.ready

    async def start(self) -> None:
        await self.sender.start()
        for group, loop in ((self.normalize_group, self.normalize), (self.emit_group, self.emit)):
            await _adopt_offsets(group, loop.topics)
            await _start_consumer(loop.consumer)

    async def stop(self) -> None:
        for loop in (self.normalize, self.emit):
            await loop.consumer.stop()
        if self.transactions is not None:
            await self.transactions.stop()
        await self.sender.stop()
        self.store.close()

    async def restore(self, assigned: set[TopicPartition]) -> None:
        """Before the emit stage handles a partition: fence its earlier owner (exactly_once),
        then bring its state up to the end of the changelog."""
        partitions = {tp.partition for tp in assigned}
        if self.transactions is not None:
            await self.transactions.prepare(partitions)
        delay = 0.5
        while True:
            try:
                restored = await self.store.restore(
                    settings.kafka.bootstrap_servers, partitions, {SEEN: decode_expiry}
                )
                break
            except KafkaError as exc:  # Kafka away: what was applied stays, the rest is read again
                log.warning("restoring state failed (%r); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        log.info(
            "state of %d partitions restored: %d changelog records in %.2f s",
            restored.partitions,
            restored.records,
            restored.seconds,
        )

    async def handle_raw_batch(self, batch: Batch) -> None:
        """Normalize and repartition one batch of raw deliveries."""
        records = []
        received: Counter[str] = Counter()
        normalized: Counter[str] = Counter()
        filtered: Counter[tuple[str, str]] = Counter()
        for tp, messages in batch.items():
            default_source = settings.stream.default_source(tp.topic)
            for message in messages:
                raw = RawRecord(tp.topic, message.value or b"", headers_dict(message.headers))
                routed = route(raw, message.key, settings)
                source = header_text(raw.headers, "source") or default_source or "?"
                received[source] += 1
                normalized[source] += routed.events
                filtered.update(routed.filtered)
                if routed.dead_letter_reason is not None:
                    metrics.DEAD_LETTERED.labels("normalize").inc()
                    log.warning(
                        "dead-lettered a delivery from %s[%d]@%d: %s",
                        tp.topic,
                        tp.partition,
                        message.offset,
                        routed.dead_letter_reason,
                    )
                records.extend(routed.records)
        for source, count in received.items():
            metrics.RECEIVED.labels(source).inc(count)
            metrics.NORMALIZED.labels(source).inc(normalized[source])
        for (instance, reason), count in filtered.items():
            metrics.FILTERED.labels(instance, reason).inc(count)
        await self.sender.send_all(records)

    async def handle_keyed_batch(self, batch: Batch) -> None:
        """Dedupe, order and emit one batch of keyed events, per input partition.

        Each partition's part is planned at once, against its state as the parts still in
        flight will leave it, then written by a task that waits for the partition's previous
        part: the next batch is fetched and planned while Kafka still works on this one
        (a part in flight either commits, retrying, or the worker stops). With
        at_least_once the loop commits the offsets once this returns, so every part has
        finished by then."""
        now = time.time()
        for tp, messages in batch.items():
            if not messages:
                continue
            inputs = [
                KeyedInput(
                    tp.topic,
                    tp.partition,
                    message.key,
                    message.value or b"",
                    headers_dict(message.headers),
                    message.offset,
                )
                for message in messages
            ]
            in_flight = self._emitting.setdefault(tp.partition, [])
            while len(in_flight) >= MAX_PARTS_IN_FLIGHT:
                await in_flight[0].done
            pending = [part.plan for part in in_flight]
            plan = plan_batch(inputs, settings, PendingState(self.store, pending), now)
            previous = in_flight[-1].done if in_flight else None
            part = _Part(plan)
            in_flight.append(part)
            part.done = asyncio.ensure_future(self._write(part, inputs, tp, previous))
        if self.transactions is None:
            await self.drain_emits()

    async def drain_emits(self) -> None:
        """Wait for every part in flight; raise the first that failed."""
        parts = [part.done for in_flight in self._emitting.values() for part in in_flight]
        results = await asyncio.gather(*parts, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _write(
        self,
        part: _Part,
        inputs: Sequence[KeyedInput],
        tp: TopicPartition,
        previous: asyncio.Future[None] | None,
    ) -> None:
        """Write a planned part's outputs and changelog (in one transaction for
        exactly_once), then its local state."""
        try:
            if previous is not None:
                await previous  # its failure is this part's too: the partition stops here
            plan = part.plan
            changelog_records = self.store.changelog_records(plan.writes)
            if self.transactions is not None:
                offsets = {tp: inputs[-1].offset + 1}
                written = await self.transactions.commit(
                    tp.partition, [*plan.outputs, *changelog_records], offsets
                )
                failpoints.reached("after-output")
            else:
                await self.sender.send_all(plan.outputs)
                failpoints.reached("after-output")
                written = await self.sender.send_all(changelog_records)
            acknowledged_at = time.time()
            self.store.apply(plan.writes, written)
            self._emitting[tp.partition].remove(part)
            for (instance, outcome), count in plan.outcomes.items():
                if outcome == "dead_letter":
                    metrics.DEAD_LETTERED.labels("emit").inc(count)
                else:
                    metrics.OUTCOME_COUNTERS[outcome].labels(instance).inc(count)
            for instance, received_at in plan.received_at:
                with contextlib.suppress(ValueError):  # a bridge's unreadable received-at header
                    metrics.LATENCY.labels(instance).observe(acknowledged_at - float(received_at))
        except Exception as exc:
            # Nobody awaits this task before the next batch of its partition, which may
            # never come: stop the worker now, as a failing stage loop does.
            await self.stop_on_failure("emit", exc)
            raise

    async def sweep(self, now: float) -> None:
        """Forget dedupe entries past their TTL, locally and (by tombstones) in the changelog."""
        writes: dict[tuple[str, int], dict[bytes, bytes | None]] = {}
        for partition in self.store.partitions():
            expired = list(self.store.expired(SEEN, partition, now, SWEEP_LIMIT, decode_expiry))
            if expired:
                writes[(SEEN, partition)] = dict.fromkeys(expired)
        if not writes:
            return
        written = await self.sender.send_all(self.store.changelog_records(writes))
        self.store.apply(writes, written)
        for (table, partition), keys in writes.items():
            if len(keys) >= SWEEP_FLUSH_KEYS:
                self.store.flush(table, partition)
        metrics.EXPIRED.inc(sum(len(keys) for keys in writes.values()))


async def _adopt_offsets(group: str, topics: list[str]) -> None:
    """A stage group's first start after an upgrade from the Faust agents: streams.offsets."""
    delay = 0.5
    while True:
        try:
            await adopt_committed_offsets(
                settings.kafka.bootstrap_servers, settings.stream.app_id, group, topics
            )
            return
        except KafkaError as exc:
            log.warning("reading committed offsets failed (%r); retrying in %.1f s", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


async def _start_consumer(consumer: AIOKafkaConsumer) -> None:
    delay = 0.5
    while True:
        try:
            await consumer.start()
            return
        except Exception as exc:  # aiokafka raises several kinds while Kafka is away
            log.warning("consumer cannot reach Kafka (%r); retrying in %.1f s", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


class StreamsApp(faust.App):
    """A Faust app that creates the stream's topics before anything else starts."""

    async def on_first_start(self) -> None:
        # Retries (and says so) while Kafka is unreachable: a worker started before its
        # broker waits for it.
        created = await ensure_topics(settings.kafka.bootstrap_servers, topology(settings))
        if created:
            log.info("created topics: %s", ", ".join(created))
        await super().on_first_start()


app = StreamsApp(
    settings.stream.app_id,
    broker=[f"kafka://{host.strip()}" for host in settings.kafka.bootstrap_servers.split(",")],
    datadir=str(settings.stream.data_dir),
    web_port=settings.stream.web_port,
    web_host="0.0.0.0",
    consumer_auto_offset_reset="earliest",
    # Faust's own consumer reads nothing, but the worker starts the stages only once it has
    # joined its group: static membership and a short session let a restarted worker rejoin
    # at once instead of waiting out its previous life's session.
    consumer_group_instance_id=settings.stream.group_instance_id,
    broker_session_timeout=settings.stream.session_timeout_s,
    broker_heartbeat_interval=settings.stream.session_timeout_s / 5,
)
running: Pipeline | None = None
"""The worker's pipeline once started (aiokafka clients are made inside the event loop)."""


@app.service
class PipelineService(faust.Service):
    """Runs the two stages as long as the worker runs; a stage failing stops the worker."""

    _failed = False

    async def on_start(self) -> None:
        global running
        running = Pipeline(self._stop_on_failure)
        await running.start()
        self._stages = [
            asyncio.ensure_future(self._run(loop)) for loop in (running.normalize, running.emit)
        ]

    async def on_stop(self) -> None:
        # Let each stage finish the batch in hand (holding its lock keeps the next one out),
        # then stop the stages and their clients. A batch that cannot finish in time (Kafka
        # away) is abandoned uncommitted, so it is read again.
        stages = getattr(self, "_stages", [])
        held = []
        if running is not None:
            for loop in (running.normalize, running.emit):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(loop.lock.acquire(), STOP_GRACE_S)
                    held.append(loop.lock)
            with contextlib.suppress(Exception):  # a failure was logged by its stage
                await asyncio.wait_for(running.drain_emits(), STOP_GRACE_S)
        for stage in stages:
            stage.cancel()
        await asyncio.gather(*stages, return_exceptions=True)
        for lock in held:
            lock.release()  # leaving the group calls the revoke callback, which takes it
        if running is not None:
            await running.stop()

    async def _run(self, loop: BatchLoop) -> None:
        try:
            await loop.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._stop_on_failure(loop.name, exc)
            raise

    async def _stop_on_failure(self, stage: str, exc: BaseException) -> None:
        # A stage never fails on bad input (that is dead-lettered) nor on Kafka being away
        # (that is retried): this is a bug or a broken disk. Stop rather than stall silently.
        if self._failed:
            return
        self._failed = True
        log.error("the %s stage failed; stopping the worker", stage, exc_info=exc)
        await app.crash(exc)


@app.timer(interval=settings.stream.dedupe_sweep_interval_s)  # type: ignore[untyped-decorator]
async def sweep_expired_ids() -> None:
    if running is None:
        return
    # One at a time with the emit stage, so a sweep never deletes an id a batch just recorded.
    async with running.emit.lock:
        if running.emit.ready:
            await running.drain_emits()
            await running.sweep(time.time())


@app.page("/metrics")
async def metrics_page(web: Any, request: Any) -> Any:
    return web.bytes(generate_latest(), content_type=CONTENT_TYPE_LATEST.split(";")[0])


@app.page("/ready")
async def ready_page(web: Any, request: Any) -> Any:
    """200 once both stages have their partitions and the state is restored; 503 before."""
    ready = running is not None and running.ready
    body = {"ready": ready, "tables_recovered": running is not None and running.emit.ready}
    return web.json(body, status=200 if ready else 503)
