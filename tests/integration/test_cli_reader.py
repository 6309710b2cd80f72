"""`tail`, `dead-letters` and `replay-dead-letters` on confluent-kafka (streams.reader), against
the real broker: transactions read committed and the "earlier" marker after them, a record
whose header name is not UTF-8 (confluent-kafka cannot read its headers) in each command's
topic, a topic created after the tail started, Ctrl-C, and a replayed keyed record on the
partition the worker's own producer gives its key."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from support.kafka_io import create_topic, read_topic, write_header_name

from streams.core.partitioning import partition_for
from streams.core.records import RawRecord, dead_letter_record

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
BAD_NAME = b"\xff\xfeX"
"""A header name that is not UTF-8: Kafka takes any bytes, confluent-kafka cannot read it."""


# aiokafka's C record builder refuses such a header name; its pure-Python one writes what a
# str subclass's encode() returns, as librdkafka, franz-go or a hand-built batch write any bytes
# (as tests/integration/test_attack_unreadable.py does).
def produce(
    bootstrap: str, topic: str, records: list[tuple[bytes, list[tuple[str, bytes]]]]
) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    for value, headers in records:
        producer.produce(topic, value, b"k", partition=0, headers=headers)
    assert producer.flush(30) == 0


def transaction(bootstrap: str, topic: str, values: list[bytes], commit: bool) -> None:
    """`values` to partition 0 in one transaction, committed or aborted."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"cli-reader-{uuid.uuid4().hex[:8]}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value, b"k", partition=0)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def environ(bootstrap: str, **more: str) -> dict[str, str]:
    return {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "STREAMS_CONFIG": "", **more}


def streams(bootstrap: str, *args: str, **more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streams", *args],
        cwd=ROOT,
        env=environ(bootstrap, **more),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class Running:
    """A command in the background, its stdout and stderr lines collected as they come."""

    def __init__(self, bootstrap: str, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "streams", *args],
            cwd=ROOT,
            # SIGABRT (`exit_code`) makes it print every thread's stack on stderr.
            env=environ(bootstrap, PYTHONFAULTHANDLER="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self.collectors = [
            threading.Thread(target=self._collect, args=(stream, lines), daemon=True)
            for stream, lines in ((self.process.stdout, self.out), (self.process.stderr, self.err))
        ]
        for collector in self.collectors:
            collector.start()

    @staticmethod
    def _collect(stream: object, lines: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.append(line.rstrip("\n"))

    def until(self, found: object, timeout_s: float = 60) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if found(self):  # type: ignore[operator]
                return True
            if self.process.poll() is not None:
                time.sleep(0.2)  # the last lines
                return bool(found(self))  # type: ignore[operator]
            time.sleep(0.05)
        return False

    def exit_code(self, timeout_s: float) -> int:
        """Its exit code once it exits within `timeout_s`; else the test fails with where
        each of its threads was (faulthandler's dump on SIGABRT)."""
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGABRT)
            self.process.wait(30)
            for collector in self.collectors:  # to the end of its output: the dump
                collector.join(10)
            pytest.fail(f"still running after {timeout_s} s; its stacks:\n" + "\n".join(self.err))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)


def topic_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def test_tail_reads_committed_prints_the_earlier_marker_after_them_then_new_ones(
    kafka_bootstrap: str,
) -> None:
    topic = topic_name("tail-txn")
    asyncio.run(create_topic(kafka_bootstrap, topic, partitions=3))
    transaction(kafka_bootstrap, topic, [b'{"n": 1}', b'{"n": 2}'], commit=True)
    transaction(kafka_bootstrap, topic, [b'{"aborted": true}'], commit=False)
    transaction(kafka_bootstrap, topic, [b'{"n": 3}'], commit=True)
    tail = Running(kafka_bootstrap, "tail", "--topic", topic, "--count", "4", "--timeout", "60")
    try:
        assert tail.until(lambda t: any("earlier event(s) above" in line for line in t.err)), (
            tail.err
        )
        # The three committed records, not the aborted one, then the marker counting them.
        assert tail.out == ['{"n":1}', '{"n":2}', '{"n":3}'], tail.out
        assert tail.err[-1] == (
            "# 3 earlier event(s) above, from before this tail started; new ones follow "
            "(--from-end: only new ones)"
        )
        transaction(kafka_bootstrap, topic, [b'{"n": 4}'], commit=True)
        assert tail.process.wait(60) == 0, tail.err
    finally:
        tail.stop()
    assert tail.out[-1] == '{"n":4}'

    new = Running(kafka_bootstrap, "tail", "--topic", topic, "--from-end", "--count", "1")
    try:
        assert new.until(lambda t: t.err and t.err[0].startswith("# tailing")), new.err
        # No "earlier" count with --from-end; only what comes after it started.
        deadline = time.monotonic() + 60
        while new.process.poll() is None and time.monotonic() < deadline:
            transaction(kafka_bootstrap, topic, [b'{"n": 5}'], commit=True)
            new.until(lambda t: t.process.poll() is not None, 1)
        assert new.process.wait(60) == 0, new.err
    finally:
        new.stop()
    assert new.out == ['{"n":5}'], new.out
    assert not any("earlier" in line for line in new.err), new.err


