"""One worker running for a whole test module, and the topics its tests write and read."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from support.kafka_io import Header, Read, produce, read_topic
from support.worker import Topology, Worker


class Stream:
    """A running worker with its topic names; tests add their own ways of reading outputs."""

    def __init__(self, bootstrap: str, names: Topology, worker: Worker) -> None:
        self.bootstrap, self.names, self.worker = bootstrap, names, worker

    def send(self, deliveries: Sequence[tuple[bytes, Sequence[Header]]], raw_key: str) -> None:
        """In order, on one raw partition: stage one reads them in this order."""
        asyncio.run(produce(self.bootstrap, self.names.raw, deliveries, key=raw_key.encode()))

    def read(self, topic: str) -> list[Read]:
        return asyncio.run(read_topic(self.bootstrap, topic))


@contextlib.contextmanager
def running_worker(
    bootstrap: str, instances: list[dict[str, Any]], workdir: Path
) -> Iterator[tuple[Topology, Worker]]:
    """A worker on fresh topic names for `instances`, stopped cleanly after."""
    names = Topology()
    worker = Worker(bootstrap, names.config(instances), workdir).start()
    try:
        yield names, worker
    finally:
        assert worker.stop() == 0, worker.tail()
