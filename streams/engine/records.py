"""The engine's own names for what it hands the stages: a topic partition and a consumed
record, neither a client library's type.

`TopicPartition` is a plain named tuple (topic, partition): it keys a batch's records per
partition (streams.engine.batches), the owned partitions of a member and the offsets the
engine reads or adopts. A named tuple compares and hashes as the tuple it is, so code still
holding another library's `(topic, partition)` named tuple finds the same dictionary entries.

`ConsumedRecord` is what a stage may call on a record of a batch: confluent_kafka.Message's
calls, which the engine's consumer hands over as they come (no wrapper per record: measured
as a cost on the hot path, 2d88fb9), and which `Unreadable` (streams.engine.librdkafka.consumer)
answers too. A stage types its records with it, never with confluent_kafka.Message.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol


class TopicPartition(NamedTuple):
    """One partition of one topic."""

    topic: str
    partition: int


class ConsumedRecord(Protocol):
    """A record of a batch, as the stages read it."""

    def topic(self) -> str | None: ...

    def partition(self) -> int | None: ...

    def offset(self) -> int | None: ...

    def key(self) -> bytes | None: ...

    def value(self) -> bytes | None: ...

    def headers(self) -> list[tuple[str, bytes]] | None: ...
