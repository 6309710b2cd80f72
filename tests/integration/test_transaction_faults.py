"""The emit stage's transactions (MemberTransactions) under faults as they happen: a proxy in
front of the broker loses, delays or resets the answers of each transactional request, and a
producer wrapper makes each transactional call fail once in each way librdkafka reports
(retriable, abortable, fatal, hanging). After every fault, the records read read_committed
are the batch, each once; the group's committed offset is the batch's; and every changelog
acknowledgement points at a committed record that is the one it acknowledged.

The driver plays the emit member: `PartitionsMoved` rewinds (the batch is committed again
only if its offsets are not), a fatal error at start-up restarts the worker (a new
MemberTransactions under the same transactional id, which fences the old one); a fatal error
later replaces the producer in place, as such a restart would.

The first test is the case of issue 31, which lost every record on 061b636: the first
produce request reaches the broker, its answer is lost and connections are refused for 8 s,
and `send_offsets_to_transaction` fails once with a retriable `_TRANSPORT`; the abort and the
retry on the same producer (same epoch, same sequences) were answered as duplicates of the
aborted batch.

Stage one (normalize) has no transactions: its idempotent sender meets the same lost and late
produce answers in the last test.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import TopicPartition
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from support.fault_proxy import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    API_NAMES,
    END_TXN,
    FIND_COORDINATOR,
    INIT_PRODUCER_ID,
    PRODUCE,
    TXN_OFFSET_COMMIT,
    FaultProxy,
)
from support.kafka_io import committed, create_topic, read_topic
from support.local_broker import PrivateBroker

from streams.core.records import OutRecord
from streams.engine.librdkafka import transactions
from streams.engine.librdkafka.producer import RdRecordSender
from streams.engine.librdkafka.transactions import MemberTransactions, PartitionsMoved
from streams.engine.outcomes import Acknowledged, DeadLetters, Sent
from streams.progress import Progress

pytestmark = pytest.mark.kafka

RECORDS = 10


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrivateBroker, FaultProxy]]:
    """A broker of its own whose clients reach it only through a fault proxy."""
    broker = PrivateBroker(tmp_path_factory.mktemp("kafka"), proxied=True)
    proxy = FaultProxy(broker.proxy_port, broker.proxied_port).start()
    try:
        broker.start(fresh=True)
        asyncio.run(_warm_up(broker))
        yield broker, proxy
    finally:
        proxy.stop()
        broker.stop()


@pytest.fixture
def proxy(proxied: tuple[PrivateBroker, FaultProxy]) -> Iterator[FaultProxy]:
    _, proxy = proxied
    proxy.clear()
    yield proxy
    proxy.clear()


async def _warm_up(broker: PrivateBroker) -> None:
    """One clean transaction first: the transaction state topic and the group coordinator
    exist before any test times a call."""
    batch = await Batch.new(broker.bootstrap)
    outcome = await drive(broker.proxy_bootstrap, batch, Producer)
    assert outcome.restarts == 0


@dataclass
class Batch:
    """One emit part: records to an output topic (by key) and to a changelog partition
    (dictated), and the input offset it commits."""

    output: str
    changelog: str
    source: str
    group: str
    transactional_app: str
    records: list[OutRecord] = field(default_factory=list)

    @classmethod
    async def new(cls, bootstrap: str) -> Batch:
        tag = uuid.uuid4().hex[:10]
        batch = cls(f"out-{tag}", f"log-{tag}", f"in-{tag}", f"emit-{tag}", f"app-{tag}")
        await create_topic(bootstrap, batch.output, partitions=3)
        await create_topic(bootstrap, batch.changelog)
        await create_topic(bootstrap, batch.source)
        batch.records = [
            OutRecord(batch.output, f"k{index}".encode(), f"event {index} {tag}".encode())
            for index in range(RECORDS)
        ] + [
            OutRecord(batch.changelog, f"k{index}".encode(), f"state {index}".encode(), (), 0)
            for index in range(2)
        ]
        return batch

    @property
    def offsets(self) -> dict[TopicPartition, int]:
        return {TopicPartition(self.source, 0): RECORDS}


@dataclass
class Outcome:
    acknowledged: list[Acknowledged]
    restarts: int = 0
    rewinds: int = 0


async def drive(
    proxy_bootstrap: str,
    batch: Batch,
    factory: Callable[[dict[str, Any]], Producer],
    deadline_s: float = 90.0,
) -> Outcome:
    """Commit `batch` as the emit member would, through restarts and rewinds."""
    consumer = Consumer({"bootstrap.servers": proxy_bootstrap, "group.id": batch.group})
    restarts = rewinds = 0
    deadline = time.monotonic() + deadline_s
    try:
        while time.monotonic() < deadline:
            member = MemberTransactions(
                proxy_bootstrap,
                batch.transactional_app,
                "w0",
                consumer.consumer_group_metadata,
                Progress(),
                producer_factory=factory,
                group_id=batch.group,
            )
            try:
                await member.prepare(set())
                while True:
                    done = await committed_offset(proxy_bootstrap, batch)
                    if done == RECORDS:  # committed by an attempt that seemed to fail
                        return Outcome([], restarts, rewinds)
                    try:
                        acknowledged = await asyncio.wait_for(
                            member.commit(0, batch.records, batch.offsets), 60
                        )
                        return Outcome(acknowledged, restarts, rewinds)
                    except PartitionsMoved:
                        rewinds += 1
                        member.resume()
            except KafkaException as exc:
                assert exc.args[0].fatal(), exc
                restarts += 1  # the worker stops; its restart takes over the id
            finally:
                await member.stop()
        raise AssertionError("the batch was not committed in time")
    finally:
        consumer.close()


async def committed_offset(bootstrap: str, batch: Batch) -> int | None:
    return (await committed(bootstrap, batch.group, batch.source)).get(0)


async def check(broker: PrivateBroker, batch: Batch, outcome: Outcome) -> None:
    """Every record of the batch readable once, read_committed; the offset committed; every
    acknowledgement at a committed record of its own."""
    outputs = await read_topic(broker.bootstrap, batch.output)
    values = sorted(read.value or b"" for read in outputs)
    expected = sorted(record.value or b"" for record in batch.records[:RECORDS])
    assert values == expected, f"lost {set(expected) - set(values)}, read {len(values)}"
    changelog = await read_topic(broker.bootstrap, batch.changelog)
    assert [read.value for read in changelog] == [b"state 0", b"state 1"]
    assert await committed_offset(broker.bootstrap, batch) == RECORDS
    by_offset = {read.offset: read.value for read in changelog}
    for ack in outcome.acknowledged:
        if ack.topic == batch.changelog:
            assert by_offset.get(ack.last_offset) == b"state 1", (ack, by_offset)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


# What a call can do once, as librdkafka reports it.


def retriable() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._TRANSPORT, "injected: lost", retriable=True))


def abortable() -> KafkaException:
    return KafkaException(
        KafkaError(KafkaError._MSG_TIMED_OUT, "injected: abortable", txn_requires_abort=True)
    )


def fatal() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._FATAL, "injected: fatal", fatal=True))


HANG_S = 4.0


@dataclass
class Plan:
    """Which calls fail once, and how; shared by every producer the member makes."""

    faults: dict[str, str]
    before: Callable[[], None] = lambda: None
    """Run before the first fault (e.g. wait for the proxy to have lost an answer)."""
    done: list[str] = field(default_factory=list)
    made: int = 0
    """Producers made: a new one (a new epoch) after every abort."""

    def fault(self, call: str) -> None:
        way = self.faults.pop(call, None)
        if way is None:
            return
        if not self.done:
            self.before()
        self.done.append(f"{call}:{way}")
        if way == "hanging":
            time.sleep(HANG_S)  # past the call's timeout and margin: given up, then done
            return
        if way == "hanging-after":
            return  # the call itself runs first (Injected), then hangs
        raise {"retriable": retriable, "abortable": abortable, "fatal": fatal}[way]()

    def factory(self, config: dict[str, Any]) -> Producer:
        self.made += 1
        return Injected(config, self)


class Injected(Producer):
    """A real producer whose transactional calls first consult a Plan."""

    def __init__(self, config: dict[str, Any], plan: Plan) -> None:
        super().__init__(config)
        self.plan = plan

    def init_transactions(self, *args: Any) -> None:
        self.plan.fault("init")
        super().init_transactions(*args)

    def begin_transaction(self) -> None:
        self.plan.fault("begin")
        super().begin_transaction()

    def send_offsets_to_transaction(self, *args: Any) -> None:
        self.plan.fault("send_offsets")
        super().send_offsets_to_transaction(*args)

    def commit_transaction(self, *args: Any) -> None:
        hangs_after = self.plan.faults.get("commit") == "hanging-after"
        self.plan.fault("commit")
        super().commit_transaction(*args)
        if hangs_after:  # committed, but the answer never reaches the caller in time
            time.sleep(HANG_S)

    def abort_transaction(self, *args: Any) -> None:
        self.plan.fault("abort")
        super().abort_transaction(*args)


@pytest.fixture
def short_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Transactional calls given up after 2 + 1 s, so that a hanging call costs seconds."""
    monkeypatch.setattr(transactions, "OFFSETS_TIMEOUT_S", 2.0)
    monkeypatch.setattr(transactions, "CALL_TIMEOUT_S", 2.0)
    monkeypatch.setattr(transactions, "STUCK_MARGIN_S", 1.0)


