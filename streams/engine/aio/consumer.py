"""A consumer-group member that hands its records to a handler in batches (aiokafka `getmany`).

This is the stream's hot path in place of Faust's per-event stream machinery (see the
performance issue and BENCHMARKS.md): one `getmany` returns up to `max_records` records
across the assigned partitions, the handler deals with all of them at once, and only then are
their offsets committed (by this loop, or by the handler inside a transaction). So an offset
is committed only after every output and state change of its records was acknowledged.

Rebalances: the revoke callback waits for the batch in hand to finish (it holds the same lock),
so a partition leaves with its offsets committed; the assign callback runs `on_assigned`
(restoring state) before any record of the new assignment is handled. Records fetched across a
rebalance are not handled: their partitions are rewound to the batch's first offsets, which
the consumer then reads again under the new assignment.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError

from streams import metrics
from streams.engine.batches import Batch, StageMeter

log = logging.getLogger(__name__)


class BatchLoop(ConsumerRebalanceListener):  # type: ignore[misc]
    """Consume `topics` as group `group_id`; call `handle` per batch; commit after it."""

    def __init__(
        self,
        name: str,
        consumer: AIOKafkaConsumer,
        topics: list[str],
        handle: Callable[[Batch], Awaitable[None]],
        *,
        commits_offsets: bool,
        max_records: int,
        within_ms: int,
        on_assigned: Callable[[set[TopicPartition]], Awaitable[None]] | None = None,
        drain: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.name = name
        self.consumer = consumer
        self.topics = topics
        self.handle = handle
        self.commits_offsets = commits_offsets
        self.max_records = max_records
        self.within_ms = within_ms
        self.on_assigned = on_assigned
        self.drain = drain
        """Waits for work `handle` left running (it commits its own offsets); called before
        partitions are given up."""
        self.lock = asyncio.Lock()
        """Held while a batch is handled; hold it to keep batches out (the dedupe sweeper)."""
        self.assigned = asyncio.Event()
        """Set once the current assignment's `on_assigned` finished; cleared on revoke."""
        self._generation = 0
        self._failure: BaseException | None = None

    @property
    def ready(self) -> bool:
        return self.assigned.is_set()

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        async with self.lock:
            if self.drain is not None:
                try:
                    await self.drain()
                except Exception as exc:
                    self._failure = exc  # the run loop raises it
            self._generation += 1
            self.assigned.clear()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        if self.on_assigned is not None:
            try:
                await self.on_assigned(assigned)
            except Exception as exc:
                # aiokafka would log this and carry on with unrestored state: stop instead.
                self._failure = exc
                self.assigned.set()
                return
        log.info(
            "%s: assigned %s",
            self.name,
            ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(assigned)) or "nothing",
        )
        self.assigned.set()

    async def run(self) -> None:
        """Until cancelled."""
        self.consumer.subscribe(self.topics, listener=self)
        fetching = metrics.STAGE_SECONDS.labels(self.name, "fetch")
        meter = StageMeter(self.name)
        commit = self._commit if self.commits_offsets else None
        while True:
            generation = self._generation
            started = time.monotonic()
            batch = await self.consumer.getmany(
                timeout_ms=self.within_ms, max_records=self.max_records
            )
            fetched = time.monotonic()
            fetching.inc(fetched - started)
            if not batch:
                self._raise_if_failed()
                continue
            await self.assigned.wait()
            self._raise_if_failed()
            async with self.lock:
                if generation != self._generation:
                    self._rewind(batch)
                    continue
                await meter.run(batch, self.handle, commit, fetched)

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"{self.name}: a rebalance callback failed") from self._failure

    def _rewind(self, batch: Batch) -> None:
        assignment = self.consumer.assignment()
        for tp, records in batch.items():
            if tp in assignment and records:
                self.consumer.seek(tp, records[0].offset)

    async def _commit(self, batch: Batch) -> None:
        offsets = {tp: records[-1].offset + 1 for tp, records in batch.items() if records}
        try:
            await self.consumer.commit(offsets)
        except CommitFailedError as exc:
            # The group moved on (rebalance): the new owner reads these records again, and
            # what they produce again is deduplicated downstream.
            log.warning("%s: offsets not committed, the group rebalanced: %s", self.name, exc)
        except KafkaError as exc:
            # The next batch's commit covers these offsets; until then a restart reads
            # them again (at least once).
            log.warning("%s: committing offsets failed (%r)", self.name, exc)
