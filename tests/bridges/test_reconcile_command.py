"""`python -m connectors reconcile`: the drift rules, then the command against moto + Kafka.

(Not `test_reconcile.py`: that basename is the normalizer's test, and pytest imports test
modules by basename.)

The end-to-end test needs the worker to know the `reconcile` source (`SOURCES` in
`streams/core/normalizers/__init__.py`); without it the synthetic deliveries are dead-lettered.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support.kafka_io import produce, raw, read_topic
from support.moto_server import aws_client, unique_name
from support.worker import ROOT, Topology, Worker, wait_for

from connectors.reconcile import Known, Listed, Plan, last_events, plan, refusal
from connectors.reconcile.listings.s3 import list_bucket
from streams.config import InstanceConfig
from streams.core.delivery import Delivery
from streams.core.event import FileEvent
from streams.core.normalizers import SOURCES
from streams.core.normalizers.reconcile import normalize
from streams.core.rules import Filtered, apply_rules
from streams.policies import instance_rules


def apply_instance(event: FileEvent, instance: InstanceConfig) -> FileEvent | Filtered:
    """The event as `instance` sees it: its rules as the worker builds them, applied."""
    return apply_rules(event, instance_rules(instance))


pytest_plugins = ["support.moto_server"]

T0 = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)
NOW = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)
TENANT = InstanceConfig.model_validate(
    {"name": "tenant-a", "bucket": "shared", "prefix": "tenant-a", "plugins": ["versioning"]}
)


def listed(key: str, etag: str = "e1", size: int = 3) -> Listed:
    return Listed(key=f"tenant-a/{key}", etag=f'"{etag}"', size=size, last_modified=T0)


def known(key: str, event_type: str = "created", etag: str | None = "e1") -> Known:
    return Known(key=key, type=event_type, etag=etag, time=T0 - timedelta(minutes=5))


def test_drift_rules() -> None:
    result = plan(
        [
            listed("same.txt"),
            listed("never-notified.txt"),
            listed("deleted-in-stream.txt"),
            listed("overwritten.txt", etag="e2"),
            listed("no-etag-in-stream.txt"),
            listed(".versions/same.txt/1"),  # the versioning plugin's own: never emitted
        ],
        {
            key: value
            for key, value in [
                ("same.txt", known("same.txt")),
                ("deleted-in-stream.txt", known("deleted-in-stream.txt", "deleted")),
                ("overwritten.txt", known("overwritten.txt")),
                ("no-etag-in-stream.txt", known("no-etag-in-stream.txt", etag=None)),
                ("gone.txt", known("gone.txt")),
                ("gone-and-known.txt", known("gone-and-known.txt", "deleted")),
            ]
        },
        TENANT,
        "shared",
        NOW,
    )
    assert [(drift.type, drift.key, drift.reason) for drift in result.drifts] == [
        ("created", "tenant-a/never-notified.txt", "not-in-stream"),
        ("created", "tenant-a/deleted-in-stream.txt", "deleted-in-stream"),
        ("created", "tenant-a/overwritten.txt", "etag-differs"),
        ("deleted", "tenant-a/gone.txt", "not-listed"),
    ]
    assert (result.listed, result.ignored, result.known, result.in_sync) == (5, 1, 4, 2)


def test_a_drift_normalizes_to_the_event_the_stream_missed_and_then_no_drift_is_left() -> None:
    listing = [listed("new.txt", etag="e9", size=9)]
    stream = {"gone.txt": known("gone.txt")}
    first = plan(listing, stream, TENANT, "shared", NOW)
    assert len(first.drifts) == 2
    for drift in first.drifts:
        [event] = normalize(Delivery(source="reconcile", body=drift.value()))
        seen = apply_instance(event, TENANT)
        assert not isinstance(seen, Filtered)
        assert event.id == drift.body["id"]
        assert event.time == NOW
        stream[seen.key] = Known(seen.key, seen.type, seen.etag, seen.time)
    created = stream["new.txt"]
    assert (created.type, created.etag) == ("created", "e9")
    assert stream["gone.txt"].type == "deleted"
    # The same drift seen twice before the stream caught up has the same ids.
    again = plan(listing, {"gone.txt": known("gone.txt")}, TENANT, "shared", NOW)
    assert [d.body["id"] for d in again.drifts] == [d.body["id"] for d in first.drifts]
    # Once the stream caught up, nothing is left.
    assert plan(listing, stream, TENANT, "shared", NOW).drifts == []


def test_the_stream_state_is_the_last_event_per_key_of_this_bucket() -> None:
    def event(key: str, event_type: str, bucket: str = "shared", **more: Any) -> bytes:
        return json.dumps({"key": key, "type": event_type, "bucket": bucket, **more}).encode()

    state = last_events(
        [
            event("a", "created", etag='"e1"', time="2026-11-30T00:00:00Z"),
            event("a", "deleted"),
            event("b", "created", etag="e2"),
            event("b", "deleted", version_only=True),  # a noncurrent version: b lives on
            event("c", "created", bucket="elsewhere"),
            b"not json",
            None,
        ],
        "shared",
    )
    assert {key: (k.type, k.etag) for key, k in state.items()} == {
        "a": ("deleted", None),
        "b": ("created", "e2"),
    }


def test_the_safety_bound() -> None:
    def run(listed_count: int, known_count: int, deletes: int) -> Plan:
        result = plan(
            [listed(f"k{i}") for i in range(listed_count)],
            {f"k{i}": known(f"k{i}") for i in range(known_count)},
            TENANT,
            "shared",
            NOW,
        )
        assert result.count("deleted") == deletes
        return result

    # 100 known, 10 not listed: 10% is within the default bound; 11 is not.
    assert refusal(run(listed_count=90, known_count=100, deletes=10)) is None
    above = refusal(run(listed_count=89, known_count=100, deletes=11))
    assert above is not None and "11 of the 100" in above and "--max-deletes 11" in above
    assert refusal(run(listed_count=89, known_count=100, deletes=11), max_delete_share=0.2) is None
    # An empty listing deletes nothing without --max-deletes or --force, even one key.
    empty = refusal(run(listed_count=0, known_count=1, deletes=1))
    assert empty is not None and "holds no key" in empty
    assert refusal(run(listed_count=0, known_count=1, deletes=1), max_deletes=1) is None
    assert refusal(run(listed_count=0, known_count=5, deletes=5), max_deletes=4) is not None
    assert refusal(run(listed_count=0, known_count=5, deletes=5), force=True) is None
    # Creates alone are never refused.
    assert refusal(run(listed_count=50, known_count=0, deletes=0)) is None


def test_a_versioned_bucket_lists_its_live_versions_only(moto_server: str) -> None:
    s3 = aws_client(moto_server, "s3")
    bucket = unique_name("versioned")
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3.put_object(Bucket=bucket, Key="tenant-a/a.txt", Body=b"v1")
    live = s3.put_object(Bucket=bucket, Key="tenant-a/a.txt", Body=b"v2 now")["ETag"]
    s3.put_object(Bucket=bucket, Key="tenant-a/gone.txt", Body=b"x")
    s3.delete_object(Bucket=bucket, Key="tenant-a/gone.txt")  # a delete marker on top
    assert len(s3.list_object_versions(Bucket=bucket)["Versions"]) == 3
    listing = list(list_bucket(s3, bucket, "tenant-a"))
    assert [(item.key, item.etag, item.size) for item in listing] == [("tenant-a/a.txt", live, 6)]


def test_what_the_stream_knows_is_one_pluggable_source(
    moto_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`reconcile()` takes any StreamKnowledge (key -> present/deleted, ETag, token) in place
    of the output-topic read; here a dry run with no Kafka at all."""
    import argparse

    import connectors.reconcile as command

    s3 = aws_client(moto_server, "s3")
    bucket = unique_name("pluggable")
    s3.create_bucket(Bucket=bucket)
    etag = s3.put_object(Bucket=bucket, Key="tenant-a/same.txt", Body=b"x")["ETag"].strip('"')
    s3.put_object(Bucket=bucket, Key="tenant-a/new.txt", Body=b"y")
    parser = argparse.ArgumentParser()
    command.COMMAND.add_arguments(parser)
    args = parser.parse_args(
        ["--instance", "tenant-a", "--endpoint-url", moto_server, "--dry-run", "--force"]
    )
    settings = Topology().settings(
        [{"name": "tenant-a", "bucket": bucket, "prefix": "tenant-a", "sources": ["s3"]}]
    )
    asked: list[str] = []

    def knowledge() -> list[Known]:
        asked.append("once")
        return [
            Known("same.txt", "created", etag, NOW, token="0055AED6DCD90281E5"),
            Known("gone.txt", "created", "e1", NOW),
            Known("was-deleted.txt", "deleted", None, NOW),
        ]

    assert command.reconcile(args, settings, knowledge=knowledge) == 0
    out = capsys.readouterr().out.splitlines()
    assert asked == ["once"]
    assert out[:-1] == [  # a dry run publishes nothing, and each drift line says so
        "created tenant-a/new.txt (not-in-stream): not published (dry run)",
        "deleted tenant-a/gone.txt (not-listed): not published (dry run)",
    ]
    assert out[-1] == (
        f"reconcile instance=tenant-a bucket={bucket} listed=2 known=2 in_sync=1 created=1 "
        "deleted=1 published=0 (dry run)"
    )


