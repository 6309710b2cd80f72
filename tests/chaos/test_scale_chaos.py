"""The scale-out chaos run (benchmarks/scale_chaos.py) at CI size: 3 workers, 8 partitions,
exactly_once, 40,000 raw deliveries at 350/s while the group scales out 1 -> 3, loses a worker
to SIGKILL past the session timeout, has one frozen (SIGSTOP) past it and resumed, and scales
in 3 -> 2 with leave-for-good. Nothing lost, duplicated or misordered, no worker exit the run
did not cause, the scale-in's partitions processed again within 5 s. The table is printed in
the terminal summary.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.chaos_harness import Harness

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

ARGS = ["--deliveries", "40000", "--rate", "350", "--session-timeout-s", "10"]


@pytest.mark.timeout(600)
def test_scale_out_chaos_run_loses_nothing_and_keeps_its_workers(
    tmp_path: Path, run_harness: Harness, kafka_bootstrap: str
) -> None:
    run = run_harness(
        "benchmarks.scale_chaos",
        ARGS,
        "scale-out chaos run ",
        timeout_s=580,
        # TMPDIR: the run's directory (kept when it fails) goes under pytest's tmp_path
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "TMPDIR": str(tmp_path)},
    )
    result, table = run.result, run.table
    data = result["data"]
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
    assert run.process.returncode == 0, f"{result['failures']}\n{table}"
    assert result["unexpected_exits"] == [], table
