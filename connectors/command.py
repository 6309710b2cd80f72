"""What a bridge module offers the `python -m connectors` command line."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from streams.config import Settings


@dataclass(frozen=True)
class BridgeCommand:
    """One subcommand: its help line, its options, and what runs it (returns an exit code).

    Bridge modules import their heavy client libraries inside `run`, so that the command
    line stays quick for the others.
    """

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Settings], int]
