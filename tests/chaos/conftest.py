"""Chaos tests: their tables are printed at the end of the run (`make test` shows them
without `-s`), through the `chaos_report` fixture and `pytest_terminal_summary`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

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
