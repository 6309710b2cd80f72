"""The first slice on the real broker: an S3 notification in, one canonical event out."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from support.kafka_io import produce, raw, read_topic
from support.worker import Topology, Worker

pytestmark = pytest.mark.kafka

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "s3-put.json"


def test_s3_put_with_encoded_key_comes_out_once_decoded(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    names = Topology()
    worker = Worker(kafka_bootstrap, names.config(), tmp_path).start()
    try:
        body = EXAMPLE.read_bytes()
        asyncio.run(produce(kafka_bootstrap, names.raw, [raw(body, "s3"), raw(body, "s3")]))
        worker.wait_metric("storage_events_duplicates_total", 1, instance="default")
        worker.wait_metric("storage_events_emitted_total", 1, instance="default")
        records = asyncio.run(read_topic(kafka_bootstrap, names.output("default")))
    finally:
        assert worker.stop() == 0, worker.tail()

    assert len(records) == 1
    event = records[0].json()
    assert event["type"] == "created"
    assert event["key"] == "photos/red flower.jpg"
    assert event["bucket"] == "uploads"
    assert event["provider"] == "s3"
    assert records[0].key == b"photos/red flower.jpg"
    headers = records[0].headers
    assert headers["ce_id"].decode() == event["id"]
    assert headers["ce_subject"] == b"photos/red flower.jpg"
    assert headers["ce_type"] == b"storage.object.created"
    assert headers["ce_specversion"] == b"1.0"
    assert json.loads(records[0].value or b"")["raw"]["eventName"] == "ObjectCreated:Put"


def test_worker_with_no_config_runs_the_default_instance(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """`faust -A streams worker` without STREAMS_CONFIG: files.raw -> files.events.default."""
    worker = Worker(
        kafka_bootstrap, "", tmp_path, env={"STREAMS_CONFIG": "", "STREAMS_APP_ID": "test-noconfig"}
    )
    worker.start()
    try:
        before = len(asyncio.run(read_topic(kafka_bootstrap, "files.events.default")))
        body = EXAMPLE.read_text().replace("0055AED6DCD90281E5", "0055AED6DCD90281F0")
        asyncio.run(produce(kafka_bootstrap, "files.raw", [raw(body, "s3")]))
        worker.wait_metric("storage_events_emitted_total", 1, instance="default")
        after = asyncio.run(read_topic(kafka_bootstrap, "files.events.default"))
    finally:
        assert worker.stop() == 0, worker.tail()
    assert len(after) == before + 1
    assert after[-1].json()["sequencer"] == "0055AED6DCD90281F0" or any(
        read.json()["sequencer"] == "0055AED6DCD90281F0" for read in after
    )
