"""A stage per process, without Kafka: one `/metrics` from two processes' registries
(streams.exposition), the worker's exit code for its child's (streams.stages.supervisor), the
channel's messages, the setting, and a child whose worker is gone."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from streams.config import ConfigError, load_settings
from streams.exposition import merge, samples, snapshot
from streams.stages.channel import StageView, receive, send
from streams.stages.supervisor import exit_status

ROOT = Path(__file__).resolve().parents[2]


def parsed(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of an exposition text, as Prometheus reads it."""
    return samples(text_string_to_metric_families(text))


def registry_families(records: float, lag: float | None, latency: float) -> list[Metric]:
    """One process' registry, with the product's kinds of families."""
    registry = CollectorRegistry()
    stage_records = Counter("t_stage_records", "Records", ["stage"], registry=registry)
    stuck = Gauge("t_stage_stuck", "Stuck", ["stage"], registry=registry)
    lags = Gauge("t_stage_lag", "Lag", ["stage"], registry=registry)
    seconds = Histogram("t_latency_seconds", "Latency", registry=registry, buckets=(1, 2))
    stage_records.labels("emit").inc(records)
    stage_records.labels("normalize")  # made at 0 in both processes (start_at_zero)
    stuck.labels("emit").set(0)
    if lag is not None:
        lags.labels("emit").set(lag)
    seconds.observe(latency)
    return snapshot(registry)


def test_merge_sums_each_series_once_per_family() -> None:
    worker = registry_families(0, None, 0.5)
    child = registry_families(7, 3, 1.5)
    merged = merge([worker, child]).decode()
    names = [family.name for family in text_string_to_metric_families(merged)]
    assert len(names) == len(set(names))  # no family twice
    values = parsed(merged)
    assert values[("t_stage_records_total", (("stage", "emit"),))] == 7
    assert values[("t_stage_records_total", (("stage", "normalize"),))] == 0
    assert values[("t_stage_lag", (("stage", "emit"),))] == 3
    assert values[("t_latency_seconds_count", ())] == 2
    assert values[("t_latency_seconds_bucket", (("le", "1.0"),))] == 1
    assert values[("t_latency_seconds_bucket", (("le", "2.0"),))] == 2
    created = [key for key in values if key[0].endswith("_created")]
    assert created
    for key in created:  # the earliest, never a sum
        assert values[key] == min(samples(worker)[key], samples(child)[key])


def test_merge_of_one_is_the_same_text() -> None:
    registry = CollectorRegistry()
    Counter("t_records", "Records", ["stage"], registry=registry).labels("emit").inc(3)
    Histogram("t_seconds", "Seconds", registry=registry, buckets=(1,)).observe(0.5)
    assert merge([snapshot(registry)]) == generate_latest(registry)


def test_process_metrics_of_both_processes() -> None:
    worker = snapshot()  # the default registry: process_*, python_*
    merged = parsed(merge([worker, worker]).decode())
    alone = samples(worker)
    if ("process_cpu_seconds_total", ()) in alone:  # Linux
        cpu = ("process_cpu_seconds_total", ())
        assert merged[cpu] == pytest.approx(2 * alone[cpu])
        start = ("process_start_time_seconds", ())
        assert merged[start] == alone[start]
    info = next(key for key in alone if key[0] == "python_info")
    assert merged[info] == 1


def test_the_merged_exposition_passes_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (`make promtool`)")
    import streams.metrics as product

    product.start_at_zero(["default"], ["out"])
    families = snapshot()
    merged = merge([families, families])
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=merged, capture_output=True, check=False
    )
    # promtool's lint notes (e.g. a counter's unit) are not errors of the format
    assert checked.returncode in (0, 3), checked.stderr.decode()
    assert b"error" not in checked.stderr.lower(), checked.stderr.decode()


@pytest.mark.parametrize(
    ("returncode", "status"), [(0, 0), (1, 1), (2, 2), (3, 3), (-9, 137), (-15, 143), (-11, 139)]
)
def test_the_worker_exits_with_its_childs_code(returncode: int, status: int) -> None:
    assert exit_status(returncode) == status


def test_channel_round_trip() -> None:
    async def round_trip() -> object:
        ours, theirs = socket.socketpair()
        _, writer = await asyncio.open_unix_connection(sock=ours)
        their_reader, their_writer = await asyncio.open_unix_connection(sock=theirs)
        view = StageView(True, False, {"emit": {"assigned": False}}, {"emit": 0}, snapshot())
        await send(writer, view)
        got = await receive(their_reader)
        writer.close()
        their_writer.close()
        return got

    got = asyncio.run(round_trip())
    assert isinstance(got, StageView)
    assert (got.started, got.ready, got.status, got.owned) == (
        True,
        False,
        {"emit": {"assigned": False}},
        {"emit": 0},
    )
    assert {family.name for family in got.metrics} == {family.name for family in snapshot()}


def test_the_setting_and_its_variable() -> None:
    assert load_settings(environ={}).stream.stage_processes == 2
    assert load_settings(environ={"STREAMS_STAGE_PROCESSES": "1"}).stream.stage_processes == 1
    with pytest.raises(ConfigError, match="STREAMS_STAGE_PROCESSES"):
        load_settings(environ={"STREAMS_STAGE_PROCESSES": "3"})


def test_a_child_whose_worker_is_gone_does_not_start() -> None:
    """Started with a parent pid that is not its parent (the worker died before it ran)."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        child = subprocess.run(
            [
                *(sys.executable, "-m", "streams.stages.child", "emit"),
                *("--fd", str(theirs.fileno()), "--parent", str(os.getpid() + 1_000_000)),
            ],
            cwd=ROOT,
            pass_fds=(theirs.fileno(),),
            capture_output=True,
            timeout=60,
            check=False,
        )
    assert child.returncode == 2, child.stderr.decode()


def test_a_child_that_cannot_start_says_why_and_exits_2() -> None:
    """Its worker alive (this test), but what it sends is no Settings."""

    async def start_child() -> tuple[int, bytes]:
        ours, theirs = socket.socketpair()
        with theirs:
            child = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "streams.stages.child", "emit"),
                *("--fd", str(theirs.fileno()), "--parent", str(os.getpid())),
                cwd=ROOT,
                pass_fds=(theirs.fileno(),),
                stderr=asyncio.subprocess.PIPE,
            )
        _, writer = await asyncio.open_unix_connection(sock=ours)
        await send(writer, "not settings")
        _, stderr = await asyncio.wait_for(child.communicate(), 60)
        writer.close()
        assert child.returncode is not None
        return child.returncode, stderr

    code, stderr = asyncio.run(start_child())
    assert code == 2, stderr.decode()
    assert b"the emit stage's process could not start" in stderr
