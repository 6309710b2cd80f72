"""Upgrading a deployment from the aiokafka engine (removed 2026-12) under the same app id,
configuration and state directory, and switching the group protocol (STREAMS_GROUP_PROTOCOL)
either way, as an operator rolling back to classic groups would.

What an aiokafka-engine deployment leaves behind is what a deployment on classic groups
leaves (the same group ids, their committed offsets, the same changelog topics: both engines
wrote one state format), plus, if it was killed, a transaction open under one of its
per-partition transactional ids (`<app id>-emit-<partition>`). The first life here runs the
stages as classic members (`STREAMS_GROUP_PROTOCOL=classic`); the open transaction is made
by aiokafka itself, as that engine's producers made theirs.

The broker converts a classic group to the consumer protocol when a KIP-848 member joins it,
and back when a classic member joins an empty consumer group (Kafka 4.x,
`group.consumer.migration.policy`, `bidirectional` by default), keeping its committed offsets:
an empty group (after a SIGTERM) and one that still holds a SIGKILLed worker's static members
(online migration) alike. The dedupe ids and ordering marks come back from the same changelog
topics. So the upgraded worker re-emits nothing, drops copies of what the old one emitted, and
sends an older change of a key the old one emitted to the stale topic."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupType
from confluent_kafka.admin import AdminClient
from support.kafka_io import Read, committed, produce, raw, read_topic
from support.payloads import s3_body, s3_record
from support.worker import Topology, Worker

pytestmark = pytest.mark.kafka

INSTANCE_ID = "storage-events-0"
"""A fixed STREAMS_GROUP_INSTANCE_ID, as the k8s StatefulSet gives each pod."""
AIOKAFKA_TRANSACTION_TIMEOUT_MS = 60_000
"""aiokafka's default `transaction_timeout_ms`, which the aiokafka engine's producers kept
(they did not set it)."""

Delivery = tuple[bytes, list[tuple[str, bytes]]]


def _delivery(key: str, sequencer: int) -> Delivery:
    return raw(s3_body(s3_record(key, f"{sequencer:016X}")), "s3")


def _deployment(bootstrap: str, names: Topology, workdir: Path, protocol: str) -> Worker:
    """One deployment (a k8s pod): its instance id, state directory and address (Faust's
    own group checks a static member's URL) stay whatever the group protocol."""
    return Worker(
        bootstrap,
        names.config(),
        workdir,
        env={"STREAMS_GROUP_PROTOCOL": protocol, "STREAMS_GROUP_INSTANCE_ID": INSTANCE_ID},
    )


def _switch(worker: Worker, protocol: str) -> int:
    """The same deployment restarted on `protocol`; where its log of the new life starts."""
    worker.env["STREAMS_GROUP_PROTOCOL"] = protocol
    return worker.log_path.stat().st_size


PROTOCOL = {"classic": ConsumerGroupType.CLASSIC, "consumer": ConsumerGroupType.CONSUMER}
"""The group type the stage members make of their groups under each STREAMS_GROUP_PROTOCOL
(classic: as the aiokafka engine's did)."""


def _group_types(bootstrap: str, names: Topology) -> list[ConsumerGroupType]:
    """The protocol the broker keeps each stage group under now."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    groups = [f"{names.app_id}-normalize", f"{names.app_id}-emit"]
    return [future.result(10).type for future in admin.describe_consumer_groups(groups).values()]


def _keys(records: list[Read]) -> list[str]:
    return sorted(record.json()["key"] for record in records)


def _first_life(bootstrap: str, names: Topology, worker: Worker, kill: bool = False) -> list[str]:
    """The deployment before the switch: ten changes emitted, then a graceful stop (SIGTERM,
    exit 0), or a SIGKILL (`kill`: the classic groups keep its static members)."""
    keys = [f"first/{n}.txt" for n in range(10)]
    worker.start()
    try:
        deliveries = [_delivery(key, 0x200 + n) for n, key in enumerate(keys)]
        asyncio.run(produce(bootstrap, names.raw, deliveries))
        worker.wait_metric("storage_events_emitted_total", 10, instance="default")
        if kill:
            worker.kill()
    finally:
        assert worker.stop() == (-9 if kill else 0), worker.tail()
    return keys


@pytest.mark.parametrize(("before", "after"), [("classic", "consumer"), ("consumer", "classic")])
def test_a_switched_group_protocol_goes_on_where_the_other_stopped_with_its_state(
    kafka_bootstrap: str, tmp_path: Path, before: str, after: str
) -> None:
    names = Topology()
    worker = _deployment(kafka_bootstrap, names, tmp_path, before)
    first = _first_life(kafka_bootstrap, names, worker)
    assert _group_types(kafka_bootstrap, names) == [PROTOCOL[before]] * 2

    since = _switch(worker, after)
    worker.start()
    try:
        copies = [_delivery(key, 0x200 + n) for n, key in enumerate(first[:3])]
        older = [_delivery(first[3], 0x100)]  # before the change of first/3 already emitted
        fresh_keys = [f"second/{n}.txt" for n in range(5)]
        fresh = [_delivery(key, 0x300 + n) for n, key in enumerate(fresh_keys)]
        asyncio.run(produce(kafka_bootstrap, names.raw, copies + older + fresh))
        worker.wait_metric("storage_events_emitted_total", 5, instance="default")
        worker.wait_metric("storage_events_duplicates_total", 3, instance="default")
        worker.wait_metric("storage_events_stale_total", 1, instance="default")
        # Everything sent since the switch is handled: had the first ten been read again,
        # they came before it in their partitions.
        received = worker.metric("storage_events_received_total")
        emitted = worker.metric("storage_events_emitted_total", instance="default")
        duplicates = worker.metric("storage_events_duplicates_total", instance="default")
        log = worker.log_path.read_bytes()[since:].decode(errors="replace")
    finally:
        assert worker.stop() == 0, worker.tail()

    # The broker converted the (empty) groups to the other protocol, their offsets kept.
    assert _group_types(kafka_bootstrap, names) == [PROTOCOL[after]] * 2
    assert received == 9, f"the {before} groups' committed deliveries were read again"
    assert (emitted, duplicates) == (5, 3)
    output = asyncio.run(read_topic(kafka_bootstrap, names.output("default")))
    assert _keys(output) == sorted(first + fresh_keys)  # each once: nothing re-emitted
    stale = asyncio.run(read_topic(kafka_bootstrap, names.stale("default")))
    assert _keys(stale) == [first[3]]
    assert [record.json()["sequencer"] for record in stale] == [f"{0x100:016X}"]
    assert "stage failed" not in log


_ABANDON = """
import asyncio, os, signal, sys
from aiokafka import AIOKafkaProducer, TopicPartition

async def main(bootstrap, transactional_id, group, topic, partition, offset, output):
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id,
                                enable_idempotence=True, acks="all",
                                transaction_timeout_ms={timeout_ms})
    await producer.start()
    await producer.begin_transaction()
    await (await producer.send(output, b"never committed", key=b"k"))
    await producer.send_offsets_to_transaction({{TopicPartition(topic, partition): offset}}, group)
    print("open", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # as a SIGKILLed worker: the transaction stays open

args = sys.argv[1:]
asyncio.run(main(args[0], args[1], args[2], args[3], int(args[4]), int(args[5]), args[6]))
"""


@pytest.mark.slow
def test_a_transaction_the_aiokafka_engine_left_open_is_fenced_not_applied(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A SIGKILLed aiokafka-engine worker left its per-partition transaction open
    (`<app id>-emit-<partition>`, holding the emit group's offsets) and its static members in
    the classic groups. The worker's own producer (`<app id>-emit-<member>`) does not fence
    it, so before reading the partitions' committed offsets (require_stable) its emit member
    initialises those per-partition ids
    (streams.engine.librdkafka.transactions.fence_partition_ids), which aborts it at once
    instead of at its transaction timeout (63-70 s without). Nothing of it is applied; the
    figure is how long the upgraded worker took to emit."""
    names = Topology()
    worker = _deployment(kafka_bootstrap, names, tmp_path, "classic")
    first = _first_life(kafka_bootstrap, names, worker, kill=True)
    repartition = f"{names.app_id}.by-key"
    offsets = asyncio.run(committed(kafka_bootstrap, f"{names.app_id}-emit", repartition))
    partition, offset = max(offsets.items())
    # What the killed worker's last transaction left: outputs written, offsets sent, no end.
    opened = subprocess.run(
        [
            sys.executable,
            "-c",
            _ABANDON.format(timeout_ms=AIOKAFKA_TRANSACTION_TIMEOUT_MS),
            kafka_bootstrap,
            f"{names.app_id}-emit-{partition}",
            f"{names.app_id}-emit",
            repartition,
            str(partition),
            str(offset),
            names.output("default"),
        ],
        capture_output=True,
        timeout=60,
    )
    opened_at = time.monotonic()
    assert opened.stdout.strip() == b"open", opened.stderr.decode()

    _switch(worker, "consumer")
    try:
        worker.start(wait_ready=False)
        fresh_keys = [f"second/{n}.txt" for n in range(6)]
        fresh = [_delivery(key, 0x300 + n) for n, key in enumerate(fresh_keys)]
        copies = [_delivery(key, 0x200 + n) for n, key in enumerate(first[:2])]
        asyncio.run(produce(kafka_bootstrap, names.raw, fresh + copies))
        worker.wait_metric("storage_events_emitted_total", 6, timeout_s=150, instance="default")
        waited_s = time.monotonic() - opened_at
        worker.wait_metric("storage_events_duplicates_total", 2, instance="default")
        emitted = worker.metric("storage_events_emitted_total", instance="default")
        received = worker.metric("storage_events_received_total")
    finally:
        assert worker.stop() == 0, worker.tail()
    print(f"emitted {waited_s:.1f} s after the aiokafka engine's transaction was left open")

    assert (emitted, received) == (6, 8)  # the killed worker's committed deliveries not again
    # Converted although the killed worker's static members were still in the classic groups.
    assert _group_types(kafka_bootstrap, names) == [ConsumerGroupType.CONSUMER] * 2
    output = asyncio.run(read_topic(kafka_bootstrap, names.output("default")))
    # The open transaction's record aborted (never read), the first ten not again.
    assert _keys(output) == sorted(first + fresh_keys)
    # Fenced at the assignment: well before the old transaction's own timeout.
    assert waited_s < AIOKAFKA_TRANSACTION_TIMEOUT_MS / 1000 / 2, waited_s
