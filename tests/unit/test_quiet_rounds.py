"""A producer that reports only failures (stage one's): its rounds are done only when
QuietRounds settles them, each failure lands in its own record's report (the oldest of
identical records first), and a failure of a round queued after the settled ones waits for
that round."""

from __future__ import annotations

import asyncio

from confluent_kafka import KafkaError

from streams.core.records import OutRecord
from streams.engine.librdkafka.producer import QuietRounds, Round


class Failed:
    """The message of a failure report, as librdkafka hands it back."""

    def __init__(self, record: OutRecord) -> None:
        self.record = record

    def topic(self) -> str:
        return self.record.topic

    def key(self) -> bytes | None:
        return self.record.key

    def value(self) -> bytes | None:
        return self.record.value


def record(value: bytes, key: bytes = b"k") -> OutRecord:
    return OutRecord("t", value, key, ())


TOO_LARGE = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large")


def test_rounds_are_done_only_once_settled_with_their_failures_in_place() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        quiet = QuietRounds()
        first = [record(b"a"), record(b"b"), record(b"c")]
        second = [record(b"d"), record(b"e")]
        round_1, round_2 = Round(loop, 3, 1), Round(loop, 2, 1)
        quiet.queued(round_1, first)
        quiet.queued(round_2, second)
        quiet.failed(TOO_LARGE, Failed(first[1]))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        assert not round_1.done.done() and not round_2.done.done()

        quiet.settle(quiet.waiting())
        await asyncio.wait_for(asyncio.gather(round_1.done, round_2.done), 1)
        assert round_1.reports == [None, (TOO_LARGE, -1, -1), None]
        assert round_2.reports == [None, None]
        assert quiet.waiting() == []

    asyncio.run(run())


def test_identical_records_take_their_failures_oldest_first() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        quiet = QuietRounds()
        same = record(b"same")
        round_1, round_2 = Round(loop, 2, 1), Round(loop, 1, 1)
        quiet.queued(round_1, [same, same])
        quiet.queued(round_2, [same])
        quiet.failed(TOO_LARGE, Failed(same))  # type: ignore[arg-type]
        quiet.failed(TOO_LARGE, Failed(same))  # type: ignore[arg-type]
        quiet.settle(quiet.waiting())
        await asyncio.wait_for(asyncio.gather(round_1.done, round_2.done), 1)
        assert round_1.reports == [(TOO_LARGE, -1, -1), (TOO_LARGE, -1, -1)]
        assert round_2.reports == [None]

    asyncio.run(run())


def test_a_failure_of_a_round_queued_after_the_settled_ones_waits_for_it() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        quiet = QuietRounds()
        round_1 = Round(loop, 1, 1)
        quiet.queued(round_1, [record(b"a")])
        settled = quiet.waiting()  # the out-queue was empty after this: round 1 is done
        late = [record(b"z")]
        round_2 = Round(loop, 1, 1)
        quiet.queued(round_2, late)
        quiet.failed(TOO_LARGE, Failed(late[0]))  # type: ignore[arg-type]
        quiet.settle(settled)
        await asyncio.wait_for(round_1.done, 1)
        assert round_1.reports == [None]
        assert not round_2.done.done()

        quiet.settle(quiet.waiting())
        await asyncio.wait_for(round_2.done, 1)
        assert round_2.reports == [(TOO_LARGE, -1, -1)]

    asyncio.run(run())


def test_records_never_queued_keep_their_own_error() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        quiet = QuietRounds()
        records = [record(b"a"), record(b"b")]
        round_ = Round(loop, 2, 1)
        round_.fail_rest(1, TOO_LARGE, set())  # `produce` refused the second
        quiet.queued(round_, records)
        assert not round_.done.done()
        quiet.settle(quiet.waiting())
        await asyncio.wait_for(round_.done, 1)
        assert round_.reports == [None, (TOO_LARGE, -1, -1)]
        assert round_.unqueued is TOO_LARGE

    asyncio.run(run())
