"""What the worker and its stage child process (streams.stages.child) say to each other, over
the socket pair the worker made for it: length-prefixed pickles, both ends this product's
code (the child is the worker's own `python -m streams.stages.child`, never a peer from the
network).

    worker -> child: the Settings (once, first), then `VIEW` requests
    child -> worker: a StageView per request

Signals carry the rest (SIGTERM: stop; the child's exit code: how it ended, EXIT_FAILED,
EXIT_START or streams.progress.EXIT_STOP_TIMEOUT).
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

HEADER = struct.Struct("!I")
VIEW = "view"
EXIT_FAILED = 1
"""The child's exit code when a stage failed (a bug or a broken disk)."""
EXIT_START = 2
"""The child's exit code when it could not start (its reason is on stderr)."""


@dataclass(frozen=True, slots=True)
class StageView:
    """The child's stages as the worker's pages, timers and ready line need them."""

    started: bool
    """Its clients started (past start-up: a failure now is no start-up failure)."""
    ready: bool
    """Its stages have their partitions, and the state is restored."""
    status: dict[str, dict[str, object]] = field(default_factory=dict)
    """streams.stages.pipeline.Pipeline.status of its stages."""
    owned: dict[str, int] = field(default_factory=dict)
    """Partitions per stage."""
    metrics: list[Metric] = field(default_factory=list)
    """Its Prometheus registry's families (streams.exposition.snapshot; merged by
    streams.exposition.merge)."""


async def send(writer: asyncio.StreamWriter, message: object) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    writer.write(HEADER.pack(len(data)) + data)
    await writer.drain()


async def receive(reader: asyncio.StreamReader) -> object:
    """The next message; asyncio.IncompleteReadError once the other end is gone."""
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    return pickle.loads(await reader.readexactly(size))  # our own child or parent
