"""What the chaos tests' `run_harness` fixture (tests/chaos/conftest.py) returns."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class HarnessRun:
    """One run of a chaos harness: its process, its printed table, its `--json` figures."""

    process: subprocess.CompletedProcess[str]
    table: str
    result: dict[str, Any]


Harness = Callable[..., HarnessRun]
"""`run_harness(module, args, title, timeout_s, env=None)`."""
