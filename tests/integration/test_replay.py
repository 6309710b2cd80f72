"""`python -m streams replay-dead-letters` against the real broker: dry run, replay, selection."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from support.kafka_io import read_topic

from streams.config import Settings
from streams.core.event import FileEvent
from streams.core.records import OutRecord, RawRecord, dead_letter_record, keyed_record
from streams.engine.topics import TopicSpec, ensure_topics
from streams.replay import replay_dead_letters

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
ADDED = {"error", "error.stage", "error.topic"}


def run_replay(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {name: value for name, value in os.environ.items() if name != "STREAMS_CONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "streams", "replay-dead-letters", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=environ | {"KAFKA_BOOTSTRAP_SERVERS": bootstrap},
        timeout=120,
        check=False,
    )


async def produce_records(bootstrap: str, records: list[OutRecord]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        futures = [
            await producer.send(
                record.topic, record.value, key=record.key, headers=list(record.headers)
            )
            for record in records
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def topics(bootstrap: str, *names: str) -> None:
    specs = [TopicSpec(name, 2, 1) for name in names]
    asyncio.run(ensure_topics(bootstrap, specs, retry_for_s=30))


def delivery(raw_topic: str, body: bytes, delivery_id: str) -> RawRecord:
    """A raw record as a bridge wrote it: the body as delivered, the bridge's headers."""
    return RawRecord(
        raw_topic,
        body,
        {
            "source": b"s3",
            "transport": b"webhook",
            "delivery-id": delivery_id.encode(),
            "received-at": b"1764460800.000000",
            "header.x-amz-sns-message-type": b"Notification",
        },
    )


def stream_config(tmp_path: Path, raw_topic: str, dead_topic: str, extra: str = "") -> Path:
    """A config whose raw and dead-letter topics are these (replay's default targets)."""
    path = tmp_path / "streams.toml"
    path.write_text(
        f'[stream]\nraw_topics = ["{raw_topic}"]\ndead_letter_topic = "{dead_topic}"\n{extra}'
    )
    return path


