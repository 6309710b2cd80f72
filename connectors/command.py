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
    details: Callable[[], str] | None = None
    """What `--help` prints after the options (routes, variables), as written."""


def add_publishing_arguments(parser: argparse.ArgumentParser, metrics: bool = True) -> None:
    """The options every publishing bridge shares: where to publish, how long Kafka has to
    acknowledge, and (for long-running bridges) where to serve Prometheus metrics."""
    parser.add_argument(
        "--topic",
        "--raw-topic",
        dest="topic",
        help="the raw topic to publish to (default: the first [stream] raw_topics)",
    )
    parser.add_argument(
        "--publish-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds Kafka has to acknowledge a write (default 10)",
    )
    if metrics:
        parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics here")
        parser.add_argument("--metrics-host", default="127.0.0.1", help="(default 127.0.0.1)")


def raw_topic(args: argparse.Namespace, settings: Settings) -> str:
    """`--topic`, else the first configured raw topic."""
    topic: str = args.topic or settings.stream.raw_topics[0].name
    return topic
