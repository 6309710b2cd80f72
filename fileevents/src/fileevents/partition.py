"""Per-key concurrency: events of different keys run at once, never two of one key.

The stream keys its output by object key, so every event of one key is on one partition and
in order there. `Dispatcher` runs up to `max_concurrency` events at a time over every
assigned partition: each partition's records are queued per key (a lane), and a lane hands
out its next record only once the one before it is done with. A record that is slow, or
failing and waiting for its retry, holds back its own key alone. With a dedupe store, a
handled event is done with once its id's write is acknowledged (`AWAITING_RECORD`, then
`recorded`): its task goes on at once, its key and its offset wait for the write. Records
become jobs (`prepare`: their ids read ahead and looked up in one batch) as they become
ready: at the fetch for a key with nothing in progress, else once the record before them is
done with, so a lookup never runs before this consumer's write of an earlier event of its key.

Offsets: `PartitionState` keeps the records handed out and not yet retired, in offset order.
The offset to commit is the lowest one not done with yet (or, when all are, the one after the
last); the ones done above it are recorded in the commit's metadata (`encode_finished`), and
a member that starts on the partition again skips them (`decode_finished`), so a restart
redoes only the events that were in progress, as in Confluent's Parallel Consumer.
"""

from __future__ import annotations

import asyncio
import base64
from collections import deque
from collections.abc import Awaitable, Callable, Iterable

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from fileevents.processing import AWAITING_RECORD as AWAITING_RECORD
from fileevents.processing import CLOSING, Job
from fileevents.processing import DONE as DONE
from fileevents.processing import INTERRUPTED as INTERRUPTED

Process = Callable[[Job], Awaitable[int]]
"""Handle one job's record: `DONE`, `INTERRUPTED` or `AWAITING_RECORD`."""
Prepare = Callable[["PartitionState", list[ConsumerRecord[bytes, bytes]]], list[Job]]
"""Make records of a partition jobs that may start (`EventProcessor.prepare`)."""
OnRecorded = Callable[[int], None]
"""Told how many jobs left `AWAITING_RECORD` were done with."""
OnDone = Callable[["PartitionState"], None]
"""Told each time a record of a partition is done with."""
OnSkipped = Callable[[int], None]
"""Told how many records were skipped as done before a restart."""

METADATA_PREFIX = "fileevents:1:"
"""What starts commit metadata this library wrote (a version, then the finished offsets)."""
MAX_METADATA_BYTES = 3000
"""The longest bitmap of finished offsets a commit carries (base64 makes it 4,000 bytes of
metadata, under the broker's default `offset.metadata.max.bytes` of 4,096): 24,000 offsets
above the commit point. Past that, the highest finished ones are not recorded (a restart
runs them again), never the other way round."""

RUN, QUEUED_ALREADY, DONE_BEFORE = 0, 1, 2
"""What `PartitionState.queue` did with a record."""


