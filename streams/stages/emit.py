"""Stage two's runner: batches of keyed events deduped and ordered per key against the
co-partitioned state (streams.engine.store), written to the output, stale and dead-letter
topics, and the state's changes recorded.

With `exactly_once` (the default) a part's outputs, changelog records and input offsets
commit in one transaction of the emit member (exactly-once v2: streams.engine.librdkafka.
transactions); with `at_least_once` the outputs are written, then the changelog, then the
loop commits the offsets. Either way the local state takes a part's writes only once Kafka
holds them.

Each partition's part of a batch is planned at once (streams.core.emitting.plan_batch),
against its state as the parts still in flight will leave it, and written by a task that
waits for that partition's previous part: the next batch is fetched and planned while Kafka
still works on this one. With exactly_once the planning waits while the member's transactions
gather the parts queued behind a committed transaction into the next one
(`MemberTransactions.clear_to_plan`), so that Kafka is not left idle while the stage plans.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException

from streams import metrics
from streams.config import Settings
from streams.core.emitting import (
    KEYS_SWEEP_SCAN,
    SEEN_SWEEP_SCAN,
    EmitPlan,
    KeyedInput,
    PendingState,
    key_revision,
    mark_instance,
    plan_batch,
    seen_revision,
    unrecord,
)
from streams.core.keystate import Decoded, record_forget_at
from streams.core.records import OutRecord, RawRecord, dead_letter_record, headers_dict, parse_keyed
from streams.core.state import KEYS, MARKS, SEEN, Revision, decode_expiry
from streams.engine import failpoints
from streams.engine.batches import Batch
from streams.engine.librdkafka.consumer import Unreadable, headers_unreadable
from streams.engine.librdkafka.producer import RdRecordSender
from streams.engine.librdkafka.transactions import MemberTransactions, PartitionsMoved
from streams.engine.outcomes import DeadLetters, RecordsRefused
from streams.engine.records import TopicPartition
from streams.engine.store import SWEEP_FLUSH_KEYS, Reviser, StateStore
from streams.logs import printable
from streams.migrations import mark_forget_at, migrated_mark
from streams.progress import Progress, Stopping

log = logging.getLogger(__name__)

MIGRATE_CHUNK = 50_000
"""`marks` entries moved into `keys` per write (the upgrade to per-key state)."""

SWEEP_LIMIT = 50_000
"""Per table and partition, the most entries one sweep turn deletes or stamps."""
MAX_PARTS_IN_FLIGHT = 2
"""Per partition: emit parts planned ahead while earlier ones are written."""


class MetricChildren:
    """The per-instance metric children stage two updates per batch, looked up once each:
    `labels()` costs ~3 µs a call, which the latency histogram paid per emitted event. Only
    configured instances are kept (the plan emits for no other), so the cache is bounded by
    the configuration; rebuilt if the metrics switch between per-instance and aggregated."""

    def __init__(self, instances: Iterable[str]) -> None:
        self.instances = frozenset(instances)
        self.per_instance = metrics.ByInstance.per_instance
        self.latencies: dict[str, Any] = {}
        self.outcomes: dict[tuple[str, str], Any] = {}

    def current(self) -> MetricChildren:
        """These children, or new ones if the metrics changed mode since they were taken."""
        if self.per_instance == metrics.ByInstance.per_instance:
            return self
        return self.__class__(self.instances)

    def latency(self, instance: str) -> Any:
        child = self.latencies.get(instance)
        if child is None:
            child = metrics.LATENCY.labels(instance)
            if instance in self.instances:
                self.latencies[instance] = child
        return child

    def outcome(self, instance: str, outcome: str) -> Any:
        child = self.outcomes.get((instance, outcome))
        if child is None:
            child = metrics.OUTCOME_COUNTERS[outcome].labels(instance)
            if instance in self.instances:
                self.outcomes[(instance, outcome)] = child
        return child


@dataclass(slots=True)
class _Part:
    """One partition's share of an emit batch, planned, until its state is applied."""

    plan: EmitPlan
    done: asyncio.Future[None] = field(init=False)


