"""`python -m streams status` and the worker's progress line, against a real worker and broker
(issue 16, item 9)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.kafka_io import produce, raw
from support.worker import ROOT, Topology, Worker, wait_for

pytestmark = pytest.mark.kafka

EXAMPLE = ROOT / "examples" / "s3-put.json"
TAIL_ONE = ["--count", "1", "--timeout", "30"]


def status(worker: Worker, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streams", "status", "--worker", worker_url(worker), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **{k: worker.env[k] for k in ("KAFKA_BOOTSTRAP_SERVERS",)}}
        | {"STREAMS_CONFIG": str(worker.config_path)},
        timeout=60,
        check=False,
    )


def worker_url(worker: Worker) -> str:
    return f"http://127.0.0.1:{worker.web_port}"


def caught_up(worker: Worker) -> dict[str, Any] | None:
    """The status JSON once both groups have lag 0, committed offsets and owners."""
    result = status(worker, "--json")
    assert result.returncode == 0, result.stderr
    snap: dict[str, Any] = json.loads(result.stdout)
    groups = snap["groups"]
    if any(group["lag"] != 0 or not group["members"] for group in groups):
        return None
    if any(row["owner"] is None for group in groups for row in group["partitions"]):
        return None
    return snap


def test_status_after_the_readme_sample_shows_both_groups_caught_up(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    names = Topology()
    worker = Worker(
        kafka_bootstrap,
        names.config(),
        tmp_path,
        env={"STREAMS_PROGRESS_INTERVAL_S": "1"},
    ).start()
    try:
        asyncio.run(produce(kafka_bootstrap, names.raw, [raw(EXAMPLE.read_bytes(), "s3")]))
        worker.wait_metric("storage_events_emitted_total", 1, instance="default")
        snap = wait_for(lambda: caught_up(worker), 60, "both groups at lag 0 with owners", 0.5)
        text = status(worker)
        progress = wait_for(
            lambda: [line for line in worker.tail(400).splitlines() if "progress over" in line],
            30,
            "the worker's progress line",
        )
    finally:
        assert worker.stop() == 0, worker.tail()

    normalize, emit = snap["groups"]
    assert (normalize["name"], emit["name"]) == (
        f"{names.app_id}-normalize",
        f"{names.app_id}-emit",
    )
    for group, topic in ((normalize, names.raw), (emit, f"{names.app_id}.by-key")):
        assert group["state"] == "Stable"
        assert [row["topic"] for row in group["partitions"]] == [topic, topic]
        member_ids = {member["member_id"] for member in group["members"]}
        assert {row["owner"] for row in group["partitions"]} <= member_ids
        (member,) = group["members"]
        assert sorted(member["partitions"]) == [f"{topic}[0]", f"{topic}[1]"]
    # The sample's partition: read and committed (raw: 1 record; repartition: its keyed one).
    assert sum(row["committed"] or 0 for row in normalize["partitions"]) == 1
    assert sum(row["end"] for row in emit["partitions"]) == 1
    assert sum(row["committed"] or 0 for row in emit["partitions"]) == 1
    (instance,) = snap["instances"]
    assert instance["name"] == "default"
    assert instance["emitted"] == 1
    assert instance["last_event_at"] is not None
    (state,) = snap["workers"]
    assert state["ready"] is True
    restore = state["stages"]["emit"]["restore"]
    assert restore["state"] == "restored"
    assert restore["partitions"] == [0, 1]

    assert text.returncode == 0, text.stderr
    screen = text.stdout
    assert f"group {names.app_id}-normalize  Stable  1 member  lag 0" in screen
    assert f"group {names.app_id}-emit  Stable  1 member  lag 0" in screen
    assert f"{names.app_id}.by-key[0]" in screen
    assert "restore: restored partitions [0,1]" in screen
    assert names.output("default") in screen
    assert any(
        "normalize" in line and "emit" in line and "dead letters 0" in line for line in progress
    )


def test_status_without_a_worker_still_shows_kafkas_side(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """No worker answers: the groups (empty) and the topics are still shown, and it says so."""
    names = Topology()
    config = tmp_path / "streams.toml"
    config.write_text(names.config())
    result = subprocess.run(
        [sys.executable, "-m", "streams", "status", "--worker", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={
            **os.environ,
            "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "STREAMS_CONFIG": str(config),
        },
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"group {names.app_id}-emit" in result.stdout
    assert "worker http://127.0.0.1:9: no answer" in result.stdout
    assert "topic missing" in result.stdout


def test_status_without_kafka_says_so_in_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "streams", "status", "--worker", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "STREAMS_CONFIG": ""},
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout) == (1, "")
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: cannot read the stream's state from Kafka at 127.0.0.1:9")


def test_tail_headers_shows_cloudevents_stale_and_error_headers(kafka_bootstrap: str) -> None:
    names = Topology()
    topic = names.stale("default")
    headers = [
        ("ce_id", b"s3:1"),
        ("ce_type", b"storage.object.created"),
        ("stale.reason", b"older than the last emitted event of its key"),
        ("error", b"not JSON"),
        ("error.stage", b"normalize"),
        ("source", b"s3"),  # not shown: a raw delivery's header
    ]
    asyncio.run(produce(kafka_bootstrap, topic, [(b'{"id": "s3:1"}', headers)]))
    result = subprocess.run(
        [sys.executable, "-m", "streams", "tail", "--topic", topic, "--headers", *TAIL_ONE],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "STREAMS_CONFIG": ""},
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    assert json.loads(line) == {
        "headers": {
            "ce_id": "s3:1",
            "ce_type": "storage.object.created",
            "stale.reason": "older than the last emitted event of its key",
            "error": "not JSON",
            "error.stage": "normalize",
        },
        "event": {"id": "s3:1"},
    }