# --- against moto and the real broker -------------------------------------------------------


class Setup:
    def __init__(self, endpoint: str, bootstrap: str, names: Topology, worker: Worker) -> None:
        self.endpoint, self.bootstrap, self.names, self.worker = endpoint, bootstrap, names, worker
        self.s3 = aws_client(endpoint, "s3")
        self.sqs = aws_client(endpoint, "sqs")

    def reconcile(
        self, *extra: str, config: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "connectors",
                "--config",
                str(config or self.worker.config_path),
                "reconcile",
                "--endpoint-url",
                self.endpoint,
                *extra,
            ],
            cwd=ROOT,
            env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def events(self) -> list[dict[str, Any]]:
        reads = asyncio.run(read_topic(self.bootstrap, self.names.output("tenant-a")))
        return [read.json() for read in reads]

    def wait_for(self, wanted: Callable[[list[dict[str, Any]]], bool], what: str) -> None:
        def ready() -> bool:
            return wanted(self.events())

        try:
            wait_for(ready, 45, what, interval_s=0.3)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; worker log:\n{self.worker.tail()}") from None

    def relay(self, queue_url: str) -> int:
        """What the SQS bridge does (tested in test_sqs.py): queue messages -> raw topic."""
        moved = 0
        while True:
            messages = self.sqs.receive_message(
                QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
            ).get("Messages", [])
            if not messages:
                return moved
            asyncio.run(
                produce(
                    self.bootstrap,
                    self.names.raw,
                    [raw(message["Body"], "s3", transport="sqs") for message in messages],
                )
            )
            self.sqs.delete_message_batch(
                QueueUrl=queue_url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(messages)
                ],
            )
            moved += len(messages)


