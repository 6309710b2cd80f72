"""The chaos harness (benchmarks/chaos.py) at CI size: 2,000 raw deliveries, 5 SIGKILLs of the
worker and one broker restart, on a private broker; nothing lost, per-key order kept, every
malformed delivery dead-lettered. The table is printed in the terminal summary."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

ARGS = ["--deliveries", "2000", "--kills", "5", "--rate", "80", "--broker-down-s", "2"]


@pytest.mark.timeout(420)
def test_chaos_run_loses_nothing_and_keeps_order(
    tmp_path: Path, chaos_report: Callable[[str], None]
) -> None:
    figures = tmp_path / "chaos.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.chaos", *ARGS, "--json", str(figures)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    table = run.stdout[run.stdout.find("chaos run ") :] if "chaos run " in run.stdout else ""
    chaos_report(table or f"(no table; exit {run.returncode})\n{run.stdout[-3000:]}")
    assert figures.exists(), (
        f"the harness did not finish:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    )
    result = json.loads(figures.read_text())
    assert run.returncode == 0, f"{result['failures']}\n{table}"
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
