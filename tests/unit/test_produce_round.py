"""A round whose `produce` refuses a record before queueing it (larger than the client's
`message.max.bytes`, an unknown topic): the records from it on are never queued, which the
round says (`unqueued`, an error report each), so a transaction never commits without them;
and the round still finishes once the records given a callback before it have reported."""

from __future__ import annotations

import asyncio
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from streams.core.records import OutRecord
from streams.engine.librdkafka.producer import produce_round


class RefusingProducer:
    """Queues records until the `refuse_at`-th, which `produce` itself refuses."""

    def __init__(self, refuse_at: int) -> None:
        self.refuse_at = refuse_at
        self.callbacks: list[Any] = []

    def produce(self, topic: str, value: bytes, key: bytes, partition: int, **kwargs: Any) -> None:
        if len(self.callbacks) == self.refuse_at:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"))
        self.callbacks.append(kwargs["on_delivery"])


class Delivered:
    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 7


def records(count: int) -> list[OutRecord]:
    return [OutRecord("t", b"v", b"k", ()) for _ in range(count)]


def test_a_refused_produce_marks_the_rest_unqueued_and_never_done_early() -> None:
    async def run() -> None:
        producer = RefusingProducer(refuse_at=2)
        round_ = await produce_round(producer, records(4))  # type: ignore[arg-type]
        assert round_.unqueued is not None
        assert round_.unqueued.code() == KafkaError.MSG_SIZE_TOO_LARGE
        assert [report[0] is not None for report in round_.reports[2:] if report] == [True, True]
        assert not round_.done.done()  # the first two have not reported yet
        for callback in producer.callbacks:
            callback(None, Delivered())
        await asyncio.wait_for(round_.done, 1)
        assert round_.reports[0] == (None, 0, 7)

    asyncio.run(run())


def test_with_only_some_records_tracked_the_count_stays_right() -> None:
    async def run() -> None:
        producer = RefusingProducer(refuse_at=3)
        # Only the last record gets a report (the transactional path's last per partition).
        round_ = await produce_round(producer, records(5), {4})  # type: ignore[arg-type]
        assert round_.unqueued is not None
        await asyncio.wait_for(round_.done, 1)  # the tracked one was never queued: done
        assert round_.remaining == 0

    asyncio.run(run())
