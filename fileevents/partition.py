"""One task per assigned partition: its records strictly in offset order, one at a time.

Every event of one object key is on one partition (the stream keys its output by object
key), so this is what keeps two events of one key from ever being handled at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterable

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

Process = Callable[[ConsumerRecord[bytes, bytes], asyncio.Event], Awaitable[bool]]
"""Handle one record; False when stopped before it was done (it must not be committed)."""
OnDone = Callable[[TopicPartition, int], None]
"""Told the next offset to commit each time a record is done with."""


class PartitionWorker:
    """Handles the records fetched for one partition, in order; stops between records."""

    def __init__(self, tp: TopicPartition, process: Process, on_done: OnDone) -> None:
        self.tp = tp
        self.paused = False
        """Set by the fetch loop while it has paused fetching this partition."""
        self._process = process
        self._on_done = on_done
        self._records: deque[ConsumerRecord[bytes, bytes]] = deque()
        self._next_offset = -1
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"fileevents:{tp.topic}[{tp.partition}]")

    @property
    def next_offset(self) -> int:
        """The offset after the last record queued, or -1 before the first one."""
        return self._next_offset

    @property
    def backlog(self) -> int:
        """Records fetched and not handled yet."""
        return len(self._records)

    def add(self, records: Iterable[ConsumerRecord[bytes, bytes]]) -> None:
        """Queue fetched records; ones at offsets already handled are ignored."""
        for record in records:
            if record.offset >= self._next_offset:
                self._records.append(record)
                self._next_offset = record.offset + 1
        self._wake.set()

    def crash(self) -> BaseException | None:
        """Why the task ended if it did so unasked (a bug, or a handler leaking a
        cancellation): the partition would stall, so the fetch loop raises it."""
        if not self._task.done() or self._stopping.is_set():
            return None
        if self._task.cancelled():
            return asyncio.CancelledError(f"the worker of {self.tp} was cancelled")
        return self._task.exception() or RuntimeError(f"the worker of {self.tp} ended")

    def request_stop(self) -> None:
        """From now on, start no record; the one in progress finishes its current attempt."""
        self._stopping.set()
        self._wake.set()

    async def stop(self) -> None:
        """`request_stop`, then return once the record in progress is finished."""
        self.request_stop()
        await asyncio.wait([self._task])

    async def cancel(self) -> None:
        """Interrupt the handler in progress at once; its record stays uncommitted."""
        self._stopping.set()
        self._task.cancel()
        await asyncio.wait([self._task])

    async def _run(self) -> None:
        while not self._stopping.is_set():
            if not self._records:
                self._wake.clear()
                await self._wake.wait()
                continue
            record = self._records[0]
            if not await self._process(record, self._stopping):
                return
            self._records.popleft()
            self._on_done(self.tp, record.offset + 1)