def test_a_retry_after_a_lost_produce_answer_and_a_failed_send_offsets_loses_nothing(
    proxied: tuple[PrivateBroker, FaultProxy], proxy: FaultProxy
) -> None:
    broker, _ = proxied
    batch = run(Batch.new(broker.bootstrap))
    proxy.lose_answer(PRODUCE, refuse_s=8.0)
    plan = Plan(
        {"send_offsets": "retriable"},
        before=lambda: proxy.wait_hit(PRODUCE, timeout_s=30) or None,
    )
    outcome = run(drive(broker.proxy_bootstrap, batch, plan.factory))
    assert proxy.hit[PRODUCE] == 1
    assert plan.done == ["send_offsets:retriable"]
    run(check(broker, batch, outcome))


def test_an_abort_after_a_lost_produce_answer_retries_under_a_new_epoch(
    proxied: tuple[PrivateBroker, FaultProxy], proxy: FaultProxy
) -> None:
    """The same, but the failure needs an abort: the retry must not be answered as a
    duplicate of the aborted batch."""
    broker, _ = proxied
    batch = run(Batch.new(broker.bootstrap))
    proxy.lose_answer(PRODUCE, refuse_s=8.0)
    plan = Plan(
        {"send_offsets": "abortable"},
        before=lambda: proxy.wait_hit(PRODUCE, timeout_s=30) or None,
    )
    outcome = run(drive(broker.proxy_bootstrap, batch, plan.factory))
    assert plan.done == ["send_offsets:abortable"]
    run(check(broker, batch, outcome))


