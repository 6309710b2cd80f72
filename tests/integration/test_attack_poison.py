"""Poison pills, as an attacker sends them (issue 13, item 2): no single delivery, however
large or strange, stops the stream, and a stage that cannot make progress says so and stops
on SIGTERM within its grace period.

Each test runs its own worker on the real broker, puts its attack on the raw topic, and then
a control delivery of the same raw key (so it is read after the attack) that must come out;
each ends with a restart of the worker: no repeat stall, `/ready` 200, a second control
emitted, and the attack dead-lettered once (its offset was committed).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from support.kafka_io import Header, Read, create_topic, read_topic
from support.payloads import s3_body, s3_record
from support.worker import ROOT, Topology, Worker, wait_for

from streams.core.partitioning import partition_for
from streams.core.records import partition_key
from streams.engine.topics import EVENT_MAX_MESSAGE_BYTES, RAW_MAX_MESSAGE_BYTES
from streams.progress import EXIT_STOP_TIMEOUT, STOP_GRACE_S

pytestmark = pytest.mark.kafka

PARTITIONS = 2  # Topology.config's


class Attack:
    """One worker, its topics, and the attacker's and the observer's means."""

    def __init__(
        self,
        bootstrap: str,
        workdir: Path,
        env: dict[str, str] | None = None,
        names: Topology | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.names = names or Topology()
        self.worker = Worker(bootstrap, self.names.config(), workdir, env)

    def send(self, deliveries: Sequence[tuple[bytes, Sequence[Header]]], raw_key: bytes) -> None:
        asyncio.run(produce(self.bootstrap, self.names.raw, deliveries, raw_key))

    def read(self, topic: str) -> list[Read]:
        return asyncio.run(read_topic(self.bootstrap, topic))

    def keys_out(self) -> list[str]:
        return [read.json()["key"] for read in self.read(self.names.output("default"))]

    def wait_out(self, key: str) -> None:
        try:
            wait_for(lambda: key in self.keys_out(), 90, f"{key} on the output", 0.5)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.worker.tail(60)}") from None

    def dead_letters(self, value: bytes) -> list[Read]:
        return [read for read in self.read(self.names.dead_letter) if read.value == value]

    def restart_and_check(self, raw_key: bytes) -> None:
        """Restart: ready again, a new control delivery emitted."""
        assert self.worker.stop() == 0, self.worker.tail(60)
        self.worker.start()
        control = unique("control/after-restart")
        self.send([raw(s3_body(s3_record(control, "00A0")), "s3")], raw_key)
        self.wait_out(control)
        answer = self.worker._get("/ready")
        assert answer is not None and answer[0] == 200, answer


@pytest.fixture
def attack(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Attack]:
    made = Attack(kafka_bootstrap, tmp_path / "worker")
    try:
        yield made
    finally:
        made.worker.stop()


async def produce(
    bootstrap: str, topic: str, records: Sequence[tuple[bytes, Sequence[Header]]], key: bytes
) -> None:
    """As a bridge publishes: records up to the raw topic's limit, in order."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        max_request_size=RAW_MAX_MESSAGE_BYTES,
    )
    await producer.start()
    try:
        for value, headers in records:
            await (await producer.send(topic, value, key=key, headers=list(headers)))
    finally:
        await producer.stop()


async def alter_topic(bootstrap: str, name: str, config: dict[str, str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, name, configs=config)])
    finally:
        await admin.close()


def raw(body: bytes, source: str, delivery_id: str | None = None) -> tuple[bytes, list[Header]]:
    headers: list[Header] = [("source", source.encode())]
    if delivery_id is not None:
        headers.append(("delivery-id", delivery_id.encode()))
    return body, headers


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def minio_body(key: str, sequencer: str) -> bytes:
    """A MinIO webhook delivery (one record per POST; the key form-encoded in the record)."""
    record = s3_record(key, sequencer, event="s3:ObjectCreated:Put")
    record["eventSource"] = "minio:s3"
    return json.dumps(
        {"EventName": "s3:ObjectCreated:Put", "Key": f"uploads/{key}", "Records": [record]}
    ).encode()


def padded_s3(key: str, sequencer: str, padding: int) -> bytes:
    """An S3 delivery whose record (the event's `raw`) carries `padding` extra bytes."""
    record = s3_record(key, sequencer)
    record["responseElements"]["x-amz-id-2"] = "A" * padding
    return s3_body(record)


def same_partition_key(key: str) -> str:
    """Another object key of the `default` instance on the repartition partition of `key`."""
    wanted = partition_for(partition_key("default", "uploads", key), PARTITIONS)
    while True:
        other = unique("control/same-partition")
        if partition_for(partition_key("default", "uploads", other), PARTITIONS) == wanted:
            return other