BUCKET = unique_name("reconciled")


@pytest.fixture(scope="module")
def setup(
    moto_server: str, kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    names = Topology()
    tenant = {"name": "tenant-a", "bucket": BUCKET, "prefix": "tenant-a", "sources": ["s3"]}
    config = names.config([{**tenant, "plugins": ["versioning"]}])
    worker = Worker(kafka_bootstrap, config, tmp_path_factory.mktemp("reconcile-worker")).start()
    try:
        yield Setup(moto_server, kafka_bootstrap, names, worker)
    finally:
        assert worker.stop() == 0, worker.tail()


def summary(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("reconcile "), result.stdout
    return dict(part.split("=", 1) for part in last.split()[1:] if "=" in part)


def has(events: list[dict[str, Any]], *wanted: tuple[str, str, str]) -> bool:
    return set(wanted) <= {(e["type"], e["key"], e["provider"]) for e in events}


@pytest.mark.kafka
def test_reconcile_publishes_the_missed_changes_once(setup: Setup) -> None:
    assert "reconcile" in SOURCES, (
        "the worker cannot read source=reconcile yet: add it to SOURCES in "
        "streams/core/normalizers/__init__.py"
    )
    s3 = setup.s3
    queue_url = setup.sqs.create_queue(QueueName=unique_name("q"))["QueueUrl"]
    queue_arn = setup.sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])
    s3.create_bucket(Bucket=BUCKET)
    s3.put_bucket_notification_configuration(
        Bucket=BUCKET,
        NotificationConfiguration={
            "QueueConfigurations": [
                {
                    "QueueArn": queue_arn["Attributes"]["QueueArn"],
                    "Events": ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"],
                }
            ]
        },
    )
    s3.put_object(Bucket=BUCKET, Key="tenant-a/keep.txt", Body=b"keep")
    s3.put_object(Bucket=BUCKET, Key="tenant-a/gone.txt", Body=b"gone")
    s3.put_object(Bucket=BUCKET, Key="tenant-a/.versions/keep.txt/1", Body=b"v1")
    s3.put_object(Bucket=BUCKET, Key="other-tenant/x.txt", Body=b"not ours")
    assert setup.relay(queue_url) >= 5
    setup.wait_for(
        lambda events: has(events, ("created", "keep.txt", "s3"), ("created", "gone.txt", "s3")),
        "the notified objects",
    )

    # Changes nobody is told about: notifications off, one delete, one new object.
    s3.put_bucket_notification_configuration(Bucket=BUCKET, NotificationConfiguration={})
    s3.delete_object(Bucket=BUCKET, Key="tenant-a/gone.txt")
    etag = s3.put_object(Bucket=BUCKET, Key="tenant-a/new file.txt", Body=b"fresh")["ETag"]
    setup.relay(queue_url)  # whatever moto queued (a test event at most) still goes in

    dry = setup.reconcile("--instance", "tenant-a", "--dry-run")
    assert summary(dry)["published"] == "0"
    assert "deleted tenant-a/gone.txt (not-listed)" in dry.stdout
    assert "created tenant-a/new file.txt (not-in-stream)" in dry.stdout
    # The worker's keys changelog (the default) and the output topic say the same.
    from_output = setup.reconcile("--instance", "tenant-a", "--dry-run", "--known-from", "output")
    assert from_output.stdout == dry.stdout

    # One of the two known keys deleted is above the default 10% bound: allowed by name.
    first = summary(setup.reconcile("--instance", "tenant-a", "--max-deletes", "1"))
    assert first == {
        "instance": "tenant-a",
        "bucket": BUCKET,
        "listed": "2",
        "known": "2",
        "in_sync": "1",
        "created": "1",
        "deleted": "1",
        "published": "2",
    }
    setup.wait_for(
        lambda events: has(
            events,
            ("deleted", "gone.txt", "reconcile"),
            ("created", "new file.txt", "reconcile"),
        ),
        "the reconciled changes",
    )
    events = setup.events()
    created = next(e for e in events if e["key"] == "new file.txt")
    assert (created["etag"], created["size"], created["bucket"]) == (etag.strip('"'), 5, BUCKET)
    assert [e["type"] for e in events if e["key"] == "gone.txt"] == ["created", "deleted"]
    assert {e["key"] for e in events} == {"keep.txt", "gone.txt", "new file.txt"}

    second = summary(setup.reconcile("--instance", "tenant-a"))
    assert (second["created"], second["deleted"], second["published"]) == ("0", "0", "0")
    assert (second["listed"], second["known"], second["in_sync"]) == ("2", "2", "2")
    assert len(setup.events()) == len(events)


