"""Gathered emit transactions under faults, on a real broker: four partitions' chains of parts
commit as the emit stage commits them (a partition's next part only once the one before is
done, `queued_behind` saying which partitions have one waiting), so that after the first
transaction each one carries several partitions' parts (`MemberTransactions._gather`). One
transaction of them fails once (its offsets refused with an error that needs an abort, its
commit refused the same way, or its commit committing and then not returning in time): it is
aborted and tried again, or found committed, as a whole.

After every fault: every record readable once (read_committed), each key's records in the
order they were committed, each changelog partition ending with its partition's last part, and
every input partition's offset committed to its end.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import TopicPartition
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from support.kafka_io import committed, create_topic, read_topic

from streams.core.records import OutRecord
from streams.engine.librdkafka import transactions
from streams.engine.librdkafka.transactions import MemberTransactions
from streams.progress import Progress

pytestmark = pytest.mark.kafka

PARTITIONS = 4
PARTS = 5
RECORDS = 10
"""Output records per part."""
FAILING = 3
"""The transaction (counted from 1) whose call fails once: a gathered one."""
HANG_S = 4.0


@dataclass
class Faults:
    """The call of the FAILING-th transaction that fails, and how; shared by every producer."""

    call: str
    way: str
    begun: int = 0
    done: list[str] = field(default_factory=list)
    made: int = 0

    def fault(self, call: str) -> None:
        if call != self.call or self.begun != FAILING or self.done:
            return
        self.done.append(f"{call}:{self.way}")
        if self.way == "abortable":
            raise KafkaException(
                KafkaError(
                    KafkaError._MSG_TIMED_OUT, "injected: abortable", txn_requires_abort=True
                )
            )

    def factory(self, config: dict[str, Any]) -> Producer:
        self.made += 1
        return Injected(config, self)


class Injected(Producer):
    """A real producer whose transactional calls first consult the Faults."""

    def __init__(self, config: dict[str, Any], faults: Faults) -> None:
        super().__init__(config)
        self.faults = faults

    def begin_transaction(self) -> None:
        self.faults.begun += 1
        super().begin_transaction()

    def send_offsets_to_transaction(self, *args: Any) -> None:
        self.faults.fault("send_offsets")
        super().send_offsets_to_transaction(*args)

    def commit_transaction(self, *args: Any) -> None:
        hangs_after = (
            self.faults.way == "hanging-after"
            and self.faults.call == "commit"
            and self.faults.begun == FAILING
            and not self.faults.done
        )
        self.faults.fault("commit")
        super().commit_transaction(*args)
        if hangs_after:  # committed, but the answer never reaches the caller in time
            time.sleep(HANG_S)


@dataclass
class Topics:
    output: str
    changelog: str
    source: str
    group: str
    app: str

    @classmethod
    async def new(cls, bootstrap: str) -> Topics:
        tag = uuid.uuid4().hex[:10]
        topics = cls(f"out-{tag}", f"log-{tag}", f"in-{tag}", f"emit-{tag}", f"app-{tag}")
        await create_topic(bootstrap, topics.output, partitions=3)
        await create_topic(bootstrap, topics.changelog, partitions=PARTITIONS)
        await create_topic(bootstrap, topics.source, partitions=PARTITIONS)
        return topics

    def part(self, partition: int, index: int) -> list[OutRecord]:
        """A part's outputs (keys shared by its partition's parts: their order is checked)
        and its changelog record."""
        return [
            OutRecord(
                self.output, f"p{partition}-k{n % 3}".encode(), f"{partition} {index} {n}".encode()
            )
            for n in range(RECORDS)
        ] + [
            OutRecord(
                self.changelog, b"state", f"{partition} {index}".encode(), (), partition=partition
            )
        ]


async def drive(bootstrap: str, topics: Topics, faults: Faults) -> int:
    """Every partition's parts committed as the emit stage commits them; the transactions
    committed."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topics.group})
    member = MemberTransactions(
        bootstrap,
        topics.app,
        "w0",
        consumer.consumer_group_metadata,
        Progress(),
        producer_factory=faults.factory,
        group_id=topics.group,
    )
    left: dict[int, int] = {}
    member.queued_behind = lambda partition: left.get(partition, 0) > 0

    async def chain(partition: int) -> None:
        for index in range(PARTS):
            left[partition] = PARTS - index - 1
            offsets = {TopicPartition(topics.source, partition): (index + 1) * RECORDS}
            await member.commit(partition, topics.part(partition, index), offsets)
            await asyncio.sleep(0)  # the part's own end: its state applied

    try:
        await member.prepare(set(range(PARTITIONS)))
        await asyncio.wait_for(asyncio.gather(*(chain(p) for p in range(PARTITIONS))), 90)
        return member.phases.committed
    finally:
        await member.stop()
        consumer.close()


async def check(bootstrap: str, topics: Topics) -> None:
    outputs = await read_topic(bootstrap, topics.output)
    values = [read.value or b"" for read in outputs]
    expected = {
        f"{p} {index} {n}".encode()
        for p in range(PARTITIONS)
        for index in range(PARTS)
        for n in range(RECORDS)
    }
    assert len(values) == len(expected), f"{len(values)} read, {len(expected)} written"
    assert set(values) == expected
    by_key: dict[bytes, list[tuple[int, int]]] = {}
    for read in outputs:  # in offset order per partition; a key stays on one partition
        _, index, n = (int(word) for word in (read.value or b"").split())
        by_key.setdefault(read.key or b"", []).append((index, n))
    for key, order in by_key.items():
        assert order == sorted(order), f"{key!r} out of order: {order}"
    changelog = await read_topic(bootstrap, topics.changelog)
    for partition in range(PARTITIONS):
        states = [read.value for read in changelog if read.partition == partition]
        assert states == [f"{partition} {index}".encode() for index in range(PARTS)]
    offsets = await committed(bootstrap, topics.group, topics.source)
    assert offsets == dict.fromkeys(range(PARTITIONS), PARTS * RECORDS)


def test_parts_waiting_behind_a_committed_transaction_join_the_next(kafka_bootstrap: str) -> None:
    topics = asyncio.run(Topics.new(kafka_bootstrap))
    faults = Faults("none", "none")
    committed_transactions = asyncio.run(drive(kafka_bootstrap, topics, faults))
    asyncio.run(check(kafka_bootstrap, topics))
    # One transaction per part would be PARTITIONS * PARTS; taking turns, about half as many
    # again as gathered: the first transaction, then one per round of parts.
    assert committed_transactions <= PARTS + 2, committed_transactions


@pytest.mark.parametrize(
    ("call", "way"),
    [("send_offsets", "abortable"), ("commit", "abortable"), ("commit", "hanging-after")],
    ids=["offsets-abortable", "commit-abortable", "commit-hanging-after-it-committed"],
)
def test_a_gathered_transaction_failing_once_loses_duplicates_and_reorders_nothing(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch, call: str, way: str
) -> None:
    monkeypatch.setattr(transactions, "OFFSETS_TIMEOUT_S", 2.0)
    monkeypatch.setattr(transactions, "CALL_TIMEOUT_S", 2.0)
    monkeypatch.setattr(transactions, "STUCK_MARGIN_S", 1.0)
    topics = asyncio.run(Topics.new(kafka_bootstrap))
    faults = Faults(call, way)
    asyncio.run(drive(kafka_bootstrap, topics, faults))
    assert faults.done[:1] == [f"{call}:{way}"]
    assert faults.made >= 2  # aborted or given up: tried again on a new producer
    asyncio.run(check(kafka_bootstrap, topics))
