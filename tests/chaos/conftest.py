"""Chaos tests: their tables are printed at the end of the run (`make test` shows them
without `-s`), through the `chaos_report` fixture and `pytest_terminal_summary`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from support.chaos_harness import Harness, HarnessRun

# `benchmarks` (the chaos harness) is not an installed package: import it from the checkout.
ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

_TABLES = pytest.StashKey[list[tuple[str, str]]]()


@pytest.fixture
def chaos_report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Record a table (or any text) to print in the terminal summary under the test's name."""
    tables = request.config.stash.setdefault(_TABLES, [])

    def record(text: str) -> None:
        tables.append((request.node.nodeid, text))

    return record


@pytest.fixture
def run_harness(tmp_path: Path, chaos_report: Callable[[str], None]) -> Harness:
    """Run `python -m <module> <args> --json <tmp>` from the checkout, report its table (from
    the line starting with `title`), and return it; fails if it wrote no figures."""

    def run(
        module: str,
        args: list[str],
        title: str,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
    ) -> HarnessRun:
        figures = tmp_path / "figures.json"
        process = subprocess.run(
            [sys.executable, "-m", module, *args, "--json", str(figures)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        start = process.stdout.find(title)
        table = process.stdout[start:] if start >= 0 else ""
        chaos_report(table or f"(no table; exit {process.returncode})\n{process.stdout[-3000:]}")
        assert figures.exists(), (
            f"the harness did not finish:\n{process.stdout[-3000:]}\n{process.stderr[-3000:]}"
        )
        return HarnessRun(process, table, json.loads(figures.read_text()))

    return run


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    tables = config.stash.get(_TABLES, [])
    if not tables:
        return
    terminalreporter.section("chaos runs")
    for nodeid, text in tables:
        terminalreporter.write_line(nodeid)
        for line in text.splitlines():
            terminalreporter.write_line(line)
        terminalreporter.write_line("")