def encode_finished(commit: int, finished: Iterable[int]) -> str:
    """Commit metadata saying which offsets above `commit` are done with: bit i of the
    bitmap is offset `commit + 1 + i` (`commit` itself is not done, or it would be past)."""
    bits = 0
    limit = MAX_METADATA_BYTES * 8
    for offset in finished:
        index = offset - commit - 1
        if 0 <= index < limit:
            bits |= 1 << index
    if not bits:
        return ""
    raw = bits.to_bytes((bits.bit_length() + 7) // 8, "little")
    return METADATA_PREFIX + base64.urlsafe_b64encode(raw).decode("ascii")


def decode_finished(commit: int, metadata: str | None) -> set[int]:
    """The offsets `encode_finished(commit, ...)` recorded in `metadata`; empty for metadata
    of any other form (another tool's commit, or none)."""
    if not metadata or not metadata.startswith(METADATA_PREFIX):
        return set()
    try:
        raw = base64.urlsafe_b64decode(metadata[len(METADATA_PREFIX) :].encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        return set()
    bits = int.from_bytes(raw[:MAX_METADATA_BYTES], "little")
    found: set[int] = set()
    index = 0
    while bits:
        if bits & 1:
            found.add(commit + 1 + index)
        bits >>= 1
        index += 1
    return found


class PartitionState:
    """One assigned partition: its records by key, its offsets handed out and not retired."""

    def __init__(self, tp: TopicPartition, done_before: set[int] | None = None) -> None:
        self.tp = tp
        self.paused = False
        """Set while its backlog is at `max_buffered`: the fetch loop hands out no more of
        it (held in aiokafka's buffer, not paused there) until half of it is retired."""
        self.stopping = asyncio.Event()
        """Set on revoke and stop: no record of it starts any more."""
        self.lanes: dict[bytes | None, deque[ConsumerRecord[bytes, bytes]] | None] = {}
        """The keys with a record ready or running, each with the records queued behind that
        one, in order (None: none; most keys, so no deque is made for them)."""
        self.in_flight = 0
        """Its records running, or done running and their dedupe records being written."""
        self.idle_waiter: asyncio.Future[None] | None = None
        """While someone waits for `in_flight` to reach 0 (`until_idle`): what to resolve
        then (`went_idle`). None the rest of the time: nothing per record."""
        self._offsets: deque[int] = deque()
        """Offsets handed out and not retired, ascending; the first is not done yet."""
        self._finished: set[int] = set()
        """Offsets done with, above the first of `_offsets`."""
        self._next_offset = -1
        self._done_before = done_before or set()

    @property
    def next_offset(self) -> int:
        """The offset after the last record queued, or -1 before the first one."""
        return self._next_offset

    @property
    def backlog(self) -> int:
        """Records handed out and not retired (running, waiting, or done above the first
        unfinished one): what `max_buffered` bounds."""
        return len(self._offsets)

    async def until_idle(self) -> None:
        """Return once none of its records is in flight."""
        while self.in_flight:
            waiter = self.idle_waiter
            if waiter is None:
                waiter = self.idle_waiter = asyncio.get_running_loop().create_future()
            await asyncio.shield(waiter)  # one waiter cancelled leaves the others theirs

    def went_idle(self) -> None:
        """`in_flight` reached 0: wake whoever waits (`until_idle`)."""
        waiter, self.idle_waiter = self.idle_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def commit_point(self) -> int | None:
        """The offset to commit: the lowest not done with, else the next one; None before
        anything was queued."""
        if self._offsets:
            return self._offsets[0]
        return None if self._next_offset < 0 else self._next_offset

    def metadata(self) -> str:
        """The commit metadata recording the offsets done above `commit_point`."""
        point = self.commit_point()
        if point is None or not self._finished:
            return ""
        return encode_finished(point, self._finished)

    def queue(self, record: ConsumerRecord[bytes, bytes]) -> int:
        """Take `record` (fetched in offset order): `RUN` it, or not (`QUEUED_ALREADY`), or
        `DONE_BEFORE` a restart (it counts as done at once)."""
        offset = record.offset
        if offset < self._next_offset:
            return QUEUED_ALREADY
        self._next_offset = offset + 1
        self._offsets.append(offset)
        if self._done_before and offset in self._done_before:
            self._done_before.discard(offset)
            self.finish(offset)
            return DONE_BEFORE
        return RUN

    def finish(self, offset: int) -> None:
        """`offset` is done with: retire it and every done one right after it."""
        offsets = self._offsets
        if offsets and offsets[0] == offset:
            offsets.popleft()
            finished = self._finished
            while offsets and offsets[0] in finished:
                finished.discard(offsets.popleft())
        else:
            self._finished.add(offset)


READY_PER_TASK = 2
"""Records that may start at once (`Dispatcher.full`) per handler task (at least 128 in
all): enough that no task waits for the next fetch, few enough that records die young.
Holding a few fetches' worth of records (8 partitions' each) made them outlive the garbage
collector's young generations, and every full collection then walked them: bounded so, a
no-op handler's event costs about 1.7 µs of CPU less (BENCHMARKS.md, issue 34)."""


class Dispatcher:
    """Up to `max_concurrency` records at once, over every partition, one per key at a time."""

    def __init__(
        self,
        process: Process,
        on_done: OnDone,
        max_concurrency: int,
        on_skipped: OnSkipped,
        prepare: Prepare | None = None,
        on_recorded: OnRecorded | None = None,
    ) -> None:
        self._process = process
        self._on_done = on_done
        self._on_skipped = on_skipped
        self._prepare: Prepare = prepare or _jobs
        self._on_recorded = on_recorded or _not_counted
        self._ready: deque[Job] = deque()
        """Jobs that may start now: the first record not done with of their key (one per
        key), prepared (read ahead, looked up) together as they became ready."""
        self._idle: deque[asyncio.Future[None]] = deque()
        """One future per task waiting for work, woken one at a time (`_wake_one`)."""
        self._waking = 0
        """Tasks woken and not running yet: while one is, no other is woken."""
        self._stopped = False
        self._ready_high = max(128, READY_PER_TASK * max_concurrency)
        self.room = asyncio.Event()
        """Set while fewer records may start than `full` allows (half of it, once full)."""
        self.room.set()
        self.in_flight = 0
        """Records being run right now, over every partition."""
        self._tasks = [
            asyncio.create_task(self._work(), name=f"fileevents:handler-{index}")
            for index in range(max_concurrency)
        ]

    def add(self, state: PartitionState, records: Iterable[ConsumerRecord[bytes, bytes]]) -> None:
        """Queue fetched records of `state`'s partition, in offset order."""
        lanes = state.lanes
        skipped = 0
        fresh = []
        for record in records:
            offset = record.offset
            if offset >= state._next_offset and not state._done_before:
                state._next_offset = offset + 1  # `state.queue(record)`, inlined: per record
                state._offsets.append(offset)
            else:
                taken = state.queue(record)
                if taken != RUN:
                    skipped += taken == DONE_BEFORE
                    continue
            key = record.key
            if key not in lanes:
                lanes[key] = None
                fresh.append(record)
                continue
            behind = lanes[key]
            if behind is None:
                lanes[key] = behind = deque()
            behind.append(record)
        if skipped:
            self._on_skipped(skipped)
            self._on_done(state)
        if fresh:
            self._readied(self._prepare(state, fresh))

    def _readied(self, jobs: list[Job]) -> None:
        """`jobs` may start: queued, and a waiting task woken."""
        self._ready.extend(jobs)
        if not self._waking:
            self._wake_one()

    def _wake_one(self) -> None:
        """Wake one waiting task, if any. Tasks are woken a few at a time, as the ones before
        take records while more are ready (`_work`): records whose handlers do not wait run
        one after the other in the task that is running, and a batch wakes at most three
        tasks, where waking one per record made most of them find nothing to do (about
        1.5 µs per record); handlers that wait get a task each, twice as many per turn of
        the event loop."""
        idle = self._idle
        while idle:
            waiting = idle.popleft()
            if not waiting.done():
                waiting.set_result(None)
                self._waking += 1
                return

    def recorded(self, jobs: list[Job]) -> None:
        """`jobs`, left `AWAITING_RECORD`, have their dedupe records written: done with, and
        the next record of each one's key may start (prepared together)."""
        advanced: dict[PartitionState, list[ConsumerRecord[bytes, bytes]]] = {}
        for job in jobs:
            state = job.state
            state.in_flight -= 1
            if not state.in_flight and state.idle_waiter is not None:
                state.went_idle()
            following = self._advance(state, job.record)
            if following is not None and not state.stopping.is_set():
                advanced.setdefault(state, []).append(following)
            elif state not in advanced:
                advanced[state] = []
        self._on_recorded(len(jobs))
        for state, records in advanced.items():
            self._on_done(state)
            if records:
                self._readied(self._prepare(state, records))

    @staticmethod
    def _advance(
        state: PartitionState, record: ConsumerRecord[bytes, bytes]
    ) -> ConsumerRecord[bytes, bytes] | None:
        """`record` is done with: retire its offset; the next record of its key, if any."""
        lanes, key = state.lanes, record.key
        behind = lanes[key]
        following = None
        if behind:
            following = behind.popleft()
        else:
            del lanes[key]
        state.finish(record.offset)
        return following

    def full(self) -> bool:
        """Whether enough records may start now that fetching more can wait (`room` is set
        again when half of them have started). Records waiting behind a record of their key
        do not count: a slow key holds back only its own partition (by its pause)."""
        if len(self._ready) < self._ready_high:
            return False
        self.room.clear()
        return True

    def crash(self) -> BaseException | None:
        """Why a task ended unasked (a bug, or a handler leaking a cancellation)."""
        if self._stopped:
            return None
        for task in self._tasks:
            if task.done():
                if task.cancelled():
                    return asyncio.CancelledError("a handler task was cancelled")
                return task.exception() or RuntimeError("a handler task ended")
        return None

    async def drain(self, states: Iterable[PartitionState]) -> None:
        """Start no more records of `states`; return once the ones running are finished
        (their current attempt: `stopping` is set)."""
        states = list(states)
        for state in states:
            state.stopping.set()
        for state in states:
            await state.until_idle()

    async def close(self) -> None:
        """End the tasks (once every partition is drained, or to cancel what runs)."""
        self._stopped = True
        pending = set(self._tasks)
        while pending:
            # Again every second for a task still there: on Python 3.10 a cancellation that
            # lands with a handler's timeout is taken for the timeout's (processing.py).
            for task in pending:
                task.cancel(CLOSING)
            _, pending = await asyncio.wait(pending, timeout=1.0)

    async def _work(self) -> None:
        ready, idle = self._ready, self._idle
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()
        woken = False
        while True:
            if not ready:
                waiting: asyncio.Future[None] = loop.create_future()
                idle.append(waiting)
                try:
                    await waiting
                finally:
                    if waiting.done() and not waiting.cancelled():
                        self._waking -= 1
                woken = True
                continue
            job = ready.popleft()
            if ready:
                # For the next records, should this one's handler wait: a task just woken
                # wakes two (handlers that wait get a task each in a few turns of the loop,
                # doubling), a task going on wakes one unless one is woken already.
                if woken:
                    self._wake_one()
                    if len(ready) > 1:
                        self._wake_one()
                elif not self._waking:
                    self._wake_one()
            woken = False
            if len(ready) <= self._ready_high // 2 and not self.room.is_set():
                self.room.set()
            state = job.state
            if state.stopping.is_set():
                continue  # revoked or stopping: its records stay uncommitted
            job.task = me
            state.in_flight += 1
            self.in_flight += 1
            result = INTERRUPTED
            try:
                result = await self._process(job)
            finally:
                self.in_flight -= 1
                if result != AWAITING_RECORD:  # else in flight until `recorded`
                    state.in_flight -= 1
                    if not state.in_flight and state.idle_waiter is not None:
                        state.went_idle()
            if result != DONE:
                continue  # interrupted: stopping, its key stays blocked; or recording
            following = self._advance(state, job.record)
            if following is not None:
                ready.extend(self._prepare(state, [following]))
            self._on_done(state)


def _jobs(state: PartitionState, records: list[ConsumerRecord[bytes, bytes]]) -> list[Job]:
    return [Job(state, record) for record in records]


def _not_counted(jobs: int) -> None:
    return None
