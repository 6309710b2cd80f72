"""Records the Kafka client cannot read, as an attacker writes them (issue 31): a principal
that may write only a `default_source = "minio"` raw topic puts one record there that
confluent-kafka cannot hand over whole, and the stream must step past it, not stop or stall.

* a header name that is not UTF-8: `Message.headers()` raises SystemError (it stopped the
  normalize stage, exit 1 on every restart);
* a zstd record batch that librdkafka refuses to decompress (95 MB of spaces in 3 KB on the
  topic): librdkafka reports `_BAD_COMPRESSION` tied to the batch's offset on every fetch
  and never hands over what follows on that partition (it blocked it silently);
* compressed records that inflate past the raw topic's limit: the worker decompressed a whole
  fetch at once (30 x 48 MB: 1.3-1.5 GB of memory).

Each test writes the attack, then a control delivery on the same partition, which must be
emitted; the attack is dead-lettered with what is known of it and the reason; the worker
keeps running, ready, and a restart does not meet the record again.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from support.kafka_io import Read, read_topic, write_header_name
from support.payloads import s3_record
from support.worker import Topology, Worker, wait_for

from streams.core.partitioning import partition_for
from streams.core.records import partition_key

pytestmark = pytest.mark.kafka

PARTITIONS = 2  # Topology.config's
ATTACKED = 0
"""The raw partition every attack and its control are written to."""


class MinioTopic:
    """A worker whose only raw topic carries MinIO (`default_source`), the attacker's."""

    def __init__(self, bootstrap: str, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.bootstrap = bootstrap
        self.names = Topology()
        config = self.names.config().replace(
            f'raw_topics = ["{self.names.raw}"]',
            f'raw_topics = [{{ name = "{self.names.raw}", default_source = "minio" }}]',
        )
        self.worker = Worker(bootstrap, config, workdir, env)

    @property
    def raw(self) -> str:
        return self.names.raw

    @property
    def repartition(self) -> str:
        return f"{self.names.app_id}.by-key"

    def read(self, topic: str) -> list[Read]:
        return asyncio.run(read_topic(self.bootstrap, topic))

    def keys_out(self) -> list[str]:
        return [read.json()["key"] for read in self.read(self.names.output("default"))]

    def letters(self) -> list[Read]:
        return self.read(self.names.dead_letter)

    def wait_out(self, key: str, timeout_s: float = 90) -> None:
        try:
            wait_for(lambda: key in self.keys_out(), timeout_s, f"{key} on the output", 0.5)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.worker.tail(60)}") from None

    def send_control(self, key: str, partition: int = ATTACKED) -> None:
        """A MinIO delivery (no headers: the topic's own source) to `partition`."""
        write(self.bootstrap, self.raw, partition, [(b"control", minio_body(key))])

    def running_and_ready(self) -> None:
        process = self.worker.process
        assert process is not None and process.poll() is None, self.worker.tail(60)
        answer = self.worker._get("/ready")
        assert answer is not None and answer[0] == 200, (answer, self.worker.tail(40))

    def restart_and_check(self) -> None:
        """Stopped cleanly, started again: ready, and a new control emitted."""
        assert self.worker.stop() == 0, self.worker.tail(60)
        self.worker.start()
        control = unique("control/after-restart")
        self.send_control(control)
        self.wait_out(control)
        self.running_and_ready()


@pytest.fixture
def minio_topic(kafka_bootstrap: str, tmp_path: Path) -> Iterator[MinioTopic]:
    made = MinioTopic(kafka_bootstrap, tmp_path / "worker")
    try:
        yield made
    finally:
        made.worker.stop()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def minio_body(key: str, sequencer: str = "17A0000000000001") -> bytes:
    record = s3_record(key, sequencer, event="s3:ObjectCreated:Put")
    record["eventSource"] = "minio:s3"
    return json.dumps(
        {"EventName": "s3:ObjectCreated:Put", "Key": f"uploads/{key}", "Records": [record]}
    ).encode()


