"""The Faust application (`faust -A streams worker`): two batch stages, one state store.

    raw topics --normalize--> repartition topic (key = instance/bucket/key) --emit--> outputs

`normalize` parses each delivery, applies each instance's rules and repartitions by
(instance, bucket, key); `emit` dedupes and orders per key with co-partitioned state
(streams.engine.store) and writes the output, stale and dead-letter topics. Faust runs the process
(start-up, signals, the web server for /metrics and /ready, the sweeper timer); the stages
consume with their own group members in batches (streams.engine: librdkafka by default,
aiokafka as a setting), because Faust's per-event stream machinery costs several times the work
itself (BENCHMARKS.md).

Guarantees: `normalize` commits its input offsets after Kafka acknowledged the batch's keyed
and dead-letter records (at least once; a repeat is a duplicate the emit stage drops).
`emit` with `exactly_once` (the default) commits a batch's outputs, changelog records and
offsets in one transaction (per emit member, exactly-once v2: streams.engine.librdkafka.
transactions; per input partition on the aiokafka engine: streams.engine.aio.transactions);
with `at_least_once` it writes outputs, then the changelog, then commits.

No record stops a stage: one Kafka refuses (too large for its topic) is replaced by a dead
letter of the input it came from (the delivery in `normalize`, the keyed record in `emit`,
whose dedupe id is then not recorded, so a replay of the dead letter is no duplicate) and the
batch goes on. A stage that cannot make progress (Kafka away) says so in the log and on
`/ready` (503, with the stage and why: streams.progress). SIGTERM stops the worker within
`STOP_GRACE_S`: batches that cannot finish are abandoned uncommitted (read again on the next
start); exit 0, or `EXIT_STOP_TIMEOUT` if even closing the clients ran out of time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from streams import metrics
from streams.config import ConfigError, Settings, load_settings
from streams.core.emitting import (
    MARKS,
    MARKS_SWEEP_SCAN,
    SEEN,
    SEEN_SWEEP_SCAN,
    EmitPlan,
    KeyedInput,
    PendingState,
    decode_expiry,
    dedupe_key,
    deleted_mark_grace,
    mark_forget_at,
    mark_instance,
    mark_revision,
    plan_batch,
    seen_revision,
)
from streams.core.records import (
    OutRecord,
    RawRecord,
    dead_letter_record,
    header_text,
    headers_dict,
    parse_keyed,
)
from streams.core.routing import route
from streams.core.rules import open_instances_warning
from streams.engine import failpoints
from streams.engine.aio.consumer import BatchLoop
from streams.engine.aio.producer import RecordSender
from streams.engine.aio.transactions import PartitionTransactions, RecordsRefused
from streams.engine.batches import Batch
from streams.engine.librdkafka.consumer import RdBatchLoop, consumer_config
from streams.engine.librdkafka.group_config import (
    configure_stage_groups,
    kip848_refusal,
    versions_by_broker,
)
from streams.engine.librdkafka.producer import RdRecordSender
from streams.engine.librdkafka.transactions import (
    MemberTransactions,
    PartitionsMoved,
    fence_partition_ids,
)
from streams.engine.membership import Departure
from streams.engine.offsets import adopt_committed_offsets
from streams.engine.outcomes import DeadLetters
from streams.engine.store import SWEEP_FLUSH_KEYS, Reviser, Revision, StateStore
from streams.engine.topics import MARKS_TABLE, SEEN_TABLE, changelog_topic, ensure_topics, topology
from streams.kafka_settings import KafkaAccessError, KafkaRefusalWording
from streams.logs import install_kafka_log_filter
from streams.progress import EXIT_STOP_TIMEOUT, STOP_GRACE_S, Progress, StallWatch, Stopping
from streams.status import ProgressReporter

log = logging.getLogger(__name__)

SWEEP_LIMIT = 50_000
HEARTBEAT_MAX_S = 1.0
"""A stage member learns of a rebalance (another member joined or left) at its next
heartbeat: at most this long, whatever the session timeout (45 s in k8s would give 9 s)."""
MAX_PARTS_IN_FLIGHT = 2
"""Per partition: emit parts planned ahead while earlier ones are written."""
FINISH_SHARE = 0.5
"""Of the grace period (STOP_GRACE_S), the part batches in hand may take to finish; the rest
is for abandoning what did not, closing the clients and Faust's own shutdown."""


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
install_kafka_log_filter()  # an outage: one line per cause every few seconds (streams.logs)


