"""How the dispatcher wakes its waiting tasks: a few at a time, as the ones before take
records while more are ready. Records whose handlers never wait run one after the other in
the task already running (a fetched batch wakes at most three tasks, not one per record);
records whose handlers wait still get a task each, up to `max_concurrency`, twice as many
per turn of the event loop."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import TopicPartition
from consumer_support import fetched as record

from fileevents.partition import DONE, Dispatcher, PartitionState
from fileevents.processing import Job


async def until(check: Any, what: str) -> None:
    """Turns of the event loop until `check()` holds (at most 5 s)."""

    async def wait() -> None:
        while not check():
            await asyncio.sleep(0)

    try:
        await asyncio.wait_for(wait(), 5)
    except TimeoutError:
        raise AssertionError(f"not reached: {what}") from None


async def turns(count: int) -> None:
    """`count` turns of the event loop: what could happen without waiting has happened."""
    for _ in range(count):
        await asyncio.sleep(0)


def test_a_batch_that_never_waits_runs_in_one_or_two_tasks() -> None:
    async def scenario() -> None:
        ran_in: list[asyncio.Task[Any] | None] = []

        async def process(job: Job) -> int:
            ran_in.append(asyncio.current_task())
            assert job.task is asyncio.current_task()  # what the timeout watchdog cancels
            return DONE

        dispatcher = Dispatcher(process, lambda state: None, 64, lambda n: None)
        state = PartitionState(TopicPartition("t", 0))
        await until(lambda: len(dispatcher._idle) == 64, "every task waiting")
        for batch in range(3):
            ran_in.clear()
            start = batch * 500
            dispatcher.add(state, [record(start + i, b"k%d" % i) for i in range(500)])
            assert len(dispatcher._idle) == 63  # one woken, not one per record
            await until(lambda: len(ran_in) == 500, "the batch run")
            assert len(set(ran_in)) == 1
            await until(lambda: len(dispatcher._idle) == 64, "every task waiting again")
        assert state.commit_point() == 1500
        await dispatcher.close()

    asyncio.run(scenario())


def test_records_that_wait_get_a_task_each_up_to_max_concurrency() -> None:
    async def scenario() -> None:
        release = asyncio.Event()
        running: set[int] = set()
        most = [0]

        async def process(job: Job) -> int:
            running.add(job.record.offset)
            most[0] = max(most[0], len(running))
            await release.wait()
            running.discard(job.record.offset)
            return DONE

        dispatcher = Dispatcher(process, lambda state: None, 32, lambda n: None)
        state = PartitionState(TopicPartition("t", 0))
        await until(lambda: len(dispatcher._idle) == 32, "every task waiting")
        dispatcher.add(state, [record(i, b"k%d" % i) for i in range(100)])
        for _ in range(12):  # doubling: 1, 3, 7, 15, 31, 32 running, turn after turn
            await asyncio.sleep(0)
        assert len(running) == 32
        release.set()
        await until(lambda: state.commit_point() == 100, "every record done")
        assert most[0] == 32
        # A record made ready later (the next of a key, once the one before is done) wakes
        # a task too.
        release.clear()
        dispatcher.add(state, [record(100, b"again"), record(101, b"again")])
        await until(lambda: running == {100}, "the first of the key running")
        release.set()
        await until(lambda: state.commit_point() == 102, "both done, in order")
        await dispatcher.close()

    asyncio.run(scenario())


def test_drain_returns_once_the_records_in_flight_are_done() -> None:
    async def scenario() -> None:
        release = asyncio.Event()

        async def process(job: Job) -> int:
            await release.wait()
            return DONE

        dispatcher = Dispatcher(process, lambda state: None, 4, lambda n: None)
        state = PartitionState(TopicPartition("t", 0))
        await dispatcher.drain([PartitionState(TopicPartition("t", 1))])  # nothing in flight
        dispatcher.add(state, [record(i, b"k%d" % i) for i in range(3)])
        await until(lambda: state.in_flight == 3, "three records running")
        first = asyncio.create_task(dispatcher.drain([state]))
        second = asyncio.create_task(dispatcher.drain([state]))
        await turns(20)
        assert not first.done() and not second.done()
        first.cancel()  # one waiter cancelled: the other still waits, then returns
        await turns(20)
        assert not second.done()
        release.set()
        await asyncio.wait_for(second, 5)
        assert state.in_flight == 0 and first.cancelled()
        await dispatcher.close()

    asyncio.run(scenario())
