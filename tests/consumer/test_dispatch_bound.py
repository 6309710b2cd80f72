"""How many fetched records the dispatcher lets the fetch loop hand it before it waits
(`Dispatcher.full`, `room`): about two per handler task that may start at once, so records
die young; records queued behind a running record of their key do not count, so a slow key
never holds the other partitions' fetching back."""

from __future__ import annotations

import asyncio

from aiokafka import TopicPartition
from consumer_support import fetched as record

from fileevents.partition import DONE, READY_PER_TASK, Dispatcher, PartitionState
from fileevents.processing import Job


def test_full_once_enough_records_may_start_and_room_again_at_half() -> None:
    async def scenario() -> None:
        release = asyncio.Event()
        started: list[int] = []

        async def process(job: Job) -> int:
            started.append(job.record.offset)
            await release.wait()
            return DONE

        concurrency = 100
        dispatcher = Dispatcher(process, lambda state: None, concurrency, lambda n: None)
        state = PartitionState(TopicPartition("t", 0))
        high = READY_PER_TASK * concurrency
        # `concurrency` start at once; the rest wait, ready. One short of the bound: not full.
        dispatcher.add(state, [record(i, b"k%d" % i) for i in range(concurrency + high - 1)])
        await asyncio.sleep(0)
        assert len(started) == concurrency
        assert not dispatcher.full() and dispatcher.room.is_set()
        dispatcher.add(state, [record(concurrency + high - 1, b"last")])
        assert dispatcher.full() and not dispatcher.room.is_set()
        # Records of one key already running wait behind it: they never count.
        dispatcher.add(state, [record(10_000 + i, b"k0") for i in range(5_000)])
        assert len(dispatcher._ready) == high
        release.set()
        await asyncio.wait_for(dispatcher.room.wait(), 5)
        assert len(dispatcher._ready) <= high // 2
        await dispatcher.close()

    asyncio.run(scenario())


def test_a_slow_key_does_not_make_the_dispatcher_full() -> None:
    async def scenario() -> None:
        release = asyncio.Event()

        async def process(job: Job) -> int:
            if job.record.key == b"slow":
                await release.wait()
            return DONE

        dispatcher = Dispatcher(process, lambda state: None, 4, lambda n: None)
        state = PartitionState(TopicPartition("t", 0))
        dispatcher.add(state, [record(i, b"slow") for i in range(10_000)])
        await asyncio.sleep(0)
        assert not dispatcher.full()
        release.set()
        await dispatcher.close()

    asyncio.run(scenario())