def _consumer(group_id: str, member: str) -> AIOKafkaConsumer:
    stream = settings.stream
    return AIOKafkaConsumer(
        **settings.kafka.aiokafka_args(),
        client_id=f"{stream.app_id}-{member}",
        group_id=group_id,
        group_instance_id=(
            f"{stream.group_instance_id}-{member}" if stream.group_instance_id else None
        ),
        session_timeout_ms=int(stream.session_timeout_s * 1000),
        heartbeat_interval_ms=int(min(stream.session_timeout_s / 5, HEARTBEAT_MAX_S) * 1000),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )


def _rd_consumer_config(group_id: str, member: str) -> dict[str, Any]:
    """The librdkafka engine's stage member (streams.engine.librdkafka.consumer)."""
    stream = settings.stream
    return consumer_config(
        settings.kafka.librdkafka_config(),
        client_id=f"{stream.app_id}-{member}",
        group_id=group_id,
        group_instance_id=(
            f"{stream.group_instance_id}-{member}" if stream.group_instance_id else None
        ),
        group_protocol=stream.group_protocol,
        session_timeout_s=stream.session_timeout_s,
    )


def _fence_aiokafka_producers(assigned: set[TopicPartition]) -> None:
    """streams.engine.librdkafka.transactions.fence_partition_ids for the emit member."""
    partitions = {tp.partition for tp in assigned}
    fence_partition_ids(settings.kafka, settings.stream.app_id, partitions)


@dataclass(slots=True)
class _Part:
    """One partition's share of an emit batch, planned, until its state is applied."""

    plan: EmitPlan
    done: asyncio.Future[None] = field(init=False)


def _dead_letter_once(
    origins: dict[int, tuple[RawRecord, bytes | None]], dead_letter_topic: str
) -> Callable[[OutRecord, str], OutRecord | None]:
    """Stage one's replacement of a keyed record Kafka refused: a dead letter of the delivery
    it came from, once per delivery (its other records may have been written: a replay after
    the fix gives duplicates, which the emit stage drops)."""
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


