"""Batches of Faust events that are acknowledged only when their batch was handled.

Faust's `Stream.take_events` acknowledges a batch in a `finally`, so a batch whose handler
was cancelled mid-way (worker shutdown while Kafka is unreachable, say) would still have its
offsets committed: a silent loss. This is the same buffering, with one change: the events
are acknowledged when the consumer asks for the next batch, which it does only after the
previous one was handled. A cancelled or failed batch is never acknowledged, so it is read
again after a restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from faust.types import EventT, StreamT
from mode.utils.futures import notify


async def acked_batches(
    stream: StreamT[Any], max_events: int, within_s: float
) -> AsyncIterator[list[EventT[Any]]]:
    """Yield lists of at most `max_events` events, flushed at least every `within_s`."""
    buffer: list[EventT[Any]] = []
    buffer_full = asyncio.Event()
    buffer_consumed = asyncio.Event()
    consuming: asyncio.Future[None] | None = None
    channel_it = stream.channel.__aiter__()

    async def add_to_buffer(value: Any) -> Any:
        nonlocal consuming
        if consuming is not None:
            try:
                await consuming
            finally:
                consuming = None
        event = stream.current_event
        if event is None:
            raise RuntimeError("batch buffer found no current event")
        buffer.append(event)
        if len(buffer) >= max_events:
            buffer_full.set()
            buffer_consumed.clear()
            await stream.wait(buffer_consumed)  # type: ignore[attr-defined]
        return value

    previous_acks = stream.enable_acks
    stream.enable_acks = False
    stream.add_processor(add_to_buffer)
    stream._enable_passive(channel_it)  # type: ignore[attr-defined]
    try:
        while not stream.should_stop:
            await stream.wait_for_stopped(buffer_full, timeout=within_s)  # type: ignore[attr-defined]
            if not buffer:
                continue
            consuming = asyncio.get_running_loop().create_future()
            batch = list(buffer)
            buffer.clear()
            yield batch
            # Reached only when the consumer came back for more: the batch was handled.
            for event in batch:
                await stream.ack(event)
            notify(consuming)
            buffer_full.clear()
            buffer_consumed.set()
    finally:
        stream.enable_acks = previous_acks
        stream._processors.remove(add_to_buffer)  # type: ignore[attr-defined]
