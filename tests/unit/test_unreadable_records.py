"""Records librdkafka cannot read, offline (issue 31; on the broker:
tests/integration/test_attack_unreadable.py): the member steps past an unreadable record
once per record, inside a compressed batch too; a partition that does not move while records
wait on it is named, and reported as the stage's trouble; one fetch's memory is bounded from
the raw topics' limit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import TopicPartition
from confluent_kafka import KafkaError
from confluent_kafka import TopicPartition as RdTopicPartition

from streams.engine.librdkafka.consumer import (
    PARTITION_STALL_S,
    RdBatchLoop,
    Unreadable,
    consumer_config,
    fetch_bounds,
    headers_unreadable,
)
from streams.engine.topics import RAW_MAX_MESSAGE_BYTES
from streams.progress import STUCK_AFTER_S, Progress, StallWatch

TOPIC = "files.raw"
TP = TopicPartition(TOPIC, 0)


class Fetched:
    """A confluent_kafka.Message as consume() returns it: a record, or an error tied to an
    offset."""

    def __init__(self, offset: int, error: KafkaError | None = None, partition: int = 0) -> None:
        self._offset = offset
        self._error = error
        self._partition = partition

    def error(self) -> KafkaError | None:
        return self._error

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def headers(self) -> Any:
        raise SystemError("returned a result with an exception set") from UnicodeDecodeError(
            "utf-8", b"\xff\xfeX", 0, 1, "invalid start byte"
        )


class FakeConsumer:
    def __init__(self) -> None:
        self.seeks: list[int] = []
        self.positions: dict[int, int] = {}
        self.high = 0

    def seek(self, partition: RdTopicPartition) -> None:
        self.seeks.append(partition.offset)

    def position(self, partitions: list[RdTopicPartition]) -> list[RdTopicPartition]:
        return [
            RdTopicPartition(p.topic, p.partition, self.positions.get(p.partition, -1001))
            for p in partitions
        ]

    def get_watermark_offsets(self, partition: RdTopicPartition, cached: bool) -> tuple[int, int]:
        return 0, self.high


@pytest.fixture
def member() -> Iterator[RdBatchLoop]:
    async def handle(batch: Any) -> None:
        return None

    loop = RdBatchLoop(
        "normalize",
        {"bootstrap.servers": "127.0.0.1:9", "group.id": "unit"},
        [TOPIC],
        handle,
        commits_offsets=False,
        max_records=10,
        within_ms=100,
    )
    real = loop.consumer
    loop.consumer = FakeConsumer()  # type: ignore[assignment]
    loop.owned = {TP}
    try:
        yield loop
    finally:
        real.close()


def bad(offset: int) -> Fetched:
    return Fetched(offset, KafkaError(KafkaError._BAD_COMPRESSION, "Decompression failed"))


def fetch(member: RdBatchLoop, messages: list[Fetched]) -> list[Any]:
    """What the member hands on from one consume() result (as RdBatchLoop._consume)."""
    stepped: set[TopicPartition] = set()
    return [
        usable
        for message in messages
        if (usable := member._usable(message, stepped)) is not None  # type: ignore[arg-type]
    ]


def test_an_unreadable_record_is_stepped_past_once_and_handed_on_in_its_place(
    member: RdBatchLoop,
) -> None:
    consumer: FakeConsumer = member.consumer  # type: ignore[assignment]
    member._fetching_from[TP] = 7  # its committed offset
    # librdkafka reported the batch at 7 twice in one fetch (two fetches before the seek).
    [unreadable] = fetch(member, [Fetched(6), bad(7), bad(7)])[1:]
    assert isinstance(unreadable, Unreadable)
    assert (unreadable.topic(), unreadable.partition(), unreadable.offset()) == (TOPIC, 0, 7)
    assert unreadable.key() is None and unreadable.value() is None
    assert unreadable.headers() is None
    assert consumer.seeks == [8]
    assert "files.raw[0]@7 cannot be read: _BAD_COMPRESSION" in unreadable.describe()


def test_a_compressed_batch_is_stepped_past_one_record_at_a_time(member: RdBatchLoop) -> None:
    """librdkafka names a compressed batch by its first offset, whatever offset it was
    fetched from: reported again after a step, the record the member fetched from is the
    unreadable one."""
    consumer: FakeConsumer = member.consumer  # type: ignore[assignment]
    offsets = [item.offset() for n in range(3) for item in fetch(member, [bad(10)])]
    assert offsets == [10, 11, 12]
    assert consumer.seeks == [11, 12, 13]
    # Then a batch further on is reported at its own offset.
    [later] = fetch(member, [Fetched(13), bad(20)])[1:]
    assert later.offset() == 20 and consumer.seeks[-1] == 21


def test_errors_of_no_record_and_of_other_members_partitions_are_not_stepped_past(
    member: RdBatchLoop,
) -> None:
    consumer: FakeConsumer = member.consumer  # type: ignore[assignment]
    other = Fetched(3, KafkaError(KafkaError._BAD_COMPRESSION, "x"), partition=5)
    transport = Fetched(-1001, KafkaError(KafkaError._TRANSPORT, "broker down"))
    assert fetch(member, [other, transport]) == []
    assert consumer.seeks == []


def test_unreadable_headers_are_named_with_where_the_record_is() -> None:
    message = Fetched(42)
    try:
        message.headers()
    except SystemError as exc:
        reason = headers_unreadable(message, exc)
    assert reason.startswith("the headers of the record at files.raw[0]@42 cannot be read: ")
    assert "a header name is not UTF-8 (b'\\xff\\xfeX'" in reason


def test_a_partition_whose_position_does_not_move_is_named(member: RdBatchLoop) -> None:
    consumer: FakeConsumer = member.consumer  # type: ignore[assignment]
    consumer.high = 5
    owned = [RdTopicPartition(TOPIC, 0)]
    assert member._lag(owned) is None  # nothing consumed, nothing committed: unknown
    member._fetching_from[TP] = 2  # committed: librdkafka knows no position before a record
    assert member._lag(owned) == 3 and member.stalled == []
    position, _ = member._positions[TP]
    member._positions[TP] = (position, time.monotonic() - PARTITION_STALL_S - 1)
    assert member._lag(owned) == 3
    assert member.stalled == [
        f"{TOPIC}[0]: 3 records waiting, its position 2 unmoved for {PARTITION_STALL_S + 1:.0f} s"
    ]
    consumer.positions[0] = 3  # it moves
    member._lag(owned)
    assert member.stalled == []


def test_a_stalled_partition_is_the_stage_s_trouble_though_others_move() -> None:
    clock = [1000.0]
    progress = Progress(lambda: clock[0])
    watch = StallWatch(progress, "normalize", lambda: clock[0])
    stalled = ["files.raw[0]: 3 records waiting, its position 2 unmoved for 10 s"]
    for handled in range(8):  # the stage handles other partitions meanwhile
        watch.sample(float(handled), 3, clock[0], stalled)
        clock[0] += 1.0
    assert clock[0] - 1000.0 > STUCK_AFTER_S
    assert progress.stuck()["normalize"]["why"] == f"partition {stalled[0]}"
    watch.sample(9.0, 0, clock[0], [])
    assert progress.stuck() == {}


def test_one_fetch_is_bounded_from_the_raw_topics_limit() -> None:
    bounds = fetch_bounds(RAW_MAX_MESSAGE_BYTES)
    whole = RAW_MAX_MESSAGE_BYTES + 64 * 1024
    assert bounds["fetch.max.bytes"] == bounds["max.partition.fetch.bytes"] == whole
    # librdkafka grows a zstd output buffer threefold: a whole raw record always fits.
    assert bounds["receive.message.max.bytes"] >= 3 * whole
    assert bounds["receive.message.max.bytes"] >= bounds["fetch.max.bytes"] + 512
    assert bounds["receive.message.max.bytes"] < 100_000_000  # librdkafka's default
    common: dict[str, Any] = {
        "client_id": "c",
        "group_id": "g",
        "group_instance_id": None,
        "group_protocol": "consumer",
        "session_timeout_s": 10.0,
    }
    bounded = consumer_config({}, **common, max_record_bytes=RAW_MAX_MESSAGE_BYTES)
    assert bounds.items() <= bounded.items()
    # A full queue postpones the next fetch by 10 ms, not librdkafka's default second.
    assert bounded["fetch.queue.backoff.ms"] == 10
    assert "receive.message.max.bytes" not in consumer_config({}, **common)


def test_the_member_accepts_the_bounds() -> None:
    """librdkafka refuses receive.message.max.bytes below fetch.max.bytes + 512."""

    async def handle(batch: Any) -> None:
        return None

    config = consumer_config(
        {"bootstrap.servers": "127.0.0.1:9"},
        client_id="c",
        group_id="g",
        group_instance_id=None,
        group_protocol="consumer",
        session_timeout_s=10.0,
        max_record_bytes=RAW_MAX_MESSAGE_BYTES,
    )
    loop = RdBatchLoop(
        "normalize", config, [TOPIC], handle, commits_offsets=False, max_records=1, within_ms=1
    )
    loop.consumer.close()
    assert asyncio.iscoroutinefunction(loop.commit)