def test_a_header_name_that_is_not_utf8_stops_neither_tail_nor_dead_letters(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = topic_name("unreadable-headers")
    asyncio.run(create_topic(kafka_bootstrap, topic))
    produce(kafka_bootstrap, topic, [(b'{"n": 1}', [("ce_id", b"s3:1")])])
    offset = write_header_name(kafka_bootstrap, topic, 0, b"k", BAD_NAME, b'{"n": 2}')
    produce(kafka_bootstrap, topic, [(b'{"n": 3}', [("error", b"not JSON")])])
    reason = (
        f"the headers of the record at {topic}[0]@{offset} cannot be read: a header name is "
        "not UTF-8 (b'\\xff\\xfeX'"
    )

    tailed = streams(kafka_bootstrap, "tail", "--topic", topic, "--headers", "--count", "3")
    assert tailed.returncode == 0, tailed.stderr
    assert tailed.stdout.splitlines() == [
        '{"headers":{"ce_id":"s3:1"},"event":{"n":1}}',
        '{"headers":null,"event":{"n":2}}',
        '{"headers":{"error":"not JSON"},"event":{"n":3}}',
    ]
    [said] = [line for line in tailed.stderr.splitlines() if "cannot be read" in line]
    assert said.startswith(f"# {reason}"), said
    assert "Traceback" not in tailed.stderr

    plain = streams(kafka_bootstrap, "tail", "--topic", topic, "--count", "3")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines() == ['{"n":1}', '{"n":2}', '{"n":3}']

    config = tmp_path / "streams.toml"
    config.write_text(f'[stream]\ndead_letter_topic = "{topic}"\n')
    letters = streams(kafka_bootstrap, "dead-letters", "--config", str(config), "--count", "3")
    assert letters.returncode == 0, letters.stderr
    lines = letters.stdout.splitlines()
    assert len(lines) == 3, letters.stdout
    assert f" {topic}[0]@{offset} ?: {reason}" in lines[1], lines[1]
    assert lines[1].endswith(" | 8 bytes: '{\"n\": 2}'"), lines[1]
    assert f" {topic}[0]@{offset + 1} ?: not JSON | " in lines[2], lines[2]
    assert "Traceback" not in letters.stderr


def test_replay_skips_a_letter_whose_headers_cannot_be_read_and_replays_the_others(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:10]
    raw_topic, dead_topic = f"raw-{suffix}", f"dead-letter-{suffix}"
    for name in (raw_topic, dead_topic):
        asyncio.run(create_topic(kafka_bootstrap, name))
    delivery = RawRecord(raw_topic, b"fixed-body", {"source": b"s3", "delivery-id": b"d-1"})
    letter = dead_letter_record(dead_topic, delivery, b"k", "s3: bug", "normalize")
    produce(kafka_bootstrap, dead_topic, [(letter.value or b"", list(letter.headers))])
    offset = write_header_name(kafka_bootstrap, dead_topic, 0, b"k", BAD_NAME, b"unreadable-body")
    produce(kafka_bootstrap, dead_topic, [(letter.value or b"", list(letter.headers))])
    config = tmp_path / "streams.toml"
    config.write_text(
        f'[stream]\nraw_topics = ["{raw_topic}"]\ndead_letter_topic = "{dead_topic}"\n'
    )

    dry = streams(kafka_bootstrap, "replay-dead-letters", "--config", str(config), "--dry-run")
    assert dry.returncode == 1, dry.stderr
    assert len(dry.stdout.splitlines()) == 2, dry.stdout
    assert asyncio.run(read_topic(kafka_bootstrap, raw_topic)) == []

    replay = streams(kafka_bootstrap, "replay-dead-letters", "--config", str(config))
    assert replay.returncode == 1, replay.stderr
    assert "Traceback" not in replay.stderr
    [skipped] = [line for line in replay.stderr.splitlines() if line.startswith("skipped ")]
    assert skipped.startswith(
        f"skipped {dead_topic}[0]@{offset}: the headers of the record at {dead_topic}[0]@{offset} "
        "cannot be read: a header name is not UTF-8"
    ), skipped
    assert skipped.endswith("; not replayed: it cannot be republished as it was"), skipped
    assert replay.stderr.splitlines()[-1] == (
        f"replayed 2 of 3 dead letter(s) from {dead_topic} ({raw_topic}: 2); "
        "1 skipped: not readable (a header name not UTF-8)"
    )
    replayed = asyncio.run(read_topic(kafka_bootstrap, raw_topic))
    assert [read.value for read in replayed] == [b"fixed-body", b"fixed-body"]
    assert all(read.headers == dict(delivery.headers) for read in replayed)


def test_replayed_records_go_to_the_partition_the_worker_gives_their_key(
    kafka_bootstrap: str,
) -> None:
    """librdkafka's own default partitioner (CRC32) is not the Java client's: a republished
    keyed record must land where the worker's producers put its key (murmur2)."""
    suffix = uuid.uuid4().hex[:10]
    dead_topic, fixed = f"dead-letter-{suffix}", f"fixed-{suffix}"
    asyncio.run(create_topic(kafka_bootstrap, dead_topic))
    asyncio.run(create_topic(kafka_bootstrap, fixed, partitions=6))
    keys = [f"tenant/key-{n}".encode() for n in range(24)]
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    for key in keys:
        record = dead_letter_record(
            dead_topic, RawRecord(fixed, key, {"source": b"s3"}), key, "bug", "normalize"
        )
        producer.produce(dead_topic, record.value, key, partition=0, headers=list(record.headers))
    assert producer.flush(30) == 0

    replay = streams(kafka_bootstrap, "replay-dead-letters", "--from", dead_topic, "--to", fixed)
    assert replay.returncode == 0, replay.stderr
    replayed = asyncio.run(read_topic(kafka_bootstrap, fixed))
    assert sorted(read.key or b"" for read in replayed) == sorted(keys)
    assert {read.key: read.partition for read in replayed} == {
        key: partition_for(key, 6) for key in keys
    }


@pytest.fixture
def sigint_default() -> Iterator[None]:
    """The commands started meanwhile get SIGINT as from a terminal. A suite started in the
    background by a non-interactive shell (as a CI job may be) inherits SIGINT ignored, its
    commands too, and Python installs its KeyboardInterrupt handler only over the default
    disposition: Ctrl-C would never reach them. A handler of this process is reset to the
    default in a child at exec; an ignored signal stays ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("sigint_default")
def test_tail_finds_a_topic_created_after_it_started_and_stops_on_ctrl_c(
    kafka_bootstrap: str,
) -> None:
    topic = topic_name("created-later")
    tail = Running(kafka_bootstrap, "tail", "--topic", topic)
    try:
        assert tail.until(lambda t: f"# {topic} does not exist yet: waiting for it" in t.err), (
            tail.err
        )
        asyncio.run(create_topic(kafka_bootstrap, topic, partitions=2))
        produce(kafka_bootstrap, topic, [(b'{"late": true}', [])])
        assert tail.until(lambda t: t.out == ['{"late":true}'], 60), (tail.out, tail.err)
        started = time.monotonic()
        tail.process.send_signal(signal.SIGINT)
        assert tail.exit_code(30) == 0, tail.err
        assert time.monotonic() - started < 10
    finally:
        tail.stop()
    assert not any("Traceback" in line for line in tail.err), tail.err
    # A topic that did not exist at start has no earlier records to count.
    assert not any("earlier" in line for line in tail.err), tail.err


def test_ctrl_c_during_a_replay_waits_for_what_was_sent_and_says_how_far_it_got(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KeyboardInterrupt midway (here: right after the first letter was handed to the
    producer): that letter is acknowledged before the command stops, and counted."""
    from streams import replay

    suffix = uuid.uuid4().hex[:10]
    dead_topic, fixed = f"dead-letter-{suffix}", f"fixed-{suffix}"
    for name in (dead_topic, fixed):
        asyncio.run(create_topic(kafka_bootstrap, name))
    letter = dead_letter_record(
        dead_topic, RawRecord(fixed, b"body", {"source": b"s3"}), b"k", "bug", "normalize"
    )
    produce(kafka_bootstrap, dead_topic, [(letter.value or b"", list(letter.headers))] * 2)
    copy = replay._copy

    def interrupted(consumer: object, republisher: object, *args: object) -> None:
        def send_then_stop(destination: str, dead: replay.DeadLetter) -> None:
            original(destination, dead)
            raise KeyboardInterrupt

        original = republisher.send  # type: ignore[attr-defined]
        republisher.send = send_then_stop  # type: ignore[attr-defined]
        copy(consumer, republisher, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(replay, "_copy", interrupted)
    with pytest.raises(replay.Interrupted) as stopped:
        replay.replay_dead_letters(kafka_bootstrap, dead_topic, fixed)
    assert str(stopped.value) == f"replayed 1 of 1 dead letter(s) from {dead_topic} ({fixed}: 1)"
    assert [read.value for read in asyncio.run(read_topic(kafka_bootstrap, fixed))] == [b"body"]