class Pipeline:
    """The two stages, their producers and the state store of one worker."""

    def __init__(self, stop_on_failure: Callable[[str, BaseException], Awaitable[None]]) -> None:
        stream = settings.stream
        self.stop_on_failure = stop_on_failure
        """Called with the stage's name when work running outside a stage's loop fails."""
        self.normalize_group = f"{stream.app_id}-normalize"
        self.emit_group = f"{stream.app_id}-emit"
        self.departure = Departure(
            settings.kafka, stream.app_id, stream.group_instance_id, stream.leave_group_on_stop, log
        )
        """Whether this worker leaves its groups for good when it stops
        (streams.engine.membership)."""
        self.progress = Progress()
        metrics.start_at_zero(
            [instance.name for instance in settings.instances],
            [spec.name for spec in topology(settings) if spec.role != "raw"],
        )
        self.stalls = {name: StallWatch(self.progress, name) for name in ("normalize", "emit")}
        """Per stage: whether its consumer handles what waits (streams.progress)."""
        self.reporter = ProgressReporter()
        """The progress line logged every `stream.progress_interval_s` (streams.status)."""
        self.restoring: dict[str, object] = {}
        """The emit stage's last restore, for `/ready` and `python -m streams status`."""
        self.dead_letters = DeadLetters(stream.dead_letter_topic, "emit")
        librdkafka = stream.engine == "librdkafka"  # the same stages on other clients
        self.sender: RecordSender | RdRecordSender = (
            RdRecordSender if librdkafka else RecordSender
        )(settings.kafka, f"{stream.app_id}-sender", self.progress, self.dead_letters)
        self.transactions: PartitionTransactions | MemberTransactions | None = None
        if stream.processing_guarantee == "exactly_once":
            self.transactions = (
                MemberTransactions(
                    settings.kafka,
                    stream.app_id,
                    stream.group_instance_id or f"{socket.gethostname()}-{os.getpid()}",
                    self._group_metadata,
                    self.progress,
                )
                if librdkafka
                else PartitionTransactions(
                    settings.kafka, stream.app_id, self.emit_group, self.progress
                )
            )
        self.sweeping: asyncio.Task[Any] | None = None
        """The dedupe sweep running now, to cancel on stop."""
        changelogs = {
            SEEN: changelog_topic(settings, SEEN_TABLE),
            MARKS: changelog_topic(settings, MARKS_TABLE),
        }
        self.tables_by_changelog = {topic: table for table, topic in changelogs.items()}
        self.store = StateStore(stream.data_dir / f"{stream.app_id}-state", changelogs)
        self.outcome_by_topic = {
            topic: outcome
            for instance in settings.instances
            for topic, outcome in (
                (instance.output_topic, "emitted"),
                (instance.stale_output_topic, "stale"),
            )
        }
        self._emitting: dict[int, list[_Part]] = {}
        """Per partition, the emit parts planned but not yet in the local state, oldest first."""
        within_ms = int(stream.batch_within_s * 1000)
        self.normalize: BatchLoop | RdBatchLoop
        self.emit: BatchLoop | RdBatchLoop
        if librdkafka:
            self.normalize = RdBatchLoop(
                "normalize",
                _rd_consumer_config(self.normalize_group, "normalize"),
                [topic.name for topic in stream.raw_topics],
                self.handle_raw_batch,
                commits_offsets=True,
                max_records=stream.batch_size,
                within_ms=within_ms,
                kafka=settings.kafka,
            )
            transactions = self.transactions
            self.emit = RdBatchLoop(
                "emit",
                _rd_consumer_config(self.emit_group, "emit"),
                [stream.repartition_topic],
                self.handle_keyed_batch,
                commits_offsets=transactions is None,
                max_records=stream.batch_size,
                within_ms=within_ms,
                on_assigned=self.restore,
                release=self.release,
                drain=self.drain_emits,
                resume=(
                    transactions.resume if isinstance(transactions, MemberTransactions) else None
                ),
                fence=_fence_aiokafka_producers if transactions is not None else None,
                kafka=settings.kafka,
            )
        else:
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

    def _group_metadata(self) -> object:
        """The emit member's group metadata, for its transactions (exactly-once v2)."""
        assert isinstance(self.emit, RdBatchLoop)
        return self.emit.group_metadata

    def release(self, kept: set[TopicPartition]) -> None:
        """Partitions revoked or lost (librdkafka engine, incremental): close their local
        state; the partitions kept stay open and keep flowing."""
        self.store.open({tp.partition for tp in kept})

    async def close_consumers(self, timeout_s: float = 10.0) -> None:
        """Leave the groups before a dying worker goes down, so it is assigned nothing
        meanwhile (librdkafka engine; aiokafka's consumers close with the worker)."""
        for loop in (self.normalize, self.emit):
            if isinstance(loop, RdBatchLoop):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(loop.stop(abandon=True), timeout_s)

    @property
    def ready(self) -> bool:
        return self.normalize.ready and self.emit.ready

    async def start(self) -> None:
        stream = settings.stream
        if stream.engine == "librdkafka" and stream.group_protocol == "consumer":
            await configure_stage_groups(
                settings.kafka, (self.normalize_group, self.emit_group), stream.session_timeout_s
            )
        await self.sender.start()
        if isinstance(self.transactions, MemberTransactions):
            # Before the emit member joins: initialising the producer under this member's
            # transactional.id aborts what a killed predecessor left open, which the member's
            # committed-offset read (require_stable) would otherwise wait out.
            await self.transactions.prepare(set())
        for group, loop in ((self.normalize_group, self.normalize), (self.emit_group, self.emit)):
            await _adopt_offsets(group, loop.topics, self.progress)
            if isinstance(loop, BatchLoop):
                await _start_consumer(loop.consumer, self.progress)
            else:
                await loop.start()

    async def stop(self, deadline: float) -> None:
        """Close the clients, each within what is left until `deadline` (loop time): one that
        cannot finish in time (Kafka away) is abandoned. The state store is closed anyway."""
        loop = asyncio.get_running_loop()
        closing: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            (
                f"the {stage.name} consumer",
                stage.consumer.stop if isinstance(stage, BatchLoop) else stage.stop,
            )
            for stage in (self.normalize, self.emit)
        ]
        if self.departure.leaving:  # a scale-in: its partitions move now, not in a session
            closing.append(("leaving the groups", self.departure.leave_stage_groups))
        if self.transactions is not None:
            closing.append(("the transactional producers", self.transactions.stop))
        closing.append(("the producer", self.sender.stop))
        try:
            for what, close in closing:
                try:
                    await asyncio.wait_for(close(), max(0.1, deadline - loop.time()))
                except TimeoutError:
                    log.warning("stopping: %s did not close in time; abandoned", what)
                except Exception:
                    log.warning("stopping: closing %s failed", what, exc_info=True)
        finally:
            self.store.close()

    def abort(self) -> None:
        """Stop every write still waiting for Kafka: retries end (Stopping), the parts in
        flight and the sweep are cancelled. Their input offsets are not committed."""
        self.progress.stop()
        for in_flight in self._emitting.values():
            for part in in_flight:
                part.done.cancel()
        if self.sweeping is not None:
            self.sweeping.cancel()

    async def watch_stalls(self) -> None:
        """Tell each stage's StallWatch what its consumer did (records handled, lag, when
        Kafka last answered a fetch); a stage without its partitions is not watched."""
        for loop in (self.normalize, self.emit):
            watch = self.stalls[loop.name]
            if loop.ready:
                handled, lag, answered_at = await _consumer_view(loop)
                watch.sample(handled, lag, answered_at)
                if lag is not None:
                    metrics.STAGE_LAG.labels(loop.name).set(lag)
            else:
                watch.reset()

    def status(self) -> dict[str, dict[str, object]]:
        """Per stage: whether it has its partitions (and state), and what it is stuck on."""
        stuck = self.progress.stuck()
        stages: dict[str, dict[str, object]] = {
            loop.name: {"assigned": loop.ready, **stuck.pop(loop.name, {})}
            for loop in (self.normalize, self.emit)
        }
        if self.restoring:
            stages["emit"]["restore"] = dict(self.restoring)
        stages.update(stuck)  # the sweep
        return stages

    async def restore(self, assigned: set[TopicPartition]) -> None:
        """Before the emit stage handles a partition: fence its earlier owner (exactly_once),
        then bring its state up to the end of the changelog."""
        partitions = {tp.partition for tp in assigned}
        self.restoring = {
            "state": "restoring",
            "partitions": sorted(partitions),
            "since": time.time(),
        }
        metrics.RESTORING.set(len(partitions))  # 0 again below (the process ends otherwise)
        if self.transactions is not None:
            await self.transactions.prepare(partitions)
        delay = 0.5
        while True:
            try:
                restored = await self.store.restore(
                    settings.kafka, partitions, {SEEN: decode_expiry, MARKS: mark_forget_at}
                )
                break
            except KafkaError as exc:  # Kafka away: what was applied stays, the rest is read again
                self.progress.trouble("emit", "restore", f"restoring state failed ({exc!r})")
                await self.progress.pause(delay)
                delay = min(delay * 2, 5.0)
        metrics.RESTORING.set(0)
        metrics.RESTORE_SECONDS.observe(restored.seconds)
        metrics.RESTORED_RECORDS.inc(restored.records)
        self.progress.recovered("emit")
        self.restoring = {
            "state": "restored",
            "partitions": sorted(partitions),
            "records": restored.records,
            "seconds": round(restored.seconds, 3),
        }
        log.info(
            "state of %d partitions restored: %d changelog records in %.2f s",
            restored.partitions,
            restored.records,
            restored.seconds,
        )

    async def handle_raw_batch(self, batch: Batch) -> None:
        """Normalize and repartition one batch of raw deliveries."""
        records: list[OutRecord] = []
        origins: dict[int, tuple[RawRecord, bytes | None]] = {}
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
                else:
                    for record in routed.records:
                        origins[id(record)] = (raw, message.key)
                records.extend(routed.records)
        for source, count in received.items():
            metrics.RECEIVED.labels(source).inc(count)
            metrics.NORMALIZED.labels(source).inc(normalized[source])
        for (instance, reason), count in filtered.items():
            metrics.FILTERED.labels(instance, reason).inc(count)
        dead_letter = _dead_letter_once(origins, settings.stream.dead_letter_topic)
        sent = await self.sender.send_all(records, "normalize", dead_letter)
        lettered = sum(refused.replacement is not None for refused in sent.refused)
        metrics.DEAD_LETTERED.labels("normalize").inc(lettered)

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
        """Wait for every part in flight; raise the first that failed (parts cancelled by a
        stop are abandoned, not failed)."""
        parts = [part.done for in_flight in self._emitting.values() for part in in_flight]
        results = await asyncio.gather(*parts, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(
                result, asyncio.CancelledError | Stopping
            ):
                raise result

    async def _write(
        self,
        part: _Part,
        inputs: Sequence[KeyedInput],
        tp: TopicPartition,
        previous: asyncio.Future[None] | None,
    ) -> None:
        """Write a planned part's outputs and changelog (in one transaction for
        exactly_once), then its local state. Records Kafka refuses are replaced (dead
        letters) and the plan's writes follow: what is applied locally is what was written."""
        try:
            if previous is not None:
                await previous  # its failure is this part's too: the partition stops here
            plan = part.plan

            def replace(record: OutRecord, reason: str) -> OutRecord | None:
                return self._replace_refused(plan, inputs, record, reason)

            if self.transactions is not None:
                offsets = {tp: inputs[-1].offset + 1}
                while True:
                    changelog_records = self.store.changelog_records(plan.writes)
                    try:
                        written = await self.transactions.commit(
                            tp.partition, [*plan.outputs, *changelog_records], offsets
                        )
                        break
                    except RecordsRefused as exc:  # aborted: replace them, then again
                        self._replace_in_plan(plan, inputs, exc.refused)
                failpoints.reached("after-output")
            else:
                await self.sender.send_all(plan.outputs, "emit", replace)
                failpoints.reached("after-output")
                changelog_records = self.store.changelog_records(plan.writes)
                sent = await self.sender.send_all(changelog_records, "emit", replace)
                written = sent.acknowledged
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
        except PartitionsMoved:
            # librdkafka engine: the transaction was aborted, the group moved on. Nothing of
            # it is applied; the member rewinds to the committed offsets (never a crash).
            with contextlib.suppress(ValueError):
                self._emitting[tp.partition].remove(part)
            if isinstance(self.emit, RdBatchLoop):
                self.emit.moved()
        except Stopping:
            raise
        except Exception as exc:
            # Nobody awaits this task before the next batch of its partition, which may
            # never come: stop the worker now, as a failing stage loop does.
            await self.stop_on_failure("emit", exc)
            raise

    def _replace_refused(
        self, plan: EmitPlan, inputs: Sequence[KeyedInput], record: OutRecord, reason: str
    ) -> OutRecord | None:
        """What replaces an emit record Kafka refused, with the plan adjusted to it.

        An output or stale record: a dead letter of the keyed record it came from, whose
        dedupe id is no longer recorded (a replay of the dead letter after the fix is no
        duplicate); its key's ordering mark stays, at worst making an older event stale. A
        changelog record: nothing, and its write is not applied locally either (the state
        stays what the changelog says). A dead letter: streams.engine.outcomes.DeadLetters."""
        table = self.tables_by_changelog.get(record.topic)
        if table is not None:
            assert record.partition is not None and record.key is not None
            plan.writes.get((table, record.partition), {}).pop(record.key, None)
            log.error("dropped a changelog record Kafka refused (%s): %s", table, reason)
            return None
        if record.topic == self.dead_letters.topic:
            return self.dead_letters(record, reason)
        item = next((item for item in inputs if item.value is record.value), None)
        if item is None:  # its value is not an input's (a keyed record of the first format)
            item = next((item for item in inputs if item.value == record.value), None)
        outcome = self.outcome_by_topic.get(record.topic)
        if item is None:
            return self.dead_letters(record, reason)
        with contextlib.suppress(ValueError):
            event = parse_keyed(item.value, item.headers)
            seen = plan.writes.get((SEEN, item.partition), {})
            seen.pop(dedupe_key(event, settings.instance(event.instance)), None)
            if outcome is not None:
                plan.outcomes[(event.instance, outcome)] -= 1
                plan.outcomes[(event.instance, "dead_letter")] += 1
        raw = RawRecord(item.topic, item.value, item.headers)
        return dead_letter_record(self.dead_letters.topic, raw, item.key, reason, "emit")

    def _replace_in_plan(
        self, plan: EmitPlan, inputs: Sequence[KeyedInput], refused: list[tuple[OutRecord, str]]
    ) -> None:
        """The transactional path: replace the refused records in the plan itself."""
        for record, reason in refused:
            replacement = self._replace_refused(plan, inputs, record, reason)
            outcome = "dead-lettered" if replacement is not None else "dropped"
            metrics.REFUSED.labels(record.topic, outcome).inc()
            log.error("%s; %s", reason, outcome)
            index = next((n for n, output in enumerate(plan.outputs) if output is record), None)
            if index is None:
                continue  # a changelog record: its write is gone from the plan
            if replacement is None:
                del plan.outputs[index]
            else:
                plan.outputs[index] = replacement

    async def sweep(self, now: float) -> None:
        """Forget dedupe entries past their TTL and deleted keys' marks past their grace
        (stamping those written before marks expired: streams.core.emitting.mark_revision),
        locally and (by tombstones) in the changelog. One turn reads at most SEEN_SWEEP_SCAN
        ids and MARKS_SWEEP_SCAN marks per partition, from where the previous turn stopped."""
        writes: dict[tuple[str, int], dict[bytes, bytes | None]] = {}

        def expire(key: bytes, stored: bytes) -> Revision | None:
            return seen_revision(key, stored, now)

        def revise(key: bytes, stored: bytes) -> Revision | None:
            return mark_revision(key, stored, now, self.mark_grace)

        tables: tuple[tuple[str, Reviser, int], ...] = (
            (SEEN, expire, SEEN_SWEEP_SCAN),
            (MARKS, revise, MARKS_SWEEP_SCAN),
        )
        for partition in self.store.partitions():
            for table, reviser, scan in tables:
                swept = self.store.revisions(table, partition, SWEEP_LIMIT, reviser, scan)
                if swept.changes:
                    writes[(table, partition)] = swept.changes
            await asyncio.sleep(0)  # heartbeats and /metrics between partitions (emit waits)
        if not writes:
            return

        def drop(record: OutRecord, reason: str) -> None:
            assert record.partition is not None and record.key is not None
            table = self.tables_by_changelog[record.topic]
            writes[(table, record.partition)].pop(record.key, None)  # kept, for a later sweep

        sent = await self.sender.send_all(self.store.changelog_records(writes), "sweep", drop)
        self.store.apply(writes, sent.acknowledged)
        for (table, partition), keys in writes.items():
            if len(keys) >= SWEEP_FLUSH_KEYS:
                self.store.flush(table, partition)
        metrics.EXPIRED.inc(sum(len(keys) for (table, _), keys in writes.items() if table == SEEN))
        marks = [
            value
            for (table, _), keys in writes.items()
            if table == MARKS
            for value in keys.values()
        ]
        if marks:
            log.info(
                "forgot %d deleted keys' marks past their grace; stamped %d older ones",
                sum(value is None for value in marks),
                sum(value is not None for value in marks),
            )

    def mark_grace(self, key: bytes) -> float:
        """The grace of a `marks` key's instance (streams.core.emitting.deleted_mark_grace)."""
        return deleted_mark_grace(settings, mark_instance(key))


async def _consumer_view(
    loop: BatchLoop | RdBatchLoop,
) -> tuple[float, int | None, float | None]:
    """A stage's records handled so far, its lag (records between its position and the end
    it may read, over the partitions whose end is known; None if none is), and when Kafka
    last answered one of its fetches (monotonic time, None if never)."""
    handled = REGISTRY.get_sample_value("storage_events_stage_records_total", {"stage": loop.name})
    if isinstance(loop, RdBatchLoop):
        rd_lag, rd_answered_at = await loop.view()
        return handled or 0.0, rd_lag, rd_answered_at
    consumer = loop.consumer
    lag: int | None = None
    polled_ms: int | None = None
    for tp in consumer.assignment():
        polled = consumer.last_poll_timestamp(tp)
        if polled is not None:
            polled_ms = max(polled_ms or 0, polled)
        end = consumer.last_stable_offset(tp)
        end = consumer.highwater(tp) if end is None or end < 0 else end
        if end is None:
            continue
        try:
            async with asyncio.timeout(0.2):  # known at once unless it is being reset
                position = await consumer.position(tp)
        except (TimeoutError, KafkaError, AssertionError):
            continue
        lag = (lag or 0) + max(0, end - position)
    answered_at = None if polled_ms is None else time.monotonic() - (time.time() - polled_ms / 1000)
    return handled or 0.0, lag, answered_at


async def _adopt_offsets(group: str, topics: list[str], progress: Progress) -> None:
    """A stage group's first start after an upgrade from the Faust agents:
    streams.engine.offsets."""
    delay = 0.5
    while True:
        try:
            await adopt_committed_offsets(settings.kafka, settings.stream.app_id, group, topics)
            return
        except KafkaError as exc:
            log.warning("reading committed offsets failed (%r); retrying in %.1f s", exc, delay)
            await progress.pause(delay)
            delay = min(delay * 2, 5.0)


async def _start_consumer(consumer: AIOKafkaConsumer, progress: Progress) -> None:
    delay = 0.5
    while True:
        try:
            await consumer.start()
            return
        except Exception as exc:  # aiokafka raises several kinds while Kafka is away
            log.warning("consumer cannot reach Kafka (%r); retrying in %.1f s", exc, delay)
            await progress.pause(delay)
            delay = min(delay * 2, 5.0)


class StreamsApp(faust.App):
    """A Faust app that creates the stream's topics before anything else starts."""

    async def on_first_start(self) -> None:
        # Retries (and says so) while Kafka is unreachable: a worker started before its
        # broker waits for it. Refused credentials or an untrusted certificate stop it with
        # one line naming the setting (exit 2): waiting would not change them. Later, the
        # clients' own lines about them are reworded (KafkaRefusalWording).
        KafkaRefusalWording(settings.kafka).install()
        log.info("Kafka: %s", settings.kafka.describe())
        try:
            created = await ensure_topics(settings.kafka, topology(settings))
        except KafkaAccessError as exc:
            # fd 2 itself: Faust redirects sys.stderr into its logger.
            os.write(2, f"storage-events: {exc}\n".encode())
            os._exit(2)
        if created:
            log.info("created topics: %s", ", ".join(created))
        stream = settings.stream
        if stream.engine == "librdkafka" and stream.group_protocol == "consumer":
            try:
                refusal = kip848_refusal(await versions_by_broker(settings.kafka))
            except (KafkaError, OSError, TimeoutError) as exc:  # not known: start anyway
                log.warning("could not read the brokers' API versions (%r)", exc)
                refusal = None
            if refusal is not None:
                os.write(2, f"storage-events: {refusal}\n".encode())
                os._exit(2)
        await super().on_first_start()


app = StreamsApp(
    settings.stream.app_id,
    **settings.kafka.faust_args(),  # broker URLs and broker_credentials (TLS, SASL)
    datadir=str(settings.stream.data_dir),
    web_port=settings.stream.web_port,
    web_host="0.0.0.0",
    consumer_auto_offset_reset="earliest",
    # Faust's own consumer reads nothing, but the worker starts the stages only once it has
    # joined its group: static membership and a short session let a restarted worker rejoin
    # at once instead of waiting out its previous life's session.
    consumer_group_instance_id=settings.stream.group_instance_id,
    broker_session_timeout=settings.stream.session_timeout_s,
    # The one topic Faust creates itself (`<app id>-__assignor-__leader`, which its consumer
    # reads): as many replicas as the stream's own, or it is lost with one broker.
    topic_replication_factor=settings.stream.replication_factor,
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
        open_instances = open_instances_warning(settings.instances)
        if open_instances is not None:
            log.warning("%s", open_instances)
        running = Pipeline(self._stop_on_failure)
        # SIGUSR1 = stop and leave the groups for good (in place of mode's stack dump).
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, running.departure.on_signal)
        await running.start()
        self._stages = [
            asyncio.ensure_future(self._run(loop)) for loop in (running.normalize, running.emit)
        ]

    async def on_stop(self) -> None:
        """Within STOP_GRACE_S of now, whatever Kafka does: let each stage finish the batch
        in hand for the first FINISH_SHARE of it (holding its lock keeps the next one out),
        then abandon what did not finish (uncommitted, so read again on the next start),
        stop the stages and close the clients. A watchdog ends the process at the deadline
        (EXIT_STOP_TIMEOUT) should anything still hang there."""
        _arm_stop_watchdog(STOP_GRACE_S)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_GRACE_S - 2.0  # Faust's own shutdown comes after
        finish_by = loop.time() + STOP_GRACE_S * FINISH_SHARE
        stages = getattr(self, "_stages", [])
        held = []
        if running is not None:
            for stage_loop in (running.normalize, running.emit):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        stage_loop.lock.acquire(), max(0.0, finish_by - loop.time())
                    )
                    held.append(stage_loop.lock)
            with contextlib.suppress(Exception):  # a failure was logged by its stage
                await asyncio.wait_for(running.drain_emits(), max(0.0, finish_by - loop.time()))
            unfinished = running.progress.stuck() or (len(held) < 2)
            if unfinished:
                log.warning(
                    "stopping: abandoning the batches that could not finish in %.0f s "
                    "(they are read again on the next start): %s",
                    STOP_GRACE_S * FINISH_SHARE,
                    running.status(),
                )
            running.abort()
        for stage in stages:
            stage.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*stages, return_exceptions=True),
                max(0.1, deadline - loop.time()),
            )
        for lock in held:
            lock.release()  # leaving the group calls the revoke callback, which takes it
        if running is not None:
            await running.stop(deadline)

    async def _run(self, loop: BatchLoop | RdBatchLoop) -> None:
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
        if running is not None and running.progress.stopping:
            log.info("the %s stage ended while stopping: %r", stage, exc)
            return
        if self._failed:
            return
        self._failed = True
        log.error("the %s stage failed; stopping the worker", stage, exc_info=exc)
        if running is not None:
            await running.close_consumers()  # a dying worker is assigned nothing
        await app.crash(exc)


