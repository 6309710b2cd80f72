"""What a reconcile run pushes to a real Prometheus Pushgateway (Debian's
prometheus-pushgateway, tests/support/pushgateway.py): connectors/reconcile/report.py.

In process, listing moto's S3, with what the stream knows given (no Kafka): refused runs
(exit 3) count drift runs in a row, a failed listing (exit 1) leaves the drift series as they
were, a clean run resets the count and marks a success, a dry run pushes nothing, and a
Pushgateway that does not answer changes no exit code. Then with the real broker (marker
`kafka`), as the CronJob runs it (a subprocess, RECONCILE_PUSHGATEWAY_URL): a run that
publishes its drift.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from support.kafka_io import produce
from support.moto_server import aws_client, unique_name
from support.worker import ROOT, Topology, free_port, wait_for

import connectors.reconcile as command
from connectors.reconcile import Known
from connectors.reconcile.report import JOB, Compared, RunMetrics
from streams.core.keystate import KeyState, encode
from streams.core.ordering import Mark

if TYPE_CHECKING:
    from support.pushgateway import Pushgateway

pytest_plugins = ["support.moto_server", "support.pushgateway"]

NOW = datetime(2026, 12, 4, 0, 0, tzinfo=UTC)
M = "storage_events_reconcile_"


def run(
    settings_instance: dict[str, object],
    known: Iterable[Known],
    monkeypatch: pytest.MonkeyPatch,
    *arguments: str,
) -> int:
    """One run as the command does it (`_run`: the run, then the push); the keys-changelog
    read replaced by `known`."""
    parser = argparse.ArgumentParser()
    command.COMMAND.add_arguments(parser)
    args = parser.parse_args(["--instance", str(settings_instance["name"]), *arguments])
    settings = Topology().settings([settings_instance])
    knowledge: Callable[..., Callable[[], list[Known]]] = lambda *_, **__: lambda: list(known)  # noqa: E731
    monkeypatch.setattr(command, "KeysChangelogKnowledge", knowledge)
    return command._run(args, settings)


def group(pushgateway: Pushgateway, instance: str) -> dict[str, float]:
    """The instance's pushed series, timestamps and the duration left out (they vary)."""
    samples = pushgateway.samples(job=JOB, instance=instance)
    return {
        name.removeprefix(M): value
        for name, value in samples.items()
        if name.startswith(M) and not name.endswith(("timestamp_seconds", "duration_seconds"))
    }


def test_the_pushed_series_follow_the_runs(
    moto_server: str,
    pushgateway: Pushgateway,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    s3 = aws_client(moto_server, "s3")
    bucket = unique_name("pushed")
    s3.create_bucket(Bucket=bucket)
    etag = s3.put_object(Bucket=bucket, Key="t/kept.txt", Body=b"k")["ETag"].strip('"')
    name = unique_name("tenant")
    instance = {"name": name, "bucket": bucket, "prefix": "t", "sources": ["supabase"]}
    kept = Known("kept.txt", "created", etag, NOW)
    gone = [Known(f"gone-{i}.txt", "created", "e", NOW) for i in range(3)]
    gateway = ("--endpoint-url", moto_server, "--pushgateway", pushgateway.url)
    monkeypatch.delenv("RECONCILE_PUSHGATEWAY_URL", raising=False)

    # Three of four known keys are not listed: over the 10% bound, refused (exit 3).
    before = time.time()
    assert run(instance, [kept, *gone], monkeypatch, *gateway, "--expected-interval", "3600") == 3
    assert group(pushgateway, name) == {
        "last_run_exit_code": 3,
        "expected_interval_seconds": 3600,
        'drift_keys{kind="created"}': 0,
        'drift_keys{kind="deleted"}': 3,
        "published": 0,
        "listed_keys": 1,
        "known_keys": 4,
        "drift_runs": 1,
    }
    samples = pushgateway.samples(job=JOB, instance=name)
    assert before <= samples[f"{M}last_run_timestamp_seconds"] <= time.time()
    assert 0 <= samples[f"{M}duration_seconds"] < 60
    assert f"{M}last_success_timestamp_seconds" not in samples  # refused: no success

    # Drift again: two runs in a row (what StorageEventsReconcileDriftAgain fires on).
    assert run(instance, [kept, *gone], monkeypatch, *gateway) == 3
    assert group(pushgateway, name)["drift_runs"] == 2

    # A listing that fails compares nothing: the drift series stay as the last comparing
    # run left them; the run itself is pushed as failed.
    s3.delete_object(Bucket=bucket, Key="t/kept.txt")
    s3.delete_bucket(Bucket=bucket)
    assert run(instance, [kept], monkeypatch, *gateway) == 1
    failed = group(pushgateway, name)
    assert (failed["last_run_exit_code"], failed["drift_runs"]) == (1, 2)
    assert failed['drift_keys{kind="deleted"}'] == 3
    s3.create_bucket(Bucket=bucket)
    etag = s3.put_object(Bucket=bucket, Key="t/kept.txt", Body=b"k")["ETag"].strip('"')
    kept = Known("kept.txt", "created", etag, NOW)

    # In sync: no drift, the count back to 0, a success.
    before = time.time()
    assert run(instance, [kept], monkeypatch, *gateway) == 0
    clean = group(pushgateway, name)
    assert clean["last_run_exit_code"] == 0 and clean["drift_runs"] == 0
    assert clean['drift_keys{kind="created"}'] == clean['drift_keys{kind="deleted"}'] == 0
    assert (clean["published"], clean["listed_keys"], clean["known_keys"]) == (0, 1, 1)
    succeeded = pushgateway.samples(job=JOB, instance=name)[f"{M}last_success_timestamp_seconds"]
    assert before <= succeeded <= time.time()
    assert "not pushed" not in capsys.readouterr().out

    # A dry run moves nothing.
    assert run(instance, [kept, *gone], monkeypatch, *gateway, "--dry-run", "--force") == 0
    assert group(pushgateway, name) == clean

    # A Pushgateway that does not answer: the run's exit code stands, and it says so.
    capsys.readouterr()
    nowhere = f"http://127.0.0.1:{free_port()}"
    assert (
        run(instance, [kept], monkeypatch, "--endpoint-url", moto_server, "--pushgateway", nowhere)
        == 0
    )
    out, err = capsys.readouterr()
    assert out.splitlines()[-1].startswith("reconcile metrics not pushed: URLError")
    assert out.splitlines()[-2].startswith(f"reconcile instance={name} ")
    assert f"metrics not pushed to {nowhere}" in err and "the run's result stands (exit 0)" in err
    # ... and from the environment, as the CronJob sets it.
    monkeypatch.setenv("RECONCILE_PUSHGATEWAY_URL", pushgateway.url)
    assert run(instance, [kept, *gone], monkeypatch, "--endpoint-url", moto_server) == 3
    assert group(pushgateway, name)["drift_runs"] == 1
    pushgateway.delete(JOB, name)


def test_an_unreadable_previous_count_is_not_restarted(
    moto_server: str, pushgateway: Pushgateway
) -> None:
    """Drift found, but the previous count cannot be read: drift_runs is left out of the
    push (its last value stands) rather than pushed as 1, and a warning says so."""
    name = unique_name("unread")

    def unreadable() -> float:
        raise OSError("refused")

    metrics = RunMetrics(pushgateway.url, name, 60)
    metrics.previous_drift_runs = unreadable  # type: ignore[method-assign]
    metrics.found = Compared(listed=1, known=0, created=1, deleted=0, published=0)
    assert metrics.push(1) is None
    pushed = group(pushgateway, name)
    assert "drift_runs" not in pushed and pushed['drift_keys{kind="created"}'] == 1
    assert metrics.warnings == ["previous drift_runs not read (refused); not pushed"]
    pushgateway.delete(JOB, name)


# --- as the CronJob runs it, against the real broker -----------------------------------------


async def create_topics(bootstrap: str, *names: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 1, 1) for name in names])
    finally:
        await admin.close()


