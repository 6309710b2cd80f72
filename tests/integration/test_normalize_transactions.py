"""Stage one writes each batch in a transaction with its input offsets (`exactly_once`).

A worker killed while its normalize transaction holds a batch's keyed records in Kafka, not
yet committed: nothing of that batch is readable `read_committed` on the repartition topic,
and its restart (under its static id, which fences the open transaction) writes every keyed
record once and emits every event once. Under at-least-once (before), the batch's keyed
records were acknowledged one by one, so the restart wrote them a second time."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
from support.kafka_io import produce, raw, read_topic
from support.payloads import s3_body, s3_record
from support.worker import Topology, Worker, wait_for

pytestmark = pytest.mark.kafka

ENV = {
    "STREAMS_GROUP_INSTANCE_ID": "normalize-txn",
    # The first transaction commits (the first delivery); the second is killed uncommitted.
    "STREAMS_FAILPOINT": "normalize-uncommitted:2",
}
LATER = 30


def delivery(key: str, sequencer: int) -> tuple[bytes, list[tuple[str, bytes]]]:
    return raw(s3_body(s3_record(key, f"{sequencer:018X}")), "s3")


def test_a_batch_killed_before_its_commit_is_written_once_after_the_restart(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    names = Topology()
    repartition = f"{names.app_id}.by-key"
    worker = Worker(kafka_bootstrap, names.config(), tmp_path, env=ENV).start()
    try:
        asyncio.run(produce(kafka_bootstrap, names.raw, [delivery("first", 1)]))
        worker.wait_metric("storage_events_emitted_total", 1, instance="default")
        later = [delivery(f"later/{n}", n + 2) for n in range(LATER)]
        asyncio.run(produce(kafka_bootstrap, names.raw, later))
        process = worker.process
        assert process is not None
        wait_for(lambda: process.poll() is not None, 60, "the failpoint to kill the worker")
        assert process.returncode == -9, worker.tail()

        # The killed transaction's records are in Kafka, and not readable read_committed.
        written = asyncio.run(
            read_topic(kafka_bootstrap, repartition, isolation="read_uncommitted")
        )
        assert len(written) > 1, "the killed batch wrote nothing: the test shows nothing"

        worker.env["STREAMS_FAILPOINT"] = ""
        worker.start()  # the same static id: its transactional ids fence the open ones

        worker.wait_metric("storage_events_emitted_total", LATER, instance="default")
        outputs = asyncio.run(read_topic(kafka_bootstrap, names.output("default")))
        emitted = [record.headers["ce_id"] for record in outputs]
        assert len(emitted) == len(set(emitted)) == 1 + LATER  # every event once

        keyed = asyncio.run(read_topic(kafka_bootstrap, repartition))
        keys = Counter(record.key for record in keyed)
        assert len(keyed) == 1 + LATER, keys.most_common(3)  # each keyed record once
        assert set(keys.values()) == {1}
        everything = asyncio.run(
            read_topic(kafka_bootstrap, repartition, isolation="read_uncommitted")
        )
        assert len(everything) > len(keyed)  # the aborted batch is there, and not read
        assert worker.stop() == 0
    finally:
        worker.kill()
