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

from streams.core.records import OutRecord, RawRecord, dead_letter_record
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


def test_a_dry_run_publishes_nothing_and_a_replay_republishes_the_original_record(
    kafka_bootstrap: str,
) -> None:
    suffix = uuid.uuid4().hex[:10]
    raw_topic, dead_topic = f"raw-{suffix}", f"dead-letter-{suffix}"
    topics(kafka_bootstrap, raw_topic, dead_topic)
    original = delivery(raw_topic, b'{"Records": [{"eventName": \x00 not json', "d-1")
    letter = dead_letter_record(
        dead_topic, original, b"key-1", "unparseable s3 delivery: Expecting value", "normalize"
    )
    asyncio.run(produce_records(kafka_bootstrap, [letter]))

    dry = run_replay(kafka_bootstrap, "--from", dead_topic, "--dry-run")
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

    real = run_replay(kafka_bootstrap, "--from", dead_topic)
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
    summary = asyncio.run(
        replay_dead_letters(
            kafka_bootstrap, dead_topic, dry_run=True, match_error="gcs:", out=printed
        )
    )
    assert (summary.read, summary.selected, summary.not_matching, summary.no_destination) == (
        4,
        2,
        1,
        1,
    )
    destinations = [json.loads(line)["destination"] for line in printed.getvalue().splitlines()]
    assert destinations == [raw_topic, raw_topic]

    summary = asyncio.run(
        replay_dead_letters(kafka_bootstrap, dead_topic, fixed, match_error="gcs:", limit=2)
    )
    assert summary.replayed == 2
    assert asyncio.run(read_topic(kafka_bootstrap, raw_topic)) == []
    bodies = sorted(read.value for read in asyncio.run(read_topic(kafka_bootstrap, fixed)))
    # The key keeps all four on one partition, in order: the first two that match.
    assert bodies == [b"body-0", b"body-2"]

    missing = run_replay(kafka_bootstrap, "--from", f"no-such-topic-{suffix}", "--dry-run")
    assert missing.returncode == 2
    assert missing.stderr.strip().startswith("error: ")
    assert "does not exist" in missing.stderr
