"""StageMeter (streams.engine.batches): the time a stage's loop waited for each batch (phase
`fetch`), beside handling and committing, so that `make bench` and the dashboard show whether a
stage is busy or waits for records (issue 32 item 8)."""

from __future__ import annotations

import asyncio
import time

from aiokafka import TopicPartition
from prometheus_client import REGISTRY

from streams.engine.batches import Batch, StageMeter


def seconds(stage: str, phase: str) -> float:
    value = REGISTRY.get_sample_value(
        "storage_events_stage_seconds_total", {"stage": stage, "phase": phase}
    )
    return value or 0.0


def test_the_wait_between_batches_is_counted_as_fetch_and_the_first_batch_waits_nothing() -> None:
    stage = "meter-test"
    meter = StageMeter(stage)
    batch: Batch = {TopicPartition("t", 0): [object(), object()]}
    handled: list[Batch] = []

    async def handle(taken: Batch) -> None:
        handled.append(taken)

    async def scenario() -> None:
        before = seconds(stage, "fetch")
        await meter.run(batch, handle, None, since=time.monotonic())  # the first: no wait
        assert seconds(stage, "fetch") == before
        ended = meter._idle_since
        assert ended is not None
        await asyncio.sleep(0.01)  # the loop waits for the next batch
        taken = time.monotonic()
        await meter.run(batch, handle, None, since=taken)
        assert abs(seconds(stage, "fetch") - before - (taken - ended)) < 1e-9
        assert taken - ended >= 0.01

    asyncio.run(scenario())
    assert handled == [batch, batch]
    assert REGISTRY.get_sample_value("storage_events_stage_records_total", {"stage": stage}) == 4
