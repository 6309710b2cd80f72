"""Outages the worker must ride out by itself, on a private broker per test (so stopping it
disturbs nothing else): started before its broker, broker restarted under it; and a state
directory it cannot write, which must stop it with a clear error instead of a silent stall."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.kafka_io import produce, raw, read_topic
from support.local_broker import PrivateBroker
from support.payloads import s3_body, s3_record
from support.worker import FAUST, ROOT, Topology, Worker, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.kafka]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[PrivateBroker]:
    private = PrivateBroker(tmp_path / "kafka")
    try:
        yield private
    finally:
        private.run("stop")


def delivery(key: str, sequencer: str) -> tuple[bytes, list[tuple[str, bytes]]]:
    return raw(s3_body(s3_record(key, sequencer)), "s3")


def output_keys(bootstrap: str, topology: Topology) -> list[str]:
    try:
        records = asyncio.run(read_topic(bootstrap, topology.output("default"), timeout_s=20))
    except Exception:  # the broker may still be electing leaders
        return []
    return [record.json()["key"] for record in records]


def test_a_worker_started_before_its_broker_starts_working_once_the_broker_is_up(
    broker: PrivateBroker, tmp_path: Path
) -> None:
    topology = Topology()
    worker = Worker(broker.bootstrap, topology.config(), tmp_path / "worker")
    worker.start(wait_ready=False)
    try:
        # It is up and waiting for Kafka (not exited, not ready), and says so in its log.
        wait_for(
            lambda: (
                "not reachable" in worker.log_path.read_text(errors="replace")
                or "retrying" in worker.log_path.read_text(errors="replace")
            ),
            60,
            "the worker to report that Kafka is unreachable",
        )
        assert worker.process is not None and worker.process.poll() is None, worker.tail()
        broker.run("start")
        worker.wait_ready(timeout_s=120)
        asyncio.run(produce(broker.bootstrap, topology.raw, [delivery("early/a.txt", "0A")]))
        wait_for(
            lambda: "early/a.txt" in output_keys(broker.bootstrap, topology),
            90,
            "the event to come out",
        )
    finally:
        worker.stop()


def test_a_broker_restart_under_a_running_worker_needs_no_manual_step(
    broker: PrivateBroker, tmp_path: Path
) -> None:
    broker.run("start")
    topology = Topology()
    worker = Worker(broker.bootstrap, topology.config(), tmp_path / "worker").start()
    try:
        asyncio.run(produce(broker.bootstrap, topology.raw, [delivery("before/a.txt", "0A")]))
        wait_for(
            lambda: "before/a.txt" in output_keys(broker.bootstrap, topology),
            60,
            "the event sent before the restart",
        )
        broker.run("stop")
        broker.run("start")
        asyncio.run(produce(broker.bootstrap, topology.raw, [delivery("after/b.txt", "0B")]))

        def after_restart() -> list[str] | None:
            found = output_keys(broker.bootstrap, topology)
            return found if "after/b.txt" in found else None

        keys = wait_for(after_restart, 120, "the event sent after the restart")
        assert worker.process is not None and worker.process.poll() is None, worker.tail()
        assert sorted(keys) == ["after/b.txt", "before/a.txt"], keys
    finally:
        worker.stop()


@pytest.mark.parametrize("kind", ["a file", "under a file"])
def test_an_unwritable_state_directory_stops_the_worker_with_a_clear_error(
    tmp_path: Path, kind: str
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    data_dir = blocker if kind == "a file" else blocker / "state"
    config = tmp_path / "streams.toml"
    config.write_text(Topology().config())
    result = subprocess.run(
        [str(FAUST), "-A", "streams", "worker"],
        cwd=ROOT,
        env={
            **os.environ,
            "STREAMS_CONFIG": str(config),
            "STREAMS_DATA_DIR": str(data_dir),
            # no broker is needed to find out: the check comes first
            "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert str(data_dir) in lines[0] and "not a writable directory" in lines[0]