def test_a_minio_key_longer_than_any_provider_allows_is_dead_lettered(attack: Attack) -> None:
    attack.worker.start()
    long_key = "k" * 400_000  # S3, MinIO: at most 1,024 bytes
    poison = minio_body(long_key, "17A0000000000001")
    control = unique("control/after-long-key")
    raw_key = uuid.uuid4().bytes
    attack.send(
        [raw(poison, "minio", "poison-1"), raw(minio_body(control, "17A0000000000002"), "minio")],
        raw_key,
    )

    attack.wait_out(control)
    assert long_key not in attack.keys_out()
    [letter] = attack.dead_letters(poison)
    assert letter.headers["error.stage"] == b"normalize"
    assert letter.headers["delivery-id"] == b"poison-1"
    error = letter.headers["error"].decode()
    assert "object key of 400,000 bytes" in error and "1,024 bytes" in error, error

    attack.restart_and_check(raw_key)
    assert len(attack.dead_letters(poison)) == 1


def test_an_event_too_large_for_the_repartition_topic_dead_letters_its_delivery(
    attack: Attack,
) -> None:
    attack.worker.start()
    key = unique("big/raw")
    poison = padded_s3(key, "0055AED6DCD90281E5", EVENT_MAX_MESSAGE_BYTES + 10_000)
    control = unique("control/after-big-raw")
    raw_key = uuid.uuid4().bytes
    attack.send([raw(poison, "s3"), raw(s3_body(s3_record(control, "00F0")), "s3")], raw_key)

    attack.wait_out(control)
    assert key not in attack.keys_out()
    [letter] = attack.dead_letters(poison)  # whole, not truncated
    assert letter.headers["error.stage"] == b"normalize"
    error = letter.headers["error"].decode()
    assert f"over the {EVENT_MAX_MESSAGE_BYTES:,}-byte limit" in error, error
    assert "makes a record of 1,0" in error, error

    attack.restart_and_check(raw_key)
    assert len(attack.dead_letters(poison)) == 1