def test_a_dry_run_publishes_nothing_and_a_replay_republishes_the_original_record(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:10]
    raw_topic, dead_topic = f"raw-{suffix}", f"dead-letter-{suffix}"
    topics(kafka_bootstrap, raw_topic, dead_topic)
    config = str(stream_config(tmp_path, raw_topic, dead_topic))
    original = delivery(raw_topic, b'{"Records": [{"eventName": \x00 not json', "d-1")
    letter = dead_letter_record(
        dead_topic, original, b"key-1", "unparseable s3 delivery: Expecting value", "normalize"
    )
    asyncio.run(produce_records(kafka_bootstrap, [letter]))

    dry = run_replay(kafka_bootstrap, "--config", config, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    lines = [json.loads(line) for line in dry.stdout.splitlines()]
    assert lines == [
        {
            "partition": lines[0]["partition"],
            "offset": 0,
            "source": "s3",
            "stage": "normalize",
            "error": "unparseable s3 delivery: Expecting value",
            "destination": raw_topic,
            "size": len(original.value),
        }
    ]
    assert "would replay 1 of 1 dead letter(s)" in dry.stderr
    assert asyncio.run(read_topic(kafka_bootstrap, raw_topic)) == []

    real = run_replay(kafka_bootstrap, "--config", config)
    assert real.returncode == 0, real.stderr
    assert real.stdout == ""
    assert f"replayed 1 of 1 dead letter(s) from {dead_topic} ({raw_topic}: 1)" in real.stderr
    replayed = asyncio.run(read_topic(kafka_bootstrap, raw_topic))
    assert len(replayed) == 1
    assert replayed[0].value == original.value  # the bytes exactly as delivered
    assert replayed[0].key == b"key-1"
    assert replayed[0].headers == dict(original.headers)  # the bridge's, without error*
    assert not ADDED & set(replayed[0].headers)
    # The dead-letter topic is left as it was.
    assert len(asyncio.run(read_topic(kafka_bootstrap, dead_topic))) == 1


def test_match_error_limit_and_to_select_what_is_replayed_and_where(
    kafka_bootstrap: str,
) -> None:
    suffix = uuid.uuid4().hex[:10]
    raw_topic, dead_topic, fixed = f"raw-{suffix}", f"dead-letter-{suffix}", f"fixed-{suffix}"
    topics(kafka_bootstrap, raw_topic, dead_topic, fixed)
    letters = [
        dead_letter_record(
            dead_topic,
            delivery(raw_topic, f"body-{n}".encode(), f"d-{n}"),
            b"k",
            error,
            "normalize",
        )
        for n, error in enumerate(["gcs: no generation", "s3: bad key", "gcs: no generation"])
    ]
    # Not from the stream: no error.topic header, so only --to gives it a destination.
    letters.append(OutRecord(dead_topic, b"k", b"orphan", (("error", b"gcs: no generation"),)))
    asyncio.run(produce_records(kafka_bootstrap, letters))

    printed = io.StringIO()
    settings = Settings.model_validate(
        {"stream": {"raw_topics": [raw_topic], "dead_letter_topic": dead_topic}}
    )
    summary = replay_dead_letters(
        kafka_bootstrap,
        dead_topic,
        settings=settings,
        dry_run=True,
        match_error="gcs:",
        out=printed,
    )
    assert (summary.read, summary.selected, summary.not_matching, summary.no_destination) == (
        4,
        2,
        1,
        1,
    )
    destinations = [json.loads(line)["destination"] for line in printed.getvalue().splitlines()]
    assert destinations == [raw_topic, raw_topic]

    summary = replay_dead_letters(kafka_bootstrap, dead_topic, fixed, match_error="gcs:", limit=2)
    assert summary.replayed == 2
    assert asyncio.run(read_topic(kafka_bootstrap, raw_topic)) == []
    bodies = sorted(read.value for read in asyncio.run(read_topic(kafka_bootstrap, fixed)))
    # The key keeps all four on one partition, in order: the first two that match.
    assert bodies == [b"body-0", b"body-2"]

    missing = run_replay(kafka_bootstrap, "--from", f"no-such-topic-{suffix}", "--dry-run")
    assert missing.returncode == 2
    assert missing.stderr.strip().startswith("error: ")
    assert "does not exist" in missing.stderr


def test_a_dead_letter_s_own_headers_never_choose_a_topic_on_their_own(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Issue 23 #3: without `--to`, each letter went to the topic its own `error.topic`
    named: a `deleted` no bridge saw was republished into tenant-b's output topic, and a keyed
    record naming `instance: tenant-b` was sent to the repartition topic for tenant-b."""
    suffix = uuid.uuid4().hex[:10]
    raw_topic, dead_topic, by_key = f"raw-{suffix}", f"dead-letter-{suffix}", f"by-key-{suffix}"
    output_b, consumer_dead = f"events-{suffix}-tenant-b", f"events-{suffix}-tenant-a.dead-letter"
    topics(kafka_bootstrap, raw_topic, dead_topic, by_key, output_b, consumer_dead)
    extra = (
        f'repartition_topic = "{by_key}"\n'
        f'[[instances]]\nname = "tenant-a"\nbucket = "uploads"\nsources = ["s3"]\n'
        f'topic = "events-{suffix}-tenant-a"\n'
        f'[[instances]]\nname = "tenant-b"\nbucket = "uploads"\nsources = ["s3"]\n'
        f'topic = "{output_b}"\n'
    )
    config = str(stream_config(tmp_path, raw_topic, dead_topic, extra))

    def keyed_letter(instance: str, header_instance: str, key: str) -> OutRecord:
        event = FileEvent(id=f"s3:{key}", type="deleted", key=key, bucket="uploads", provider="s3")
        keyed = keyed_record(by_key, instance, event, None)
        headers = {name: value for name, value in keyed.headers} | {
            "instance": header_instance.encode()
        }
        record = RawRecord(by_key, keyed.value or b"", headers)
        return dead_letter_record(dead_topic, record, keyed.key, "refused", "emit")

    forged_output = dead_letter_record(
        dead_topic,
        RawRecord(output_b, b'{"type": "deleted", "key": "x"}', {"ce_type": b"deleted"}),
        b"x",
        "forged",
        "normalize",
    )
    control = dead_letter_record(
        dead_topic, delivery(raw_topic, b"fixed-body", "d-1"), b"k", "s3: bug", "normalize"
    )
    claimed_b = keyed_letter("tenant-a", "tenant-b", "tenant-a-key")  # the key says tenant-a
    honest_emit = keyed_letter("tenant-b", "tenant-b", "honest-key")
    asyncio.run(produce_records(kafka_bootstrap, [forged_output, claimed_b, honest_emit, control]))
    # A consumer may write its own dead-letter topic (`streams acls`): its letters are its own.
    from_consumer = dead_letter_record(
        consumer_dead, delivery(raw_topic, b"consumer-body", "d-2"), b"k", "x", "normalize"
    )
    asyncio.run(produce_records(kafka_bootstrap, [from_consumer]))

    replay = run_replay(kafka_bootstrap, "--config", config)
    assert replay.returncode == 1, replay.stderr
    assert asyncio.run(read_topic(kafka_bootstrap, output_b)) == []
    assert [read.value for read in asyncio.run(read_topic(kafka_bootstrap, raw_topic))] == [
        b"fixed-body"
    ]
    replayed_keyed = asyncio.run(read_topic(kafka_bootstrap, by_key))
    assert [read.key for read in replayed_keyed] == [honest_emit.key]
    skipped = [line for line in replay.stderr.splitlines() if line.startswith("skipped ")]
    assert len(skipped) == 2, replay.stderr
    reasons = sorted(line.partition(": ")[2] for line in skipped)
    assert reasons[0].startswith(f"error.topic is not a raw topic: error.topic '{output_b}'")
    assert reasons[1].startswith(
        "instance does not match: the record key is not instance tenant-b's"
    )
    assert (
        f"replayed 2 of 4 dead letter(s) from {dead_topic} ({by_key}: 1, {raw_topic}: 1); "
        "1 skipped: error.topic is not a raw topic (name a target with --to); "
        "1 skipped: instance does not match (name a target with --to)"
    ) in replay.stderr

    other = run_replay(kafka_bootstrap, "--config", config, "--from", consumer_dead)
    assert other.returncode == 1, other.stderr
    assert f"not from the stream's dead-letter topic {dead_topic}" in other.stderr
    assert len(asyncio.run(read_topic(kafka_bootstrap, raw_topic))) == 1
    # An explicit --to is the operator's own choice, and is followed.
    chosen = run_replay(
        kafka_bootstrap, "--config", config, "--from", consumer_dead, "--to", raw_topic
    )
    assert chosen.returncode == 0, chosen.stderr
    assert len(asyncio.run(read_topic(kafka_bootstrap, raw_topic))) == 2