CALLS = ("init", "begin", "send_offsets", "commit", "abort")
WAYS = ("retriable", "abortable", "fatal", "hanging")
MATRIX = [
    (call, way)
    for call in CALLS
    for way in WAYS
    if not (way == "hanging" and call == "begin")  # local: librdkafka answers at once
]


@pytest.mark.slow
@pytest.mark.parametrize(("call", "way"), MATRIX, ids=[f"{c}-{w}" for c, w in MATRIX])
def test_each_transactional_call_failing_once_loses_and_duplicates_nothing(
    proxied: tuple[PrivateBroker, FaultProxy],
    proxy: FaultProxy,
    short_calls: None,
    call: str,
    way: str,
) -> None:
    broker, _ = proxied
    batch = run(Batch.new(broker.bootstrap))
    faults = {call: way}
    if call == "abort":  # an abort happens only after a failure that needs one
        faults = {"send_offsets": "abortable", "abort": way}
    plan = Plan(dict(faults))
    outcome = run(drive(broker.proxy_bootstrap, batch, plan.factory))
    assert sorted(plan.done) == sorted(f"{c}:{w}" for c, w in faults.items())
    if (call, way) in (("send_offsets", "retriable"), ("commit", "retriable")):
        assert plan.made == 1  # tried again inside the open transaction
    else:
        assert plan.made >= 2  # aborted or given up: the retry under a new epoch
    assert outcome.restarts == (1 if (call, way) == ("init", "fatal") else 0)
    run(check(broker, batch, outcome))


APIS = (
    PRODUCE,
    ADD_PARTITIONS_TO_TXN,
    ADD_OFFSETS_TO_TXN,
    TXN_OFFSET_COMMIT,
    END_TXN,
    INIT_PRODUCER_ID,
    FIND_COORDINATOR,
)
NETWORK = [(api, fault) for api in APIS for fault in ("lose", "delay")]


