"""The scale-out chaos run (benchmarks/scale_chaos.py) at CI size: 3 workers, 8 partitions,
exactly_once, 40,000 raw deliveries at 350/s while the group scales out 1 -> 3, loses a worker
to SIGKILL past the session timeout, has one frozen (SIGSTOP) past it and resumed, and scales
in 3 -> 2 with leave-for-good. Nothing lost, duplicated or misordered, no worker exit the run
did not cause, the scale-in's partitions processed again within 5 s. The table is printed in
the terminal summary.

With the aiokafka engine (STREAMS_ENGINE=aiokafka; librdkafka is the default) a worker
frozen past its session timeout crashes when it resumes (its open transaction is fenced:
ProducerFenced, issue 15's first point), so the run reports an unexpected exit: that one
failure, and only that one, is an expected failure for that engine (xfail, not strict); any
other failure fails the test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.chaos_harness import Harness

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

ARGS = ["--deliveries", "40000", "--rate", "350", "--session-timeout-s", "10"]
ENGINE = os.environ.get("STREAMS_ENGINE", "librdkafka")


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
    if run.process.returncode != 0 and ENGINE == "aiokafka" and documented_aiokafka_failure(result):
        pytest.xfail(
            "aiokafka engine: the worker frozen past its session timeout crashed on resume "
            "(ProducerFenced from its open transaction; issue 15, item 3)"
        )
    assert run.process.returncode == 0, f"{result['failures']}\n{table}"
    assert result["unexpected_exits"] == [], table
