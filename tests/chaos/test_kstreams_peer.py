"""The Kafka Streams contestant of `make bench` (benchmarks/kstreams) makes the pipeline's
decisions: built with Maven, run on the real broker over a small workload plus changes that
arrive late (one per provider, each older than one already emitted for its key) and keys that
need escaping or form-decoding in the derived ids, it emits exactly the ids the pipeline's
rules emit and puts exactly the same ids on the stale topic. Not a timing test (about 10 s;
the first run also builds the job, from ~/.m2 once Maven has fetched its jars)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from benchmarks import kstreams
from benchmarks.pipeline import (
    Raw,
    azure,
    create_topics,
    expected_decisions,
    expected_ids,
    fill,
    gcs,
    s3_body,
    sns,
    workload,
)

DELIVERIES = 2000


def late_and_awkward() -> list[Raw]:
    """Per provider: a change, a newer one, then the older again under another id (stale);
    and keys with `+`, `%XX`, quotes, backslashes and non-ASCII text."""
    records: list[Raw] = []
    s3_key = "late/s3.bin"
    for sequencer in ("0069B21FFD0700000000000A", "0069B21FFD0700000000000C"):
        records.append((s3_key.encode(), s3_body(s3_key, sequencer), [("source", b"s3")]))
    # Older than the last emitted, with another event name, so another id: stale.
    older = s3_body(s3_key, "0069B21FFD0700000000000B", "ObjectCreated:Copy")
    records.append((s3_key.encode(), sns(older, "m-late"), [("source", b"s3")]))
    gcs_key = "late/gcs.bin"
    for generation in (1_800_000_000_000_002, 1_800_000_000_000_001):
        value, headers = gcs(gcs_key, generation)
        records.append((gcs_key.encode(), value, headers))
    azure_key = "late/azure.bin"
    for sequence in (9_000_002, 9_000_001):
        records.append((azure_key.encode(), azure(azure_key, sequence), [("source", b"azure")]))
    # S3 keys are form-encoded: `a+b%C3%A9` is "a bé"; the id is derived from the decoded key.
    encoded = 'odd/a+b%C3%A9"q\\.bin'
    records.append(
        (encoded.encode(), s3_body(encoded, "0069B21FFD07000000000001"), [("source", b"s3")])
    )
    raw_name = 'odd/é "x\\y"\t.bin'
    value, headers = gcs(raw_name, 1_800_000_000_000_009)
    records.append((raw_name.encode(), value, headers))
    return records


def test_kafka_streams_job_decides_as_the_pipeline(kafka_bootstrap: str, tmp_path: Path) -> None:
    records = workload(DELIVERIES, seed=3) + late_and_awkward()
    emitted, stale = expected_decisions(records)
    assert emitted | stale == expected_ids(records)
    assert len(stale) >= 3, "the late changes must be stale by the pipeline's rules"

    raw_topic = f"ks-peer-raw-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topics(kafka_bootstrap, raw_topic))
    asyncio.run(fill(kafka_bootstrap, raw_topic, records))
    run = kstreams.run(
        kafka_bootstrap,
        raw_topic,
        len(records),
        len(emitted | stale),
        tmp_path,
        lambda *names: asyncio.run(create_topics(kafka_bootstrap, *names)),
        warm=False,
        timeout_s=300,
    )

    assert run.counts["malformed"] == 0
    assert run.stale == stale
    assert run.emitted == emitted
    assert run.counts["emitted"] == len(emitted) and run.counts["stale"] == len(stale)