@pytest.mark.kafka
def test_a_scheduled_run_pushes_what_it_published(
    moto_server: str, kafka_bootstrap: str, pushgateway: Pushgateway, tmp_path: os.PathLike[str]
) -> None:
    names = Topology()
    bucket = unique_name("cron")
    s3 = aws_client(moto_server, "s3")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="t/known.txt", Body=b"k")
    s3.put_object(Bucket=bucket, Key="t/missed-1.txt", Body=b"m")
    s3.put_object(Bucket=bucket, Key="t/missed-2.txt", Body=b"m")
    instance = {"name": "tenant-a", "bucket": bucket, "prefix": "t", "sources": ["supabase"]}
    config = f"{tmp_path}/streams.toml"
    with open(config, "w") as file:
        file.write(names.config([instance]))
    output = names.output("tenant-a")
    changelog = f"{names.app_id}-keys-changelog"
    asyncio.run(create_topics(kafka_bootstrap, names.raw, output, changelog))
    listed = s3.head_object(Bucket=bucket, Key="t/known.txt")["ETag"].strip('"')
    known = {"type": "created", "key": "known.txt", "bucket": bucket, "etag": listed}
    asyncio.run(produce(kafka_bootstrap, output, [(json.dumps(known).encode(), [])]))
    # What the worker's per-key state holds for it (streams.core.keystate), which reconcile reads.
    mark = Mark(None, None, NOW.timestamp(), "supabase:1", "created")
    record = encode(KeyState(mark=mark, etag=listed))
    key = f"tenant-a|supabase|{bucket}/known.txt".encode()
    asyncio.run(produce(kafka_bootstrap, changelog, [(record, [])], key=key))

    def reconcile() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                *(sys.executable, "-m", "connectors", "--config", config, "reconcile"),
                *("--instance", "tenant-a", "--endpoint-url", moto_server),
                *("--expected-interval", "3600"),
            ],
            cwd=ROOT,
            env={
                **os.environ,
                "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                "RECONCILE_PUSHGATEWAY_URL": pushgateway.url,
            },
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    pushgateway.delete(JOB, "tenant-a")
    first = reconcile()
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[-1].endswith("created=2 deleted=0 published=2")
    assert group(pushgateway, "tenant-a") == {
        "last_run_exit_code": 0,
        "expected_interval_seconds": 3600,
        'drift_keys{kind="created"}': 2,
        'drift_keys{kind="deleted"}': 0,
        "published": 2,
        "listed_keys": 3,
        "known_keys": 1,
        "drift_runs": 1,
    }
    # No worker turns the deliveries into output events here: the next run finds the same
    # drift, the second run in a row.
    second = reconcile()
    assert second.returncode == 0, second.stderr
    wait_for(lambda: group(pushgateway, "tenant-a")["drift_runs"] == 2, 10, "drift_runs 2")
    pushgateway.delete(JOB, "tenant-a")