@pytest.mark.kafka
def test_a_missing_bucket_or_instance_is_one_line(setup: Setup, tmp_path: Path) -> None:
    every_bucket = tmp_path / "every-bucket.toml"
    every_bucket.write_text('[[instances]]\nname = "all"\n')
    missing = setup.reconcile("--instance", "all", "--bucket", "nope-123", config=every_bucket)
    assert missing.returncode == 1
    warning, error = missing.stderr.strip().splitlines()
    assert error == (
        "connectors reconcile: listing bucket nope-123 failed: NoSuchBucket: "
        "The specified bucket does not exist"
    )
    # Without one provider in `sources`, what ordering the events get is said, not assumed.
    assert "names no single provider in `sources`" in warning
    assert 'instances.all.sources = ["<provider>"]' in warning
    unnamed = setup.reconcile("--instance", "all", config=every_bucket)
    assert unnamed.returncode == 2
    assert unnamed.stderr.strip() == (
        "connectors reconcile: instance 'all' takes every bucket; name the one to list with "
        "--bucket"
    )
    other = setup.reconcile("--instance", "tenant-a", "--bucket", "nope-123")
    assert other.returncode == 2
    assert "keeps bucket" in other.stderr and len(other.stderr.strip().splitlines()) == 1
    unknown = setup.reconcile("--instance", "tenant-z")
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == (
        "connectors reconcile: no instance named 'tenant-z' (configured: tenant-a)"
    )
