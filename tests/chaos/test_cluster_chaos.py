"""The chaos harness on a three-broker cluster, at CI size: 4,500 raw deliveries while the
worker is SIGKILLed 3 times, the broker leading most of the stream's partitions is SIGKILLed
and restarted twice, and the emit producer's transaction coordinator twice, in turn
(replication factor 3, min.insync.replicas 2); nothing lost, nothing duplicated, per-key order
kept, and the stream progressed again after each broker kill. The table is printed in the
terminal summary."""

from __future__ import annotations

import pytest
from support.chaos_harness import Harness

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

# 4,500 deliveries at 15/s: a production window of ~300 s, long enough for four broker kills,
# each with its failover, its restart and its catching up, under load, where a kill took
# 24-53 s and the next one waits for it: a 200 s window ended before the fourth on a loaded
# machine (benchmarks/CHAOS.md).
ARGS = [
    "--deliveries",
    "4500",
    "--kills",
    "3",
    "--rate",
    "15",
    "--brokers",
    "3",
    "--broker-kills",
    "2",
    "--coordinator-kills",
    "2",
]


@pytest.mark.timeout(720)
def test_cluster_chaos_run_loses_nothing_when_leaders_and_the_transaction_coordinator_die(
    run_harness: Harness,
) -> None:
    run = run_harness("benchmarks.chaos", ARGS, "chaos run ", timeout_s=700)
    result, table = run.result, run.table
    assert run.process.returncode == 0, f"{result['failures']}\n{table}"
    assert result["brokers"] == 3
    assert result["changes_sent"] > 1000
    assert result["lost"] == 0, table
    assert result["duplicated"] == 0, table
    assert result["order_violations"] == 0, table
    assert result["malformed_dead_lettered"] == result["malformed_sent"] > 0, table
    assert result["unexpected_dead_letters"] == 0, table
    assert result["emitted"] + result["stale"] == result["changes_sent"], table
    assert len(result["recovery_s"]) == 3, table
    kills = result["broker_kills"]
    assert [kill["role"] for kill in kills] == ["leader", "coordinator"] * 2, table
    for kill in kills:
        if kill["role"] == "leader":  # the broker leading most partitions: its share at least
            assert kill["led"] * 3 >= kill["partitions"], table
        assert kill["no_progress_s"] is not None, table
        assert kill["in_sync_s"] is not None, table
