"""The Kafka Streams contestant of `make bench` (benchmarks/kstreams) writes what the pipeline
writes (issue 32 item 1): built with Maven, run on the real broker over a small workload plus
changes that arrive late (one per provider, each older than one already emitted for its key),
keys that need escaping or form-decoding in the derived ids, the other kinds of change
(deletes of a version, of the live object, GCS archives) and deliveries the pipeline
dead-letters (unreadable, unknown or missing source, a repeated `source` header, a repeated
field in an SNS envelope, more records than S3 sends in one, an over-long key, an event past
the records' size bound), it emits exactly the ids the pipeline's rules emit and puts exactly
the same ids on the stale topic, each with an equal value (parsed JSON, `raw` included) and the
same header names and values (the CloudEvents headers, `stale.reason`), and writes the same
dead letters (key, value, header names and values but the `error` text). The pipeline's side
is its own pure functions run in this process (`benchmarks.pipeline.expected_outputs`: stage
one's `route`, then the emit plan). Not a timing test (about 15 s; the first run also builds
the job, from ~/.m2 once Maven has fetched its jars)."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

from benchmarks import kstreams
from benchmarks.pipeline import (
    Raw,
    azure,
    compare_outputs,
    create_topics,
    expected_ids,
    expected_outputs,
    fill,
    gcs,
    read_outputs,
    s3_body,
    sns,
    worker_config,
    workload,
)
from streams.config import load_settings

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


def other_kinds() -> list[Raw]:
    """Deletes (an S3 version, an S3 delete marker, a GCS archive and delete, an Azure blob),
    an S3 test event (no event), and an S3 record with its region outside `aws`."""
    records: list[Raw] = []
    key = "kinds/s3.bin"
    for sequencer, name, version in (
        ("0069B21FFD07000000000101", "ObjectRemoved:Delete", "v1"),
        ("0069B21FFD07000000000102", "ObjectRemoved:DeleteMarkerCreated", None),
    ):
        body = json.loads(s3_body(key, sequencer, name))
        record = body["Records"][0]
        record["awsRegion"] = "cn-north-1"
        if version is not None:
            record["s3"]["object"]["versionId"] = version
        records.append((key.encode(), json.dumps(body).encode(), [("source", b"s3")]))
    records.append((b"test", b'{"Event": "s3:TestEvent", "Bucket": "bench"}', [("source", b"s3")]))
    for event_type, generation in (
        ("OBJECT_ARCHIVE", 1_900_000_000_000_001),
        ("OBJECT_DELETE", 1_900_000_000_000_002),
    ):
        value, headers = gcs("kinds/gcs.bin", generation)
        headers = [
            (k, event_type.encode() if k == "attribute.eventType" else v) for k, v in headers
        ]
        records.append((b"kinds/gcs.bin", value, headers))
    deleted = json.loads(azure("kinds/azure.bin", 9_100_000))
    deleted[0]["eventType"] = "Microsoft.Storage.BlobDeleted"
    records.append((b"kinds/azure.bin", json.dumps(deleted).encode(), [("source", b"azure")]))
    return records


def dead_lettered() -> list[Raw]:
    """Deliveries the pipeline dead-letters, each for another reason."""
    s3 = [("source", b"s3")]
    body = s3_body("dl/ok.bin", "0069B21FFD07000000000201")
    envelope = sns(body, "m-dl")
    twice = envelope[:-1] + b', "Message": ' + json.dumps(body.decode()).encode() + b"}"
    many = json.loads(s3_body("dl/many.bin", "0069B21FFD07000000000202"))
    many["Records"] *= 11  # S3 sends at most 10 (stream.max_events_per_delivery.s3)
    value, headers = gcs("dl/gcs.bin", 1_950_000_000_000_000)
    big = json.loads(s3_body("dl/big.bin", "0069B21FFD07000000000203"))
    # Its event is over the records' size bound (its `raw` carries this whole), while the
    # delivery itself still fits a default topic's 1 MiB.
    big["Records"][0]["s3"]["object"]["userMetadata"] = "x" * 1_046_000
    return [
        (b"dl/1", b"not json", s3),
        (b"dl/2", b"{}", [("source", b"ftp")]),
        (b"dl/3", body, []),
        (b"dl/4", body, [("source", b"s3"), ("source", b"s3")]),
        (b"dl/5", twice, s3),
        (b"dl/6", json.dumps(many).encode(), s3),
        (b"dl/7", s3_body("k" * 1025, "0069B21FFD07000000000204"), s3),
        (b"dl/8", value, [h for h in headers if h[0] != "attribute.eventType"]),
        (b"dl/9", json.dumps(big).encode(), s3),
        (None, b"[1]", [("source", b"azure"), ("delivery-id", b"d-9")]),
    ]


def test_kafka_streams_job_writes_what_the_pipeline_writes(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    records = workload(DELIVERIES, seed=3) + late_and_awkward() + other_kinds() + dead_lettered()
    raw_topic = f"ks-peer-raw-{uuid.uuid4().hex[:8]}"
    expected = expected_outputs(records, raw_topic)
    emitted, stale = set(expected.output), set(expected.stale)
    assert emitted | stale == expected_ids(records[: -len(dead_lettered())])
    assert len(stale) >= 3, "the late changes must be stale by the pipeline's rules"
    assert sum(expected.dead_letters.values()) == len(dead_lettered())

    asyncio.run(create_topics(kafka_bootstrap, raw_topic))
    asyncio.run(fill(kafka_bootstrap, raw_topic, records))
    config, _ = worker_config(tmp_path, "peer", raw_topic)
    run = kstreams.run(
        kafka_bootstrap,
        raw_topic,
        len(records),
        len(emitted | stale),
        tmp_path,
        lambda *names: asyncio.run(create_topics(kafka_bootstrap, *names)),
        settings=load_settings(config, environ={}),
        warm=False,
        timeout_s=300,
    )

    assert run.counts["malformed"] == len(dead_lettered())
    assert run.stale == stale
    assert run.emitted == emitted
    assert run.counts["emitted"] == len(emitted) and run.counts["stale"] == len(stale)
    written = read_outputs(kafka_bootstrap, *run.topics)
    assert compare_outputs(written, expected) == []