def write(
    bootstrap: str,
    topic: str,
    partition: int,
    records: list[tuple[bytes, bytes]],
    compression: str = "none",
    max_bytes: int = 1_000_000,
) -> None:
    """(key, value) records to `partition`, in order, as librdkafka writes them: with
    `compression`, the records of one call share one record batch (one linger window)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": compression,
            # The producer checks a record's uncompressed size; the broker the batch's.
            "message.max.bytes": max_bytes,
            "linger.ms": 1000 if len(records) > 1 else 0,
            "batch.size": 2_000_000_000 if compression != "none" else 1_000_000,
            "enable.idempotence": True,
        }
    )
    for key, value in records:
        producer.produce(topic, value, key=key, partition=partition)
    assert producer.flush(120) == 0


# aiokafka's C record builder refuses such a header name; its pure-Python one writes what a
# str subclass's encode() returns, as librdkafka, franz-go or a hand-built batch write any bytes.
def same_partition_key(partition: int) -> str:
    """An object key of the `default` instance whose events go to repartition `partition`."""
    while True:
        key = unique("control/same-partition")
        if partition_for(partition_key("default", "uploads", key), PARTITIONS) == partition:
            return key


# -- a header name that is not UTF-8 -------------------------------------------------------


def test_a_header_name_that_is_not_utf8_is_dead_lettered_not_a_stop(
    minio_topic: MinioTopic,
) -> None:
    """Before: `Message.headers()` raised SystemError in the normalize stage, the worker
    exited 1, and again after each restart (every topic and instance down)."""
    attack = minio_topic
    attack.worker.start()
    poison_key = unique("poison/header-name")
    poison = minio_body(poison_key)
    offset = write_header_name(
        attack.bootstrap, attack.raw, ATTACKED, b"raw-key", b"\xff\xfeX", poison
    )
    control = unique("control/after-header-name")
    attack.send_control(control)

    attack.wait_out(control)
    attack.running_and_ready()
    assert poison_key not in attack.keys_out()
    [letter] = [read for read in attack.letters() if read.value == poison]
    assert letter.key == b"raw-key"
    assert letter.headers["error.stage"] == b"normalize"
    assert letter.headers["error.topic"] == attack.raw.encode()
    error = letter.headers["error"].decode()
    assert "header" in error and "UTF-8" in error, error
    assert f"{attack.raw}[{ATTACKED}]@{offset}" in error, error
    assert set(letter.headers) == {"error", "error.stage", "error.topic"}  # none readable

    attack.restart_and_check()
    assert len([read for read in attack.letters() if read.value == poison]) == 1


def test_a_header_name_that_is_not_utf8_on_the_repartition_topic_is_dead_lettered_by_emit(
    minio_topic: MinioTopic,
) -> None:
    """Stage two reads headers too (only the worker writes its topic; whoever else could,
    must not stop it either): the record is dead-lettered and its partition goes on."""
    attack = minio_topic
    attack.worker.start()
    partition = 1
    value = b'{"not": "a keyed event"}'
    offset = write_header_name(
        attack.bootstrap, attack.repartition, partition, b"by-key", b"\xff\xfeX", value
    )
    control = same_partition_key(partition)  # emitted by the same emit partition, after it
    attack.send_control(control)

    attack.wait_out(control)
    attack.running_and_ready()
    [letter] = [read for read in attack.letters() if read.value == value]
    assert letter.key == b"by-key"
    assert letter.headers["error.stage"] == b"emit"
    assert letter.headers["error.topic"] == attack.repartition.encode()
    error = letter.headers["error"].decode()
    assert "header" in error and "UTF-8" in error, error
    assert f"{attack.repartition}[{partition}]@{offset}" in error, error


# -- a compressed record librdkafka cannot decompress --------------------------------------


@pytest.mark.slow
def test_a_record_that_cannot_be_decompressed_is_dead_lettered_and_its_partition_goes_on(
    minio_topic: MinioTopic,
) -> None:
    """95 MB of spaces, zstd: 3 KB on the topic (under its 4 MiB limit), beyond what
    librdkafka decompresses. Before: `_BAD_COMPRESSION` on every fetch (a warning each),
    the control after it never handled, `/ready` 200, no "cannot make progress". Then a
    batch of two such records: each is stepped past (librdkafka names only the batch's first
    offset)."""
    attack = minio_topic
    attack.worker.start()
    spaces = b" " * (95 * 1024 * 1024)
    write(attack.bootstrap, attack.raw, ATTACKED, [(b"big", spaces)], "zstd", max_bytes=10**9)
    control = unique("control/after-bomb")
    attack.send_control(control)
    attack.wait_out(control, timeout_s=60)
    attack.running_and_ready()

    write(
        attack.bootstrap,
        attack.raw,
        ATTACKED,
        [(b"big-1", spaces[: 60 * 1024 * 1024]), (b"big-2", spaces[: 60 * 1024 * 1024])],
        "zstd",
        max_bytes=10**9,
    )
    second = unique("control/after-bomb-batch")
    attack.send_control(second)
    attack.wait_out(second, timeout_s=60)
    attack.running_and_ready()

    letters = [
        read for read in attack.letters() if read.headers.get("error.topic") == attack.raw.encode()
    ]
    assert len(letters) == 3, [read.headers for read in letters]
    offsets = []
    for letter in letters:
        assert letter.value is None and letter.key is None
        assert letter.headers["error.stage"] == b"normalize"
        error = letter.headers["error"].decode()
        assert "cannot be read" in error and "_BAD_COMPRESSION" in error, error
        offsets.append(int(error.split(f"{attack.raw}[{ATTACKED}]@")[1].split(" ")[0]))
    first = min(offsets)  # the bomb, its control, then the batch of two
    assert sorted(offsets) == [first, first + 2, first + 3], offsets
    assert attack.worker.metric("storage_events_unreadable_records_total", stage="normalize") == 3
    log = attack.worker.log_path.read_text(errors="replace")
    assert log.count("_BAD_COMPRESSION") <= 10, log.count("_BAD_COMPRESSION")

    attack.restart_and_check()
    assert len([read for read in attack.letters() if read.value is None]) == 3


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_a_record_the_emit_stage_cannot_decompress_is_stepped_past_in_its_transaction(
    kafka_bootstrap: str, tmp_path: Path, guarantee: str
) -> None:
    """Only the worker writes the repartition topic, but a record there that librdkafka
    reports unreadable must not block its partition either: dead-lettered by the emit stage,
    its offset committed with the part (in the transaction, with exactly_once), and the next
    record of the partition emitted; read again after a restart it is not."""
    attack = MinioTopic(
        kafka_bootstrap, tmp_path / "worker", {"STREAMS_PROCESSING_GUARANTEE": guarantee}
    )
    try:
        attack.worker.start()
        partition = 1
        spaces = b" " * (120 * 1024 * 1024)  # past librdkafka's default cap (100 MB)
        write(attack.bootstrap, attack.repartition, partition, [(b"bomb", spaces)], "zstd", 10**9)
        control = same_partition_key(partition)
        attack.send_control(control)
        attack.wait_out(control, timeout_s=60)
        attack.running_and_ready()
        [letter] = [
            read
            for read in attack.letters()
            if read.headers.get("error.topic") == attack.repartition.encode()
        ]
        assert letter.value is None and letter.key is None
        assert letter.headers["error.stage"] == b"emit"
        error = letter.headers["error"].decode()
        assert f"{attack.repartition}[{partition}]@" in error and "_BAD_COMPRESSION" in error
        attack.restart_and_check()
        assert len([read for read in attack.letters() if read.value is None]) == 1
    finally:
        attack.worker.stop()


# -- compressed records that inflate the worker --------------------------------------------


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.slow
def test_compressed_records_do_not_inflate_the_worker(minio_topic: MinioTopic) -> None:
    """30 zstd records of 48 MB of spaces (about 300 KB on the topic), one fetch's worth.
    Before: the normalize stage's process peaked at 1.3-1.5 GB (librdkafka decompressed the
    whole fetch); now each is refused past the raw topic's limit and dead-lettered."""
    attack = minio_topic
    attack.worker.start()
    process = attack.worker.process
    assert process is not None
    warm = unique("control/warm-up")
    attack.send_control(warm)
    attack.wait_out(warm)
    before = peak_rss_mb(process.pid)

    value = b" " * (48 * 1000 * 1000)
    for n in range(30):
        write(attack.bootstrap, attack.raw, ATTACKED, [(b"inflate-%d" % n, value)], "zstd", 10**9)
    control = unique("control/after-inflate")
    attack.send_control(control)
    attack.wait_out(control, timeout_s=120)
    attack.running_and_ready()
    peak = peak_rss_mb(process.pid)
    print(f"worker peak memory: {before:.0f} MB before the attack, {peak:.0f} MB after")

    letters = [
        read for read in attack.letters() if read.headers.get("error.topic") == attack.raw.encode()
    ]
    assert len(letters) == 30, len(letters)
    assert peak < before + 200, f"peak {peak:.0f} MB (before the attack {before:.0f} MB)"


def test_a_value_over_the_raw_limit_is_dead_lettered_before_it_is_parsed(
    minio_topic: MinioTopic,
) -> None:
    """A compressed record whose value is over the raw topic's 4 MiB once decompressed (but
    within what the worker decompresses) is dead-lettered with its size and the limit, not
    parsed (a bridge never publishes one)."""
    attack = minio_topic
    attack.worker.start()
    poison_key = unique("poison/over-raw-limit")
    body = minio_body(poison_key)
    padded = body[:-1] + b" " * (4 * 1024 * 1024 + 10_000) + body[-1:]  # valid JSON
    write(attack.bootstrap, attack.raw, ATTACKED, [(b"padded", padded)], "zstd", 10**9)
    control = unique("control/after-over-raw-limit")
    attack.send_control(control)

    attack.wait_out(control)
    attack.running_and_ready()
    assert poison_key not in attack.keys_out()
    [letter] = [read for read in attack.letters() if read.key == b"padded"]
    error = letter.headers["error"].decode()
    assert f"{len(padded):,} bytes" in error and "4,194,304" in error, error
    assert letter.headers["error.stage"] == b"normalize"