@pytest.mark.slow
@pytest.mark.parametrize(("api", "fault"), NETWORK, ids=[f"{API_NAMES[a]}-{f}" for a, f in NETWORK])
def test_each_transactional_request_losing_or_delaying_its_answer_loses_nothing(
    proxied: tuple[PrivateBroker, FaultProxy], proxy: FaultProxy, api: int, fault: str
) -> None:
    broker, _ = proxied
    batch = run(Batch.new(broker.bootstrap))
    if fault == "lose":
        proxy.lose_answer(api, refuse_s=3.0)
    else:
        proxy.delay_answer(api, 3.0)
    outcome = run(drive(broker.proxy_bootstrap, batch, Producer))
    run(check(broker, batch, outcome))
    if api not in (INIT_PRODUCER_ID, FIND_COORDINATOR):  # may be answered before the test
        assert proxy.hit[api] >= 1, f"no {API_NAMES[api]} request met its fault"


@pytest.mark.parametrize("failures_only", [True, False], ids=["stage-one", "every-report"])
@pytest.mark.parametrize("fault", ["lose", "delay"])
def test_the_idempotent_sender_stores_each_record_once_through_a_lost_produce_answer(
    proxied: tuple[PrivateBroker, FaultProxy], proxy: FaultProxy, failures_only: bool, fault: str
) -> None:
    """Stage one's sender (no transactions) and the at_least_once emit sender: a produce
    whose answer is lost or late is sent again by librdkafka under the same sequences, which
    the broker answers as a duplicate: stored once, and the write ends."""
    broker, _ = proxied
    topic = f"sender-{uuid.uuid4().hex[:10]}"
    run(create_topic(broker.bootstrap, topic, partitions=3))
    records = [OutRecord(topic, f"k{n % 11}".encode(), f"r{n}".encode()) for n in range(200)]
    if fault == "lose":
        proxy.lose_answer(PRODUCE, refuse_s=3.0)
    else:
        proxy.delay_answer(PRODUCE, 3.0)

    async def send() -> Sent:
        sender = RdRecordSender(
            broker.proxy_bootstrap,
            f"sender-{topic}",
            Progress(),
            DeadLetters(f"{topic}-dlq", "normalize"),
            failures_only=failures_only,
        )
        await sender.start()
        try:
            return await asyncio.wait_for(sender.send_all(records, "normalize"), 60)
        finally:
            await sender.stop()

    sent = run(send())
    assert sent.refused == []
    assert proxy.hit[PRODUCE] == 1
    values = sorted(read.value or b"" for read in run(read_topic(broker.bootstrap, topic)))
    assert values == sorted(record.value or b"" for record in records)


@pytest.mark.slow
@pytest.mark.parametrize("api", [END_TXN, TXN_OFFSET_COMMIT], ids=["EndTxn", "TxnOffsetCommit"])
def test_a_call_timing_out_after_its_request_was_sent_commits_the_batch_once(
    proxied: tuple[PrivateBroker, FaultProxy], proxy: FaultProxy, short_calls: None, api: int
) -> None:
    """The answer to the commit (or to the offsets) held past the call's timeout: librdkafka
    answers a retriable timeout, the call is made again inside the transaction (never an
    abort: the broker may be committing it), and the batch is written once."""
    broker, _ = proxied
    batch = run(Batch.new(broker.bootstrap))
    proxy.delay_answer(api, 8.0)
    outcome = run(drive(broker.proxy_bootstrap, batch, Producer))
    assert proxy.hit[api] >= 1
    run(check(broker, batch, outcome))


@pytest.mark.slow
def test_a_commit_given_up_after_it_committed_is_not_written_again(
    proxied: tuple[PrivateBroker, FaultProxy], proxy: FaultProxy, short_calls: None
) -> None:
    """`commit_transaction` commits, then does not return in time (librdkafka#5456's kind of
    hang): the producer is given up and the next one's initialisation fences it. Its retry
    must see the group's offsets committed and not write the batch a second time."""
    broker, _ = proxied
    batch = run(Batch.new(broker.bootstrap))
    plan = Plan({"commit": "hanging-after"})
    outcome = run(drive(broker.proxy_bootstrap, batch, plan.factory))
    assert plan.done == ["commit:hanging-after"]
    assert plan.made == 2  # given up, replaced; the batch not written by the second
    run(check(broker, batch, outcome))
