"""The scale-out chaos run (benchmarks/scale_chaos.py) at CI size: 3 workers, 8 partitions,
exactly_once, 40,000 raw deliveries at 350/s while the group scales out 1 -> 3, loses a worker
to SIGKILL past the session timeout, has one frozen (SIGSTOP) past it and resumed, and scales
in 3 -> 2 with leave-for-good. Nothing lost, duplicated or misordered, no worker exit the run
did not cause, the scale-in's partitions processed again within 5 s. The table is printed in
the terminal summary.

With the aiokafka engine (today's default) a worker frozen past its session timeout crashes
when it resumes (its open transaction is fenced: ProducerFenced, issue 15's first point), so
the run reports an unexpected exit: that one failure, and only that one, is an expected
failure for that engine (xfail, not strict); any other failure fails the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

ARGS = ["--deliveries", "40000", "--rate", "350", "--session-timeout-s", "10"]
ENGINE = os.environ.get("STREAMS_ENGINE", "aiokafka")


def documented_aiokafka_failure(result: dict[str, object]) -> bool:
    """The run failed only because the frozen worker crashed on resume with ProducerFenced."""
    exits = result["unexpected_exits"]
    failures = result["failures"]
    assert isinstance(exits, list) and isinstance(failures, list)
    return (
        bool(exits)
        and all(e["phase"] == "SIGSTOP" and "Fenced" in e["cause"] for e in exits)
        and all("exit(s) the run did not cause" in failure for failure in failures)
    )


@pytest.mark.timeout(600)
def test_scale_out_chaos_run_loses_nothing_and_keeps_its_workers(
    tmp_path: Path, chaos_report: Callable[[str], None], kafka_bootstrap: str
) -> None:
    figures = tmp_path / "scale.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.scale_chaos", *ARGS, "--json", str(figures)],
        cwd=ROOT,
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap},
        capture_output=True,
        text=True,
        timeout=580,
        check=False,
    )
    start = run.stdout.find("scale-out chaos run ")
    table = run.stdout[start:] if start >= 0 else ""
    chaos_report(table or f"(no table; exit {run.returncode})\n{run.stdout[-3000:]}")
    assert figures.exists(), (
        f"the harness did not finish:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    )
    result = json.loads(figures.read_text())
    data = result["data"]
    # The data guarantees hold whatever the engine.
    assert data["deliveries"] == 40000
    assert data["changes_sent"] > 20000
    assert data["lost"] == 0, table
    assert data["duplicated"] == 0, table
    assert data["order_violations"] == 0, table
    assert data["malformed_dead_lettered"] == data["malformed_sent"] > 0, table
    assert data["emitted"] + data["stale"] == data["changes_sent"], table
    assert [change["what"].split(" ")[0] for change in result["changes"]] == [
        "scale-out",
        "SIGKILL",
        "SIGSTOP",
        "scale-in",
    ], table
    assert all(change["under_load"] for change in result["changes"]), table
    again = result["scale_in_processed_again_s"]
    assert again is not None and again <= 5.0, table
    assert result["per_partition"], table
    if run.returncode != 0 and ENGINE == "aiokafka" and documented_aiokafka_failure(result):
        pytest.xfail(
            "aiokafka engine: the worker frozen past its session timeout crashed on resume "
            "(ProducerFenced from its open transaction; issue 15, item 3)"
        )
    assert run.returncode == 0, f"{result['failures']}\n{table}"
    assert result["unexpected_exits"] == [], table
