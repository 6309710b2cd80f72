"""The chaos harness (benchmarks/chaos.py) at CI size: 2,000 raw deliveries, 5 SIGKILLs of the
worker and one broker restart, on a private broker; nothing lost, per-key order kept, every
malformed delivery dead-lettered. The table is printed in the terminal summary."""

from __future__ import annotations

import pytest
from support.chaos_harness import Harness

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

ARGS = ["--deliveries", "2000", "--kills", "5", "--rate", "80", "--broker-down-s", "2"]


@pytest.mark.timeout(420)
def test_chaos_run_loses_nothing_and_keeps_order(run_harness: Harness) -> None:
    run = run_harness("benchmarks.chaos", ARGS, "chaos run ", timeout_s=400)
    result, table = run.result, run.table
    assert run.process.returncode == 0, f"{result['failures']}\n{table}"
    assert result["deliveries"] == 2000
    assert result["changes_sent"] > 1000
    assert result["lost"] == 0, table
    assert result["order_violations"] == 0, table
    assert result["malformed_sent"] > 0
    assert result["malformed_dead_lettered"] == result["malformed_sent"], table
    assert result["unexpected_dead_letters"] == 0, table
    assert len(result["recovery_s"]) == 5, table
    assert result["broker_resumed_s"] is not None, table
    # Every change is accounted for: emitted, or set aside as older than an emitted one.
    assert result["emitted"] + result["stale"] == result["changes_sent"], table
