"""What a raw topic's writer may claim, as an attacker tries it (issue 23, findings 1 and 8).

One real worker on the session broker, two raw topics: the stream's own, and `minio-*` with
`default_source = "minio"` (MinIO's own Kafka target; a credential allowed to write it is
what `streams acls --component bridge --topic minio-*` grants). The attacker writes records
there claiming other sources and more events than MinIO ever sends, and a reconcile delivery
for one instance on the stream's topic; controls follow on the same raw keys. Checked: what
reaches the dead-letter topic (bytes and reason), and what reaches each instance's output.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from support.kafka_io import Header, Read, produce, raw, read_topic
from support.payloads import s3_body, s3_record
from support.worker import Topology, Worker, wait_for

pytestmark = pytest.mark.kafka

INSTANCES: list[dict[str, Any]] = [
    {"name": "tenant-a", "bucket": "uploads", "sources": ["s3"]},
    {"name": "tenant-b", "bucket": "uploads", "sources": ["s3"]},
    {"name": "minio", "bucket": "images", "sources": ["minio"]},
]


def minio_body(*keys: str) -> bytes:
    """A MinIO webhook / Kafka target body; MinIO puts exactly one record in it."""
    records = [
        {
            "eventVersion": "2.0",
            "eventSource": "minio:s3",
            "eventTime": "2026-11-30T00:08:07Z",
            "eventName": "s3:ObjectCreated:Put",
            "s3": {
                "bucket": {"name": "images"},
                "object": {"key": key, "size": 3, "sequencer": f"{index + 1:04X}"},
            },
        }
        for index, key in enumerate(keys)
    ]
    return json.dumps({"EventName": "s3:ObjectCreated:Put", "Records": records}).encode()


def reconcile_body(kind: str, key: str, instance: str) -> bytes:
    return json.dumps(
        {
            "type": kind,
            "bucket": "uploads",
            "key": key,
            "etag": "e1",
            "observed_at": "2026-11-30T01:00:00Z",
            "instance": instance,
            "reason": "not-in-stream",
        }
    ).encode()


def keys(reads: list[Read]) -> list[str]:
    return sorted(read.json()["key"] for read in reads)


def test_a_raw_topic_pins_its_source_and_reconcile_reaches_only_its_instance(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    names = Topology()
    minio_topic = f"minio-{names.suffix}"
    config = names.config(INSTANCES).replace(
        f'raw_topics = ["{names.raw}"]',
        f'raw_topics = ["{names.raw}", {{ name = "{minio_topic}", default_source = "minio" }}]',
    )
    worker = Worker(kafka_bootstrap, config, tmp_path / "worker").start()
    try:
        forged_s3 = s3_body(s3_record(f"forged-s3-{names.suffix}", "00A1"))
        forged_delete = reconcile_body("deleted", f"victim-{names.suffix}", "tenant-a")
        flood = minio_body(*(f"flood-{n}" for n in range(3)))
        on_minio_topic: list[tuple[bytes, list[Header]]] = [
            raw(forged_s3, "s3"),  # a `source` header the topic's own source is not
            raw(forged_delete, "reconcile"),
            (flood, []),  # three records where MinIO sends one
            (minio_body(f"control-minio-{names.suffix}"), []),
        ]
        asyncio.run(produce(kafka_bootstrap, minio_topic, on_minio_topic, b"k"))
        listing = reconcile_body("created", f"reconciled-{names.suffix}", "tenant-a")
        on_raw_topic = [
            raw(listing, "reconcile"),  # for tenant-a: must not reach tenant-b
            raw(s3_body(s3_record(f"control-s3-{names.suffix}", "00B1")), "s3"),
        ]
        asyncio.run(produce(kafka_bootstrap, names.raw, on_raw_topic, b"k"))

        def outputs() -> dict[str, list[str]]:
            return {
                instance["name"]: keys(
                    asyncio.run(read_topic(kafka_bootstrap, names.output(instance["name"])))
                )
                for instance in INSTANCES
            }

        def settled() -> bool:
            seen = outputs()
            return (
                f"control-minio-{names.suffix}" in seen["minio"]
                and f"control-s3-{names.suffix}" in seen["tenant-b"]
                and f"reconciled-{names.suffix}" in seen["tenant-a"]
            )

        try:
            wait_for(settled, 90, "the control deliveries on every output", 0.5)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{worker.tail(60)}") from None
        # The listing for tenant-a was offered to tenant-b and refused there, by instance (or,
        # as before the fix, emitted there).
        wait_for(
            lambda: (
                worker.metric(
                    "storage_events_filtered_total", instance="tenant-b", reason="instance"
                )
                or f"reconciled-{names.suffix}" in outputs()["tenant-b"]
            ),
            60,
            "the listing decided for tenant-b",
            0.5,
        )
        assert outputs() == {
            "tenant-a": sorted([f"control-s3-{names.suffix}", f"reconciled-{names.suffix}"]),
            "tenant-b": [f"control-s3-{names.suffix}"],
            "minio": [f"control-minio-{names.suffix}"],
        }
        letters = asyncio.run(read_topic(kafka_bootstrap, names.dead_letter))
        by_value = {read.value: read.headers["error"].decode() for read in letters}
        assert by_value == {
            forged_s3: f"s3: raw topic {minio_topic} carries minio only: a record on it cannot "
            "claim source 's3'",
            forged_delete: f"reconcile: raw topic {minio_topic} carries minio only: a record on "
            "it cannot claim source 'reconcile'",
            flood: "minio: 3 events in one delivery, over the 1 one minio delivery holds at "
            "most (stream.max_events_per_delivery.minio)",
        }
    finally:
        assert worker.stop() == 0, worker.tail(60)
