"""The two stages of one worker, wired: their group members (streams.engine.librdkafka.
consumer.RdBatchLoop), the producer, the emit member's transactions and the state store.

    raw topics --normalize--> repartition topic (key = instance/bucket/key) --emit--> outputs

The process around it (the Faust app, its web pages, signals, timers) is streams.worker.
A pipeline may run only some of its stages (`runs`): with `stream.stage_processes = 2` the
worker's process runs `normalize` and a child process `emit` (streams.stages.child), each
with its own clients; the other stage's objects are made but never started.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable

from prometheus_client import REGISTRY

from streams import metrics
from streams.config import Settings
from streams.core.emitting import KEYS, MARKS, SEEN
from streams.engine.batches import Batch
from streams.engine.librdkafka.consumer import RdBatchLoop, consumer_config
from streams.engine.librdkafka.group_config import configure_stage_groups
from streams.engine.librdkafka.producer import RdRecordSender
from streams.engine.librdkafka.transactions import MemberTransactions, fence_partition_ids
from streams.engine.membership import Departure
from streams.engine.offsets import OffsetsUnavailable, adopt_committed_offsets
from streams.engine.outcomes import DeadLetters
from streams.engine.records import TopicPartition
from streams.engine.store import StateStore
from streams.engine.topics import (
    KEYS_TABLE,
    MARKS_TABLE,
    RAW_MAX_MESSAGE_BYTES,
    SEEN_TABLE,
    changelog_topic,
    topology,
)
from streams.progress import FINISH_SHARE, Progress, StallWatch, Stopping
from streams.stages.emit import EmitStage
from streams.stages.normalize import NormalizeStage

log = logging.getLogger(__name__)

COLLECTOR_THRESHOLDS = (50_000, 20, 100)
"""The cyclic garbage collector's thresholds once the stages run (Python's: 700, 10, 10)."""


def settle_collector() -> None:
    """Per-record objects die young, freed by reference counting; the cyclic collector only
    slows them down. Move the start-up heap (Faust, the clients, the modules) out of every
    later collection (`gc.freeze`) and collect the young generation every 50,000 allocations
    instead of 700: a batch of 2,000 records allocates tens of thousands of objects, and the
    default thresholds made the collector rescan the growing older generations within each.
    Measured: BENCHMARKS.md, "Issue 22: the cyclic collector"."""
    gc.freeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


STAGE_NAMES = ("normalize", "emit")


class Pipeline:
    """The two stages, their producers and the state store of one worker."""

    def __init__(
        self,
        settings: Settings,
        stop_on_failure: Callable[[str, BaseException], Awaitable[None]],
        runs: Iterable[str] = STAGE_NAMES,
    ) -> None:
        self.settings = settings
        stream = settings.stream
        self.runs = tuple(name for name in STAGE_NAMES if name in set(runs))
        """The stages this process runs (both, unless the worker runs a stage per process)."""
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
            stream.instance_metrics_limit,
        )
        self.stalls = {name: StallWatch(self.progress, name) for name in ("normalize", "emit")}
        """Per stage: whether its consumer handles what waits (streams.progress)."""
        self.sender = RdRecordSender(
            settings.kafka,
            f"{stream.app_id}-sender",
            self.progress,
            DeadLetters(stream.dead_letter_topic, "emit"),
        )
        self.normalize_sender = RdRecordSender(
            settings.kafka,
            f"{stream.app_id}-normalize-sender",
            self.progress,
            DeadLetters(stream.dead_letter_topic, "normalize"),
            failures_only=True,
        )
        """Stage one's producer: it needs no offsets, so Kafka reports only failures."""
        self.transactions: MemberTransactions | None = None
        if stream.processing_guarantee == "exactly_once":
            self.transactions = MemberTransactions(
                settings.kafka,
                stream.app_id,
                stream.group_instance_id or f"{socket.gethostname()}-{os.getpid()}",
                self._group_metadata,
                self.progress,
                group_id=self.emit_group,
                partitions={spec.name: spec.partitions for spec in topology(settings)},
            )
        self.store = StateStore(
            stream.data_dir / f"{stream.app_id}-state",
            {
                KEYS: changelog_topic(settings, KEYS_TABLE),
                SEEN: changelog_topic(settings, SEEN_TABLE),
                MARKS: changelog_topic(settings, MARKS_TABLE),
            },
        )
        self.normalizer = NormalizeStage(
            settings, self.normalize_sender, self._commit_normalized, stop_on_failure
        )
        self.emitter = EmitStage(
            settings,
            self.store,
            self.sender,
            self.transactions,
            self.progress,
            stop_on_failure,
            self._moved,
        )
        within_ms = int(stream.batch_within_s * 1000)
        self.normalize = RdBatchLoop(
            "normalize",
            self._consumer_config(self.normalize_group, "normalize"),
            [topic.name for topic in stream.raw_topics],
            self.normalizer.handle,
            commits_offsets=False,  # the stage commits each batch once it is acknowledged
            drain=self.normalizer.drain,
            max_records=stream.batch_size,
            within_ms=within_ms,
            kafka=settings.kafka,
        )
        transactions = self.transactions
        self.emit = RdBatchLoop(
            "emit",
            self._consumer_config(self.emit_group, "emit"),
            [stream.repartition_topic],
            self.emitter.handle,
            commits_offsets=transactions is None,
            max_records=stream.emit_batch,
            within_ms=within_ms,
            on_assigned=self.emitter.restore,
            release=self.emitter.release,
            drain=self.emitter.drain,
            resume=transactions.resume if transactions is not None else None,
            fence=self._fence_partition_producers if transactions is not None else None,
            kafka=settings.kafka,
        )

    @property
    def stages(self) -> tuple[RdBatchLoop, ...]:
        """The stage loops this process runs."""
        return tuple(loop for loop in (self.normalize, self.emit) if loop.name in self.runs)

    @property
    def runs_emit(self) -> bool:
        return "emit" in self.runs

    def _consumer_config(self, group_id: str, member: str) -> dict[str, object]:
        stream = self.settings.stream
        return consumer_config(
            self.settings.kafka.librdkafka_config(),
            client_id=f"{stream.app_id}-{member}",
            group_id=group_id,
            group_instance_id=(
                f"{stream.group_instance_id}-{member}" if stream.group_instance_id else None
            ),
            group_protocol=stream.group_protocol,
            session_timeout_s=stream.session_timeout_s,
            # The raw topics, whoever may write them: what one fetch brings in and inflates.
            max_record_bytes=RAW_MAX_MESSAGE_BYTES if member == "normalize" else None,
        )

    async def _commit_normalized(self, batch: Batch) -> None:
        await self.normalize.commit(batch)

    def _group_metadata(self) -> object:
        """The emit member's group metadata, for its transactions (exactly-once v2)."""
        return self.emit.group_metadata

    def _moved(self) -> None:
        self.emit.moved()

    def _fence_partition_producers(self, assigned: set[TopicPartition]) -> None:
        """The transactional ids per input partition that the aiokafka engine (before
        2026-12) used: fenced before a partition's committed offsets are read, so that a
        transaction such a worker left open is aborted at once (the upgrade path:
        streams.engine.librdkafka.transactions.fence_partition_ids)."""
        partitions = {tp.partition for tp in assigned}
        fence_partition_ids(self.settings.kafka, self.settings.stream.app_id, partitions)

    async def close_consumers(self, timeout_s: float = 10.0) -> None:
        """Leave the groups before a dying worker goes down, so it is assigned nothing
        meanwhile."""
        for loop in self.stages:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(loop.stop(abandon=True), timeout_s)

    @property
    def ready(self) -> bool:
        return all(loop.ready for loop in self.stages)

    async def start(self) -> None:
        stream = self.settings.stream
        if stream.group_protocol == "consumer":
            await configure_stage_groups(
                self.settings.kafka,
                tuple(group for group, loop in self._groups() if loop in self.stages),
                stream.session_timeout_s,
            )
        for sender in self._senders:
            await sender.start()
        if self.transactions is not None and self.runs_emit:
            # Before the emit member joins: initialising the producer under this member's
            # transactional.id aborts what a killed predecessor left open, which the member's
            # committed-offset read (require_stable) would otherwise wait out.
            await self.transactions.prepare(set())
        for group, loop in self._groups():
            if loop in self.stages:
                await self._adopt_offsets(group, loop.topics)
                await loop.start()
        settle_collector()

    @property
    def _senders(self) -> list[RdRecordSender]:
        """The producers this process uses: stage one's, and the emit stage's (its at-least-
        once writes, the sweep)."""
        senders = [self.normalize_sender] if "normalize" in self.runs else []
        return [*senders, self.sender] if self.runs_emit else senders

    def _groups(self) -> tuple[tuple[str, RdBatchLoop], ...]:
        return ((self.normalize_group, self.normalize), (self.emit_group, self.emit))

    async def _adopt_offsets(self, group: str, topics: list[str]) -> None:
        """A stage group's first start after an upgrade from the Faust agents:
        streams.engine.offsets."""
        delay = 0.5
        while True:
            try:
                await adopt_committed_offsets(
                    self.settings.kafka, self.settings.stream.app_id, group, topics
                )
                return
            except OffsetsUnavailable as exc:
                log.warning("reading committed offsets failed (%r); retrying in %.1f s", exc, delay)
                await self.progress.pause(delay)
                delay = min(delay * 2, 5.0)

    async def stop(self, deadline: float) -> None:
        """Close the clients, each within what is left until `deadline` (loop time): one that
        cannot finish in time (Kafka away) is abandoned. The state store is closed anyway."""
        loop = asyncio.get_running_loop()
        closing: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            (f"the {stage.name} consumer", stage.stop) for stage in self.stages
        ]
        if self.departure.leaving:  # a scale-in: its partitions move now, not in a session
            closing.append(("leaving the groups", self.departure.leave_stage_groups))
        if self.transactions is not None and self.runs_emit:
            closing.append(("the transactional producers", self.transactions.stop))
        closing.extend((f"the producer {each.client_id}", each.stop) for each in self._senders)
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
        self.normalizer.abort()
        self.emitter.abort()

    async def watch_stalls(self) -> None:
        """Tell each stage's StallWatch what its consumer did (records handled, lag, when
        Kafka last answered a fetch); a stage without its partitions is not watched."""
        for loop in self.stages:
            watch = self.stalls[loop.name]
            if loop.ready:
                handled = REGISTRY.get_sample_value(
                    "storage_events_stage_records_total", {"stage": loop.name}
                )
                lag, answered_at = await loop.view()
                watch.sample(handled or 0.0, lag, answered_at, loop.stalled)
                if lag is not None:
                    metrics.STAGE_LAG.labels(loop.name).set(lag)
                metrics.STALLED_PARTITIONS.labels(loop.name).set(len(loop.stalled))
            else:
                watch.reset()
                metrics.STALLED_PARTITIONS.labels(loop.name).set(0)

    def status(self) -> dict[str, dict[str, object]]:
        """Per stage: whether it has its partitions (and state), and what it is stuck on."""
        stuck = self.progress.stuck()
        stages: dict[str, dict[str, object]] = {
            loop.name: {"assigned": loop.ready, **stuck.pop(loop.name, {})} for loop in self.stages
        }
        if self.emitter.restoring and self.runs_emit:
            stages["emit"]["restore"] = dict(self.emitter.restoring)
        stages.update(stuck)  # the sweep
        return stages

    async def sweep(self) -> None:
        """One turn of the state sweep (expired dedupe ids, deleted keys' marks), one at a
        time with the emit stage, so that a sweep never deletes an id a batch just recorded."""
        if self.progress.stopping or not self.runs_emit:
            return
        emitter = self.emitter
        emitter.sweeping = asyncio.current_task()
        try:
            async with self.emit.lock:
                if self.emit.ready:
                    await emitter.drain()
                    await emitter.sweep(time.time())
        except (asyncio.CancelledError, Stopping):
            if not self.progress.stopping:
                raise
        finally:
            emitter.sweeping = None

    async def finish(self, within_s: float) -> list[asyncio.Lock]:
        """The first part of a stop: let each stage finish the batch in hand for `within_s`
        (holding its lock keeps the next one out), then abandon what
        did not finish (uncommitted, so read again on the next start). The locks held, to
        release once the stage loops are cancelled (leaving the group calls the revoke
        callback, which takes them)."""
        loop = asyncio.get_running_loop()
        finish_by = loop.time() + within_s
        held = []
        for stage_loop in self.stages:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stage_loop.lock.acquire(), max(0.0, finish_by - loop.time()))
                held.append(stage_loop.lock)
        drains = {"normalize": self.normalizer.drain, "emit": self.emitter.drain}
        for name in self.runs:
            with contextlib.suppress(Exception):  # a failure was logged by its stage
                await asyncio.wait_for(drains[name](), max(0.0, finish_by - loop.time()))
        if self.progress.stuck() or len(held) < len(self.stages):
            log.warning(
                "stopping: abandoning the batches that could not finish in %.0f s (they are "
                "read again on the next start): %s",
                within_s,
                self.status(),
            )
        self.abort()
        return held

    async def shut_down(
        self,
        running: Iterable[asyncio.Future[None]],
        grace_s: float,
        before_closing: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        """Stop within `grace_s` of now, whatever Kafka does: the batches in hand finish for
        the first FINISH_SHARE of it (`finish`), the stage loops (`running`) are cancelled,
        then `before_closing` (given the deadline, loop time) and the clients close
        (`stop`). The last 2 s are left to the process' own shutdown."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s - 2.0
        held = await self.finish(grace_s * FINISH_SHARE)
        running = list(running)
        for stage in running:
            stage.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*running, return_exceptions=True),
                max(0.1, deadline - loop.time()),
            )
        for lock in held:
            lock.release()  # leaving the group calls the revoke callback, which takes it
        if before_closing is not None:
            await before_closing(deadline)
        await self.stop(deadline)
