"""A stage's unit of work, for either engine: a batch of records per partition, and its
accounting (StageMeter: handled, then committed, timed and counted in streams.metrics)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import TopicPartition

from streams import metrics

Batch = dict[TopicPartition, list[Any]]
"""Records (confluent_kafka.Message, as consumed: no wrapper per record) per topic partition,
in offset order."""


class StageMeter:
    """One stage's batch accounting, for either engine's loop: a batch is handled, then its
    offsets committed (when the stage commits them), timed and counted in streams.metrics."""

    def __init__(self, stage: str) -> None:
        self.handling = metrics.STAGE_SECONDS.labels(stage, "handle")
        self.committing = metrics.STAGE_SECONDS.labels(stage, "commit")
        self.batches = metrics.STAGE_BATCHES.labels(stage)
        self.handled = metrics.STAGE_RECORDS.labels(stage)

    async def run(
        self,
        batch: Batch,
        handle: Callable[[Batch], Awaitable[None]],
        commit: Callable[[Batch], Awaitable[None]] | None,
        since: float,
    ) -> None:
        """Handle `batch` (its handling time counted from `since`), then commit it."""
        await handle(batch)
        done = time.monotonic()
        self.handling.inc(done - since)
        if commit is not None:
            await commit(batch)
            self.committing.inc(time.monotonic() - done)
        self.batches.inc()
        self.handled.inc(sum(len(records) for records in batch.values()))
