"""A process per stage (`STREAMS_STAGE_PROCESSES=2`, the default) on the real broker: one
`faust -A streams worker` whose emit stage runs in a child process. Events flow end to end;
`/ready` and `/metrics` cover both processes; SIGTERM stops both cleanly with nothing lost
(exactly once across the restart); a child killed with -9 stops the worker with a non-zero
code; a worker killed with -9 takes its child with it. And `STREAMS_STAGE_PROCESSES=1`: both
stages in the worker's one process, as before."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.kafka_io import produce, raw, read_topic
from support.payloads import s3_body, s3_record
from support.worker import Topology, Worker, wait_for

pytestmark = pytest.mark.kafka

TWO = {"STREAMS_STAGE_PROCESSES": "2", "STREAMS_PROGRESS_INTERVAL_S": "1"}


def child_pids(pid: int) -> list[int]:
    """The worker's stage child processes."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in task.read_text().split():
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"streams.stages.child" in cmdline:
                found.append(int(child))
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def the_child(worker: Worker) -> int:
    assert worker.process is not None
    pid = worker.process.pid
    [child] = wait_for(lambda: child_pids(pid), 30, "the worker's stage child process")
    return int(child)


def deliveries(prefix: str, count: int) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
    return [raw(s3_body(s3_record(f"{prefix}/{n}", f"{n + 1:018X}")), "s3") for n in range(count)]


def test_events_flow_and_pages_cover_both_processes(kafka_bootstrap: str, tmp_path: Path) -> None:
    names = Topology()
    worker = Worker(kafka_bootstrap, names.config(), tmp_path, env=TWO).start()
    try:
        child = the_child(worker)
        status, body = worker._get("/ready") or (0, "{}")
        ready = json.loads(body)
        assert status == 200, body
        assert ready["ready"] and ready["tables_recovered"]
        assert ready["stages"]["normalize"]["assigned"]
        assert ready["stages"]["emit"]["assigned"]
        assert ready["stages"]["emit"]["restore"]["state"] == "restored"

        batch = deliveries("flow", 200)
        asyncio.run(produce(kafka_bootstrap, names.raw, [*batch, batch[0]], key=b"one"))
        worker.wait_metric("storage_events_emitted_total", 200, instance="default")
        worker.wait_metric("storage_events_duplicates_total", 1, instance="default")

        answer = worker._get("/metrics")
        assert answer is not None and answer[0] == 200
        text = answer[1]
        families = [family.name for family in text_string_to_metric_families(text)]
        assert len(families) == len(set(families)), "a family twice"
        assert worker.metric("storage_events_stage_records_total", stage="normalize") == 201
        assert worker.metric("storage_events_stage_records_total", stage="emit") == 201
        assert worker.metric("storage_events_received_total", source="s3") == 201
        promtool = shutil.which("promtool")
        if promtool is not None:
            checked = subprocess.run(
                [promtool, "check", "metrics"], input=text.encode(), capture_output=True
            )
            assert b"error" not in checked.stderr.lower(), checked.stderr.decode()

        # The ready line names the child; the progress line counts its records (its view).
        # (It is logged by the worker's 1 s timer once /ready says ready: awaited.)
        wait_for(
            lambda: f"emit (2 partitions; process {child})" in worker.tail(400),
            15,
            "the ready line naming the emit child",
        )
        wait_for(
            lambda: re.search(r"progress over .*; emit [1-9]", worker.tail(400)),
            30,
            "a progress line with the child's emit records",
        )
    finally:
        assert worker.stop() == 0, worker.tail()
    assert not alive(child)
    events = asyncio.run(read_topic(kafka_bootstrap, names.output("default")))
    assert len(events) == 200


def test_sigterm_stops_both_and_nothing_is_lost(kafka_bootstrap: str, tmp_path: Path) -> None:
    """SIGTERM while batches are in hand: both processes stop (exit 0); a restart emits the
    rest, each change exactly once."""
    names = Topology()
    worker = Worker(kafka_bootstrap, names.config(), tmp_path, env=TWO).start()
    count = 3000
    try:
        child = the_child(worker)
        asyncio.run(produce(kafka_bootstrap, names.raw, deliveries("term", count)))
        worker.wait_metric("storage_events_emitted_total", 1, instance="default")
    finally:
        assert worker.stop() == 0, worker.tail()
    assert not alive(child)
    assert "the emit stage's process stopped (exit 0)" in worker.tail(200)

    restarted = Worker(kafka_bootstrap, names.config(), tmp_path, env=TWO).start()
    try:

        def all_out() -> list[str]:
            events = asyncio.run(read_topic(kafka_bootstrap, names.output("default")))
            ids = [read.json()["id"] for read in events]
            return ids if len(set(ids)) >= count else []

        ids = wait_for(all_out, 120, f"{count} distinct events on the output", interval_s=1)
    finally:
        assert restarted.stop() == 0, restarted.tail()
    repeated = [id_ for id_, seen in Counter(ids).items() if seen > 1]
    assert not repeated, f"{len(repeated)} events twice (exactly_once)"


def test_a_killed_child_stops_the_worker_with_its_code(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    names = Topology()
    worker = Worker(kafka_bootstrap, names.config(), tmp_path, env=TWO).start()
    try:
        child = the_child(worker)
        os.kill(child, signal.SIGKILL)
        assert worker.process is not None
        code = worker.process.wait(60)
    finally:
        worker.kill()
    assert code == 128 + signal.SIGKILL, worker.tail()
    assert "ended by SIGKILL" in worker.tail(200)


def test_a_killed_worker_takes_its_child_with_it(kafka_bootstrap: str, tmp_path: Path) -> None:
    names = Topology()
    worker = Worker(kafka_bootstrap, names.config(), tmp_path, env=TWO).start()
    child = the_child(worker)
    worker.kill()
    wait_for(lambda: not alive(child), 30, "the child to end with its worker")


def test_a_child_dying_at_start_up_stops_the_worker(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The worker never serves without its other stage: it stops, naming the child's end."""
    names = Topology()
    env = {**TWO, "STREAMS_FAILPOINT": "stage-process-start:1"}
    worker = Worker(kafka_bootstrap, names.config(), tmp_path, env=env).start(wait_ready=False)
    try:
        assert worker.process is not None
        code = worker.process.wait(90)
    finally:
        worker.kill()
    assert code == 128 + signal.SIGKILL, worker.tail()
    log = worker.tail(200)
    assert "the emit stage's process ended with exit code 137 (ended by SIGKILL" in log
    assert "ready:" not in log


def test_one_process_runs_both_stages_in_the_worker(kafka_bootstrap: str, tmp_path: Path) -> None:
    names = Topology()
    env = {"STREAMS_STAGE_PROCESSES": "1"}
    worker = Worker(kafka_bootstrap, names.config(), tmp_path, env=env).start()
    try:
        assert worker.process is not None
        assert child_pids(worker.process.pid) == []
        asyncio.run(produce(kafka_bootstrap, names.raw, deliveries("one", 50), key=b"one"))
        worker.wait_metric("storage_events_emitted_total", 50, instance="default")
        status, body = worker._get("/ready") or (0, "{}")
        assert status == 200, body
        assert set(json.loads(body)["stages"]) == {"normalize", "emit"}
        assert child_pids(worker.process.pid) == []
        wait_for(lambda: "ready: stages" in worker.log_path.read_text(), 30, "the ready line")
    finally:
        assert worker.stop() == 0, worker.tail()
    [ready] = [line for line in worker.log_path.read_text().splitlines() if "ready: stages" in line]
    assert "process" not in ready.split("ready: stages", 1)[1].split(";")[0], ready