def test_a_dead_letter_topic_too_small_for_the_delivery_keeps_its_headers_not_a_stall(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The dead-letter topic was created beforehand with max.message.bytes 2 KB: the dead
    letter of a 400 KB delivery is written without its value (headers and reason kept,
    `error.value-dropped` = its size), and the stream goes on."""
    attack = Attack(kafka_bootstrap, tmp_path / "worker")
    small = {"max.message.bytes": "2048"}
    asyncio.run(create_topic(kafka_bootstrap, attack.names.dead_letter, PARTITIONS, small))
    try:
        attack.worker.start()
        poison = minio_body("k" * 400_000, "17A0000000000001")
        control = unique("control/after-small-dead-letter-topic")
        raw_key = uuid.uuid4().bytes
        attack.send(
            [raw(poison, "minio", "poison-2"), raw(minio_body(control, "17A2"), "minio")],
            raw_key,
        )

        attack.wait_out(control)
        [letter] = attack.read(attack.names.dead_letter)
        assert letter.value is None
        assert letter.headers["error.value-dropped"] == str(len(poison)).encode()
        assert letter.headers["delivery-id"] == b"poison-2"
        assert letter.headers["error.stage"] == b"normalize"
        error = letter.headers["error"].decode()
        assert "object key of 400,000 bytes" in error and "value dropped" in error, error
        attack.restart_and_check(raw_key)
        assert len(attack.read(attack.names.dead_letter)) == 1
    finally:
        attack.worker.stop()


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_an_output_topic_that_refuses_the_record_gets_a_dead_letter_not_a_stall(
    kafka_bootstrap: str, tmp_path: Path, guarantee: str
) -> None:
    """A user created the output topic beforehand with max.message.bytes 2 KB: the emit stage
    dead-letters what it refuses (with the broker's reason) and emits what comes after; a
    replay of the dead letter once the topic is fixed is emitted (its id was not recorded)."""
    attack = Attack(
        kafka_bootstrap, tmp_path / "worker", {"STREAMS_PROCESSING_GUARANTEE": guarantee}
    )
    output = attack.names.output("default")
    asyncio.run(create_topic(kafka_bootstrap, output, PARTITIONS, {"max.message.bytes": "2048"}))
    try:
        attack.worker.start()
        key = unique("refused/out")
        control = same_partition_key(key)  # handled after it, by the same emit partition
        poison = padded_s3(key, "0055AED6DCD90281E5", 3_000)
        raw_key = uuid.uuid4().bytes
        attack.send([raw(poison, "s3"), raw(s3_body(s3_record(control, "00F0")), "s3")], raw_key)

        attack.wait_out(control)
        assert key not in attack.keys_out()
        letters = [
            read
            for read in attack.read(attack.names.dead_letter)
            if read.headers.get("error.stage") == b"emit"
        ]
        assert len(letters) == 1, [read.headers for read in letters]
        letter = letters[0]
        error = letter.headers["error"].decode()
        assert "MessageSizeTooLargeError" in error and output in error, error
        repartition = f"{attack.names.app_id}.by-key"
        assert letter.headers["error.topic"] == repartition.encode()
        assert json.loads(letter.value or b"")["key"] == key  # the keyed record, whole
        assert attack.worker.metric("storage_events_refused_records_total", topic=output) == 1

        attack.restart_and_check(raw_key)
        assert len(attack.read(attack.names.dead_letter)) == 1

        # The operator raises the limit and replays: the event comes out (no "duplicate").
        asyncio.run(alter_topic(kafka_bootstrap, output, {"max.message.bytes": "1048576"}))
        replay = subprocess.run(
            [
                sys.executable,
                *("-m", "streams", "replay-dead-letters"),
                *("--from", attack.names.dead_letter, "--match-error", "MessageSizeTooLarge"),
            ],
            cwd=ROOT,
            env=attack.worker.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert replay.returncode == 0, replay.stderr
        attack.wait_out(key)
    finally:
        attack.worker.stop()


def ready_answer(worker: Worker) -> tuple[int, dict[str, Any]] | None:
    answer = worker._get("/ready")
    return None if answer is None else (answer[0], json.loads(answer[1]))


@pytest.mark.parametrize(
    ("stage", "guarantee"),
    [("normalize", "exactly_once"), ("emit", "exactly_once"), ("emit", "at_least_once")],
)
def test_a_stage_that_cannot_write_is_visible_and_stops_within_its_grace(
    kafka_bootstrap: str, tmp_path: Path, stage: str, guarantee: str
) -> None:
    """Kafka takes no write for the topic a stage writes to (as if it were away: the
    failpoint STREAMS_UNWRITABLE_TOPIC, since the broker is shared), so the stage cannot
    make progress: /ready says so, the log says so once every few seconds, and SIGTERM ends
    the worker within STOP_GRACE_S. Once writable again, a restart emits what was stuck (its
    input was not committed)."""
    names = Topology()
    stuck_topic = f"{names.app_id}.by-key" if stage == "normalize" else names.output("default")
    attack = Attack(
        kafka_bootstrap,
        tmp_path / "worker",
        {"STREAMS_PROCESSING_GUARANTEE": guarantee, "STREAMS_UNWRITABLE_TOPIC": stuck_topic},
        names,
    )
    try:
        attack.worker.start()
        key = unique("stuck/out")
        raw_key = uuid.uuid4().bytes
        attack.send([raw(s3_body(s3_record(key, "00E0")), "s3")], raw_key)

        def stuck() -> dict[str, Any] | None:
            answer = ready_answer(attack.worker)
            if answer is None or answer[0] != 503:
                return None
            found = answer[1]["stages"].get(stage, {})
            return found if "why" in found else None

        reported = wait_for(stuck, 60, f"/ready to report the {stage} stage stuck")
        assert f"topic {stuck_topic} is unwritable" in reported["why"], reported
        started = time.monotonic()
        wait_for(lambda: time.monotonic() - started > 10, 15, "10 s of being stuck", 1)
        log = attack.worker.log_path.read_text(errors="replace")
        lines = [line for line in log.splitlines() if f"{stage} stage cannot make progress" in line]
        assert 1 <= len(lines) <= 8, lines  # about one per 5 s and cause, not one per retry
        assert key not in attack.keys_out()

        process = attack.worker.process
        assert process is not None
        stopping = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(STOP_GRACE_S + 10)
        took = time.monotonic() - stopping
        assert took <= STOP_GRACE_S + 3, f"stopped after {took:.1f} s\n{attack.worker.tail(40)}"
        assert code in (0, EXIT_STOP_TIMEOUT), attack.worker.tail(40)
        assert "abandoning the batches that could not finish" in attack.worker.tail(200)

        # Writable again, the worker reads the uncommitted batch again and emits it.
        del attack.worker.env["STREAMS_UNWRITABLE_TOPIC"]
        attack.worker.start()
        attack.wait_out(key)
        attack.restart_and_check(raw_key)
        assert attack.keys_out().count(key) == 1
    finally:
        attack.worker.stop()