class EmitStage:
    """Dedupe, order and emit keyed events; restore and sweep the state they are decided on."""

    def __init__(
        self,
        settings: Settings,
        store: StateStore,
        sender: RdRecordSender,
        transactions: MemberTransactions | None,
        progress: Progress,
        stop_on_failure: Callable[[str, BaseException], Awaitable[None]],
        moved: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.policy = settings.emit_policy()
        """What the plan and the sweep take of the settings (streams.policies)."""
        self.store = store
        self.sender = sender
        self.transactions = transactions
        self.progress = progress
        self.stop_on_failure = stop_on_failure
        """Called when a part's write fails outside the stage's loop (nobody awaits it)."""
        self.moved = moved
        """Called when a transaction was given up because the group moved on (the member
        rewinds to its committed offsets)."""
        self.dead_letters = DeadLetters(settings.stream.dead_letter_topic, "emit")
        self.tables_by_changelog = {store.changelog_topic(table): table for table in store.tables}
        self.outcome_by_topic = {
            topic: outcome
            for instance in settings.instances
            for topic, outcome in (
                (instance.output_topic, "emitted"),
                (instance.stale_output_topic, "stale"),
            )
        }
        self.restoring: dict[str, object] = {}
        """The last restore, for `/ready` and `python -m streams status`."""
        self.sweeping: asyncio.Task[Any] | None = None
        """The dedupe sweep running now, to cancel on stop."""
        self._emitting: dict[int, list[_Part]] = {}
        """Per partition, the parts planned but not yet in the local state, oldest first."""
        self._children = MetricChildren(self.policy.instances.keys())
        self.decoded = Decoded()
        """Key records decoded by earlier batches, by their stored bytes (a bounded memo)."""
        if transactions is not None:
            transactions.queued_behind = self._queued_behind

    # -- batches -------------------------------------------------------------------------

    async def handle(self, batch: Batch) -> None:
        """Dedupe, order and emit one batch of keyed events, per input partition (a part in
        flight either commits, retrying, or the worker stops). With at_least_once the loop
        commits the offsets once this returns, so every part has finished by then."""
        now = time.time()
        for tp, messages in batch.items():
            if not messages:
                continue
            inputs: list[KeyedInput] = []
            letters: list[OutRecord] = []
            unread: set[int] = set()
            for message in messages:
                reason = message.describe() if isinstance(message, Unreadable) else None
                try:
                    headers = message.headers()
                except Exception as exc:  # SystemError: a header name that is not UTF-8
                    headers, reason = None, headers_unreadable(message, exc)
                if reason is not None:
                    letters.append(self._unreadable(message, reason))
                    unread.add(message.offset())
                inputs.append(
                    KeyedInput(
                        tp.topic,
                        tp.partition,
                        message.key(),
                        message.value() or b"",
                        headers_dict(headers),
                        message.offset(),
                    )
                )
            in_flight = self._emitting.setdefault(tp.partition, [])
            while True:  # no await after the last check: what it saw holds for the plan
                if len(in_flight) >= MAX_PARTS_IN_FLIGHT:
                    await in_flight[0].done
                elif self.transactions is not None and not self.transactions.clear_to_plan.is_set():
                    await self.transactions.clear_to_plan.wait()
                else:
                    break
            pending = [part.plan for part in in_flight]
            readable = [item for item in inputs if item.offset not in unread] if unread else inputs
            state = PendingState(self.store, pending)
            plan = plan_batch(readable, self.policy, state, now, decoded=self.decoded)
            if letters:
                plan.outputs.extend(letters)
                plan.outcomes[("?", "dead_letter")] += len(letters)
            previous = in_flight[-1].done if in_flight else None
            part = _Part(plan)
            in_flight.append(part)
            part.done = asyncio.ensure_future(self._write(part, inputs, tp, previous))
        if self.transactions is None:
            await self.drain()

    async def drain(self) -> None:
        """Wait for every part in flight; raise the first that failed (parts cancelled by a
        stop are abandoned, not failed)."""
        parts = [part.done for in_flight in self._emitting.values() for part in in_flight]
        results = await asyncio.gather(*parts, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(
                result, asyncio.CancelledError | Stopping
            ):
                raise result

    def abort(self) -> None:
        """Cancel the parts in flight and the sweep (their input offsets stay uncommitted)."""
        for in_flight in self._emitting.values():
            for part in in_flight:
                part.done.cancel()
        if self.sweeping is not None:
            self.sweeping.cancel()

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
            children = self._children = self._children.current()
            for (instance, outcome), count in plan.outcomes.items():
                if outcome == "dead_letter":
                    metrics.DEAD_LETTERED.labels("emit").inc(count)
                else:
                    children.outcome(instance, outcome).inc(count)
            for instance, received_at in plan.received_at:
                with contextlib.suppress(ValueError):  # a bridge's unreadable received-at header
                    children.latency(instance).observe(acknowledged_at - float(received_at))
        except PartitionsMoved:
            # The transaction was aborted, the group moved on. Nothing of it is applied; the
            # member rewinds to the committed offsets (never a crash).
            with contextlib.suppress(ValueError):
                self._emitting[tp.partition].remove(part)
            self.moved()
        except Stopping:
            raise
        except Exception as exc:
            # Nobody awaits this task before the next batch of its partition, which may
            # never come: stop the worker now, as a failing stage loop does.
            await self.stop_on_failure("emit", exc)
            raise

    def _queued_behind(self, partition: int) -> bool:
        """Whether a part of `partition` waits for the one before it (in flight)."""
        return len(self._emitting.get(partition, ())) > 1

    def _unreadable(self, message: Any, reason: str) -> OutRecord:
        """The dead letter of a keyed record whose headers, or whole self, cannot be read:
        its key and value when there are any (an Unreadable has neither), and the reason,
        which names where it is. Its offset is committed with the part's others."""
        metrics.UNREADABLE.labels("emit").inc()
        log.warning("dead-lettered an unreadable record: %.500s", printable(reason))
        raw = RawRecord(message.topic() or "", message.value() or b"")
        letter = dead_letter_record(
            self.settings.stream.dead_letter_topic, raw, message.key(), reason, "emit"
        )
        if isinstance(message, Unreadable):
            letter.value = None
        return letter

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
            unrecord(plan, event, self.policy.instances[event.instance], item.partition)
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

    # -- state ---------------------------------------------------------------------------

    def release(self, kept: set[TopicPartition]) -> None:
        """Partitions revoked or lost: close their local state; those kept stay open."""
        self.store.open({tp.partition for tp in kept})

    async def restore(self, assigned: set[TopicPartition]) -> None:
        """Before the stage handles a partition: fence its earlier owner (exactly_once),
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
                    self.settings.kafka,
                    partitions,
                    {SEEN: decode_expiry, KEYS: record_forget_at, MARKS: mark_forget_at},
                )
                await self.migrate_marks(partitions)
                break
            except KafkaException as exc:  # Kafka away: the rest is read again
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

    async def sweep(self, now: float) -> None:
        """Forget spilled dedupe ids past their TTL and keys' records past their end (a
        deleted key's, past its grace; stamping deleted marks written before marks expired:
        streams.core.emitting.key_revision), locally and (by tombstones) in the changelog.
        One turn reads a bounded number of entries per partition
        (streams.core.emitting.SEEN_SWEEP_SCAN, KEYS_SWEEP_SCAN), from where the previous
        turn stopped."""
        writes: dict[tuple[str, int], dict[bytes, bytes | None]] = {}

        def expire(key: bytes, stored: bytes) -> Revision | None:
            return seen_revision(key, stored, now)

        def revise(key: bytes, stored: bytes) -> Revision | None:
            return key_revision(key, stored, now, self.mark_grace)

        tables: tuple[tuple[str, Reviser, int], ...] = (
            (SEEN, expire, SEEN_SWEEP_SCAN),
            (KEYS, revise, KEYS_SWEEP_SCAN),
        )
        for partition in self.store.partitions():
            for table, reviser, scan in tables:
                swept = self.store.revisions(table, partition, SWEEP_LIMIT, reviser, scan)
                if swept.changes:
                    writes[(table, partition)] = swept.changes
            await asyncio.sleep(0)  # heartbeats and /metrics between partitions (emit waits)
        if not writes:
            return

        await self._write_state(writes, "sweep")  # one refused is kept, for a later sweep
        for (table, partition), keys in writes.items():
            if len(keys) >= SWEEP_FLUSH_KEYS:
                self.store.flush(table, partition)
        metrics.EXPIRED.inc(sum(len(keys) for (table, _), keys in writes.items() if table == SEEN))
        records = [
            value for (table, _), keys in writes.items() if table == KEYS for value in keys.values()
        ]
        if records:
            log.info(
                "forgot %d keys' records past their end; stamped %d older deleted marks",
                sum(value is None for value in records),
                sum(value is not None for value in records),
            )

    async def migrate_marks(self, partitions: set[int]) -> None:
        """Per-key state's upgrade (streams.core.emitting): each `marks` entry of
        `partitions` becomes its key's `keys` record (unless the key has one, written since),
        then is tombstoned. Once per partition, in bounded chunks; a partition without marks
        costs one seek. Interrupted, it starts over where `marks` still has entries."""
        for partition in sorted(partitions):
            moved = 0
            previous: bytes | None = None
            while True:
                chunk = self.store.entries(MARKS, partition, MIGRATE_CHUNK)
                if not chunk:
                    break
                if chunk[0][0] == previous:  # its tombstone was not written: never loop
                    log.error(
                        "state of partition %d: %d marks could not be moved into per-key "
                        "records (Kafka refused their tombstones); kept, for the next restore",
                        partition,
                        len(chunk),
                    )
                    break
                previous = chunk[0][0]
                records: dict[bytes, bytes | None] = {}
                for key, stored in chunk:
                    if self.store.get(KEYS, partition, key) is None:
                        record = migrated_mark(key, stored)
                        if record is not None:
                            records[key] = record
                await self._write_state({(KEYS, partition): records}, "migrate")
                tombstones: dict[bytes, bytes | None] = dict.fromkeys(
                    (key for key, _ in chunk), None
                )
                await self._write_state({(MARKS, partition): tombstones}, "migrate")
                moved += len(chunk)
            if moved:
                self.store.flush(MARKS, partition)
                log.warning(
                    "state of partition %d: %d marks moved into per-key records (once, on "
                    "the upgrade to per-key state)",
                    partition,
                    moved,
                )

    async def _write_state(
        self, writes: dict[tuple[str, int], dict[bytes, bytes | None]], what: str
    ) -> None:
        """Write state changes to the changelog, then locally; a record Kafka refuses is
        left out of both (the state stays what the changelog says)."""

        def drop(record: OutRecord, reason: str) -> None:
            assert record.partition is not None and record.key is not None
            table = self.tables_by_changelog[record.topic]
            writes[(table, record.partition)].pop(record.key, None)
            log.error("dropped a %s record Kafka refused (%s): %s", what, table, reason)

        sent = await self.sender.send_all(self.store.changelog_records(writes), what, drop)
        self.store.apply(writes, sent.acknowledged)

    def mark_grace(self, key: bytes) -> float:
        """The grace of a `keys` record's instance (streams.core.emitting.deleted_mark_grace)."""
        return self.policy.grace(mark_instance(key))
