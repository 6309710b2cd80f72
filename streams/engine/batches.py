"""A stage's unit of work, for either engine: a batch of records per partition, and its
accounting (StageMeter: handled, then committed, timed and counted in streams.metrics)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from streams import metrics
from streams.engine.records import TopicPartition

Batch = dict[TopicPartition, list[Any]]
"""Records (the engine's ConsumedRecord shape: confluent_kafka.Message as consumed, or an
Unreadable in a record's place; no wrapper per record) per topic partition, in offset order.
`Any`, not ConsumedRecord: the stages pass them to functions typed for confluent_kafka's
Message."""


class StageMeter:
    """One stage's batch accounting, for either engine's loop: the time the loop waited for a
    batch (phase `fetch`: from the last batch's end to this one's hand-over), the batch handled,
    then its offsets committed (when the stage commits them), timed and counted in
    streams.metrics. A stage whose `fetch` time is small against the wall clock is busy: its
    batches queue behind it."""

    def __init__(self, stage: str) -> None:
        self.waiting = metrics.STAGE_SECONDS.labels(stage, "fetch")
        self.handling = metrics.STAGE_SECONDS.labels(stage, "handle")
        self.committing = metrics.STAGE_SECONDS.labels(stage, "commit")
        self.batches = metrics.STAGE_BATCHES.labels(stage)
        self.handled = metrics.STAGE_RECORDS.labels(stage)
        self._idle_since: float | None = None
        """When the last batch ended (None before the first)."""

    async def run(
        self,
        batch: Batch,
        handle: Callable[[Batch], Awaitable[None]],
        commit: Callable[[Batch], Awaitable[None]] | None,
        since: float,
    ) -> None:
        """Handle `batch` (its handling time counted from `since`, when the loop took it),
        then commit it."""
        if self._idle_since is not None:
            self.waiting.inc(max(0.0, since - self._idle_since))
        self._idle_since = None  # a batch that fails is no wait
        await handle(batch)
        done = time.monotonic()
        self.handling.inc(done - since)
        if commit is not None:
            await commit(batch)
            self.committing.inc(time.monotonic() - done)
        self.batches.inc()
        self.handled.inc(sum(len(records) for records in batch.values()))
        self._idle_since = time.monotonic()
