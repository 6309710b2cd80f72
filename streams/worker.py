"""The Faust application (`faust -A streams worker`): two agents, two tables, one producer.

    raw topics --normalize_raw--> repartition topic (key = instance/key) --emit_keyed--> outputs

`normalize_raw` parses each delivery, applies each instance's rules and repartitions by
(instance, key); `emit_keyed` dedupes and orders per key with co-partitioned state and writes
the output, stale and dead-letter topics. Both work on batches: a batch's records are sent
together, and its offsets are acknowledged only after Kafka acknowledged all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import faust
from faust.tables.manager import TableManager
from faust.types import TP, EventT
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from streams import failpoints, metrics
from streams.batching import acked_batches
from streams.config import ConfigError, Settings, load_settings
from streams.emitting import MARKS, SEEN, KeyedInput, plan_batch
from streams.records import RawRecord, header_text, headers_dict
from streams.routing import route
from streams.sending import RecordSender
from streams.state import TableState
from streams.topics import MARKS_TABLE, SEEN_TABLE, ensure_topics, topology
from streams.transactions import PartitionTransactions, offsets_after

log = logging.getLogger(__name__)

SWEEP_LIMIT = 50_000


def _load() -> Settings:
    try:
        return load_settings()
    except ConfigError as exc:
        # A configuration mistake stops start-up with one line naming the field.
        print(f"storage-events: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _check_data_dir(path: Path) -> None:
    """The RocksDB state directory must be a writable directory. Say so in one line and
    stop (exit 2) rather than failing deep inside Faust or RocksDB with a traceback."""
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


class StreamsApp(faust.App):
    """A Faust app that creates its topics and starts its producer before consuming."""

    sender: RecordSender
    transactions: PartitionTransactions | None = None

    async def on_first_start(self) -> None:
        created = await ensure_topics(settings.kafka.bootstrap_servers, topology(settings))
        if created:
            log.info("created topics: %s", ", ".join(created))
        self.sender = RecordSender(settings.kafka.bootstrap_servers, f"{self.conf.id}-sender")
        await self.sender.start()
        if settings.stream.processing_guarantee == "exactly_once":
            self.transactions = PartitionTransactions(
                settings.kafka.bootstrap_servers, self.conf.id, group_id=self.conf.id
            )
        await super().on_first_start()

    async def on_shutdown(self) -> None:
        await super().on_shutdown()
        if self.transactions is not None:
            await self.transactions.stop()
        sender = getattr(self, "sender", None)
        if sender is not None:
            await sender.stop()


app = StreamsApp(
    settings.stream.app_id,
    broker=[f"kafka://{host.strip()}" for host in settings.kafka.bootstrap_servers.split(",")],
    store="rocksdb://",  # faust-streaming backs this with rocksdict when installed
    datadir=str(settings.stream.data_dir),
    web_port=settings.stream.web_port,
    web_host="0.0.0.0",
    topic_partitions=settings.stream.partitions,
    topic_replication_factor=settings.stream.replication_factor,
    # Faust's own guarantee stays at_least_once: the emit stage does its own transactions
    # (streams.transactions) when the stream's processing_guarantee is exactly_once.
    processing_guarantee="at_least_once",
    producer_acks=-1,
    consumer_auto_offset_reset="earliest",
    table_standby_replicas=0,
    consumer_group_instance_id=settings.stream.group_instance_id,
    broker_session_timeout=settings.stream.session_timeout_s,
    broker_heartbeat_interval=settings.stream.session_timeout_s / 5,
)

raw_channel = app.topic(
    *[topic.name for topic in settings.stream.raw_topics],
    key_type=bytes,
    value_type=bytes,
    key_serializer="raw",
    value_serializer="raw",
)
keyed_channel = app.topic(
    settings.stream.repartition_topic,
    key_type=bytes,
    value_type=bytes,
    key_serializer="raw",
    value_serializer="raw",
)
tables = {
    # bytes in, bytes out: the changelog carries the stream's own encodings (streams.emitting).
    SEEN: app.Table(
        SEEN_TABLE, partitions=settings.stream.partitions, key_type=bytes, value_type=bytes
    ),
    MARKS: app.Table(
        MARKS_TABLE, partitions=settings.stream.partitions, key_type=bytes, value_type=bytes
    ),
}
state = TableState(tables)
# The sweeper and the emit agent both write the dedupe table; one at a time, so a sweep can
# never delete an entry a batch has just recorded again.
state_lock = asyncio.Lock()


def _raw_record(event: EventT[Any]) -> RawRecord:
    message = event.message
    return RawRecord(message.topic, message.value or b"", headers_dict(message.headers))


async def handle_raw_batch(events: Sequence[EventT[Any]]) -> None:
    """Normalize and repartition one batch of raw deliveries."""
    records = []
    for event in events:
        raw = _raw_record(event)
        routed = route(raw, event.message.key, settings)
        source = header_text(raw.headers, "source") or "?"
        metrics.RECEIVED.labels(source).inc()
        metrics.NORMALIZED.labels(source).inc(routed.events)
        for (instance, reason), count in routed.filtered.items():
            metrics.FILTERED.labels(instance, reason).inc(count)
        if routed.dead_letter_reason is not None:
            metrics.DEAD_LETTERED.labels("normalize").inc()
            log.warning(
                "dead-lettered a delivery from %s[%d]@%d: %s",
                raw.topic,
                event.message.partition,
                event.message.offset,
                routed.dead_letter_reason,
            )
        records.extend(routed.records)
    await app.sender.send_all(records)


async def handle_keyed_batch(events: Sequence[EventT[Any]]) -> None:
    """Dedupe, order and emit one batch of keyed events, then record their state."""
    inputs = [
        KeyedInput(
            event.message.topic,
            event.message.partition,
            event.message.key,
            event.message.value or b"",
            headers_dict(event.message.headers),
            event.message.offset,
        )
        for event in events
    ]
    if app.transactions is None:
        await _emit(inputs, None)
        return
    by_partition: dict[int, list[KeyedInput]] = {}
    for item in inputs:
        by_partition.setdefault(item.partition, []).append(item)
    for partition, items in by_partition.items():
        await _emit(items, partition)


async def _emit(inputs: Sequence[KeyedInput], transaction_partition: int | None) -> None:
    """Plan, then write the outputs (in a transaction for exactly_once), then the state."""
    async with state_lock:
        plan = plan_batch(inputs, settings, state, time.time())
        if transaction_partition is None or app.transactions is None:
            await app.sender.send_all(plan.outputs)
        else:
            last = max(item.offset for item in inputs)
            await app.transactions.commit(
                transaction_partition,
                plan.outputs,
                offsets_after(inputs[0].topic, transaction_partition, last),
            )
        failpoints.reached("after-output")
        acknowledged_at = time.time()
        changelog = state.changelog_records(plan.writes)
        sent = await app.sender.send_all(changelog)
        state.apply_local(plan.writes)
        for record, metadata in zip(changelog, sent, strict=True):
            table = SEEN if record.topic == state.changelog_topic(SEEN) else MARKS
            state.remember_offset(table, metadata.partition, metadata.offset)
    for (instance, outcome), count in plan.outcomes.items():
        if outcome == "dead_letter":
            metrics.DEAD_LETTERED.labels("emit").inc(count)
        else:
            metrics.OUTCOME_COUNTERS[outcome].labels(instance).inc(count)
    for instance, received_at in plan.received_at:
        with contextlib.suppress(ValueError):  # a bridge's unreadable received-at header
            metrics.LATENCY.labels(instance).observe(acknowledged_at - float(received_at))


async def _run_batches(stream: Any, handler: Any, name: str) -> None:
    try:
        async for batch in acked_batches(
            stream, settings.stream.batch_size, settings.stream.batch_within_s
        ):
            await handler(batch)
    except Exception as exc:
        # A handler never raises for bad input (that is dead-lettered) nor for Kafka being
        # away (that is retried): this is a bug. Stop the worker rather than stall silently.
        log.exception("%s failed; stopping the worker", name)
        await app.crash(exc)
        raise


@app.agent(raw_channel)
async def normalize_raw(stream: Any) -> None:
    await _run_batches(stream, handle_raw_batch, "normalize_raw")


@app.agent(keyed_channel)
async def emit_keyed(stream: Any) -> None:
    await _run_batches(stream, handle_keyed_batch, "emit_keyed")


@app.timer(interval=settings.stream.dedupe_sweep_interval_s)  # type: ignore[untyped-decorator]
async def sweep_expired_ids() -> None:
    """Forget dedupe entries past their TTL, locally and (by tombstones) in the changelog."""
    async with state_lock:
        await _sweep(time.time())


async def _sweep(now: float) -> None:
    topic = state.changelog_topic(SEEN)
    actives = app.assignor.assigned_actives()
    writes: dict[tuple[str, int], dict[bytes, bytes | None]] = {}
    for partition in state.partitions(SEEN):
        if TP(topic, partition) not in actives:
            continue
        expired = list(state.expired(SEEN, partition, now, SWEEP_LIMIT))
        if expired:
            writes[(SEEN, partition)] = dict.fromkeys(expired)
    if not writes:
        return
    await app.sender.send_all(state.changelog_records(writes))
    state.apply_local(writes)
    metrics.EXPIRED.inc(sum(len(keys) for keys in writes.values()))


@app.page("/metrics")
async def metrics_page(web: Any, request: Any) -> Any:
    return web.bytes(generate_latest(), content_type=CONTENT_TYPE_LATEST.split(";")[0])


@app.page("/ready")
async def ready_page(web: Any, request: Any) -> Any:
    """200 once the tables are recovered and the agents run; 503 before."""
    recovered = cast(TableManager, app.tables).recovery.completed.is_set()
    body = {"ready": recovered, "tables_recovered": recovered}
    return web.json(body, status=200 if recovered else 503)
