"""A worker with 1,000 instances (tenants as prefixes of one bucket, as the spec's multi-tenant
case) starts, becomes ready, and routes a delivery to the last tenant, on a broker of its own.

Before 2026-12-07 it never became ready: `create-topics` sent the 2,006 topics in one
CreateTopics request, KRaft's controller refused every one of them ("Unable to perform
excessively large batch operation", over 10,000 metadata records in one request), aiokafka
returned the refusal in its answer without raising, and the command printed "created 2006
topic(s)"; the worker then waited for good for a repartition topic that did not exist. The
topics now go in batches the controller accepts, and a refusal is an error naming them."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from support.kafka_io import produce, raw, read_topic
from support.local_broker import PrivateBroker
from support.payloads import s3_body, s3_record
from support.worker import ROOT, Topology, Worker, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

INSTANCES = 1_000


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[PrivateBroker]:
    broker = PrivateBroker(tmp_path / "kafka", heap="1g")
    broker.start(fresh=True)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.mark.timeout(600)
def test_a_worker_with_a_thousand_instances_creates_its_topics_and_gets_ready(
    broker: PrivateBroker, tmp_path: Path
) -> None:
    names = Topology()
    instances = [
        {
            "name": f"tenant-{i}",
            "bucket": "uploads",
            "prefix": f"tenant-{i}",
            "sources": ["s3"],
            # What docs/settings.md advises for thousands of tenants; the first keeps the default.
            **({"partitions": 1} if i else {}),
        }
        for i in range(INSTANCES)
    ]
    config = names.config(instances)
    (tmp_path / "streams.toml").write_text(config)
    created = subprocess.run(
        [
            sys.executable,
            "-m",
            "streams",
            "create-topics",
            "--config",
            str(tmp_path / "streams.toml"),
        ],
        cwd=ROOT,
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert created.returncode == 0, created.stderr[-2000:]
    topics = 2 * INSTANCES + 6  # outputs, stales, raw, repartition, dead letter, 3 changelogs
    assert created.stdout.startswith(f"created {topics:,} topic(s): "), created.stdout
    assert "... and" in created.stdout and len(created.stdout) < 1_000, created.stdout
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    tenant = f"tenant-{INSTANCES - 1}"
    wanted = [names.output(tenant), names.stale(tenant), names.output("tenant-0")]
    wanted.append(f"{names.app_id}.by-key")
    found = wait_for(  # the broker's metadata takes the new topics in a moment after creation
        lambda: (topics := admin.list_topics(timeout=30).topics).keys() >= set(wanted) and topics,
        30,
        "the created topics in the broker's metadata",
    )
    assert [len(found[name].partitions) for name in wanted] == [1, 1, 2, 2]  # 2: the stream's

    worker = Worker(broker.bootstrap, config, tmp_path / "worker")
    worker.start(timeout_s=300)
    try:
        ready = wait_for(
            lambda: re.search(
                r"ready: stages .* started in (\d+\.\d) s", worker.log_path.read_text()
            ),
            30,
            "the ready line",
        )
        print(f"\n1,000 instances: ready line after {ready.group(1)} s")
        last = f"tenant-{INSTANCES - 1}"
        asyncio.run(
            produce(
                broker.bootstrap,
                names.raw,
                [raw(s3_body(s3_record(f"{last}/photo.jpg", "0055AED6DCD90281E5")), "s3")],
            )
        )
        emitted = wait_for(
            lambda: asyncio.run(read_topic(broker.bootstrap, names.output(last))),
            60,
            "the last tenant's event",
        )
        assert [read.json()["key"] for read in emitted] == ["photo.jpg"]
        assert asyncio.run(read_topic(broker.bootstrap, names.output("tenant-0"))) == []
    finally:
        assert worker.stop() == 0, worker.tail()