@app.timer(interval=settings.stream.progress_interval_s)  # type: ignore[untyped-decorator]
async def log_progress() -> None:
    """One line per interval: records/s per stage, lag, dead letters (streams.status)."""
    if running is None or running.progress.stopping:
        return
    log.info("%s", running.reporter.line())


@app.timer(interval=settings.stream.dedupe_sweep_interval_s)  # type: ignore[untyped-decorator]
async def sweep_expired_ids() -> None:
    if running is None:
        return
    # One at a time with the emit stage, so a sweep never deletes an id a batch just recorded.
    if running.progress.stopping:
        return
    running.sweeping = asyncio.current_task()
    try:
        async with running.emit.lock:
            if running.emit.ready:
                await running.drain_emits()
                await running.sweep(time.time())
    except (asyncio.CancelledError, Stopping):
        if not running.progress.stopping:
            raise
    finally:
        running.sweeping = None


@app.timer(interval=1.0)  # type: ignore[untyped-decorator]
async def watch_stalls() -> None:
    """A stage that handles nothing while records wait, or that Kafka does not answer, is
    reported (log, `storage_events_stage_stuck`, `/ready`)."""
    if running is not None and not running.progress.stopping:
        await running.watch_stalls()


@app.page("/metrics")
async def metrics_page(web: Any, request: Any) -> Any:
    return web.bytes(generate_latest(), content_type=CONTENT_TYPE_LATEST.split(";")[0])


@app.page("/ready")
async def ready_page(web: Any, request: Any) -> Any:
    """200 once both stages have their partitions and the state is restored, and no stage
    has been unable to make progress for streams.progress.STUCK_AFTER_S; else 503, with
    each stage's state and what it is stuck on (`why`, `for_s`)."""
    stages = running.status() if running is not None else {}
    stuck = any("why" in stage for stage in stages.values())
    ready = running is not None and running.ready and not stuck
    body = {
        "ready": ready,
        "tables_recovered": running is not None and running.emit.ready,
        "stages": stages,
    }
    return web.json(body, status=200 if ready else 503)


def _arm_stop_watchdog(grace_s: float) -> None:
    """End the process `grace_s` from now if it has not ended by then: a thread, so that it
    fires even when the event loop is blocked."""

    def expire() -> None:
        log.error("stopping took longer than %.0f s: exiting now", grace_s)
        logging.shutdown()
        os._exit(EXIT_STOP_TIMEOUT)

    timer = threading.Timer(grace_s, expire)
    timer.daemon = True
    timer.start()
