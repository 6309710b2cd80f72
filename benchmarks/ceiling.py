"""The new ceiling of `make bench`: a bare librdkafka (confluent-kafka) consume -> produce loop.

Each batch (up to 2,000 records from `consume`) is produced unchanged to the sink inside one
transaction that also carries the batch's consumer offsets (`send_offsets_to_transaction`
with the group metadata, KIP-447), then committed: exactly-once with no work per record but
the client's. What this machine carries when the client is C and nothing else is done; the
aiokafka loop (benchmarks.pipeline.ceiling) stays beside it. It runs in the bench process,
whose CPU (all threads, librdkafka's included) over the loop is reported.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, Producer

from benchmarks.harness import kafka_settings

BATCH = 2000


@dataclass(frozen=True)
class LoopRun:
    rate: float
    cpu_seconds: float
    deliveries: int

    @property
    def cpu_per_delivery_us(self) -> float:
        return self.cpu_seconds / self.deliveries * 1e6


def process_cpu_seconds() -> float:
    """User + system CPU of this process, every thread (Linux /proc)."""
    fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def librdkafka_loop(bootstrap: str, source: str, sink: str, count: int) -> LoopRun:
    """Consume `count` records of `source`, produce each to `sink`, one transaction a batch."""
    base = kafka_settings(bootstrap).librdkafka_config()
    suffix = uuid.uuid4().hex[:8]
    consumer = Consumer(
        {
            **base,
            "group.id": f"ceil-rd-{suffix}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    producer = Producer(
        {**base, "transactional.id": f"ceil-rd-{suffix}", "acks": "all", "linger.ms": 5}
    )
    producer.init_transactions(30)
    consumer.subscribe([source])
    done, started, cpu_at_start = 0, 0.0, 0.0
    try:
        while done < count:
            messages = consumer.consume(num_messages=BATCH, timeout=1.0)
            if not messages:
                continue
            if not started:
                started, cpu_at_start = time.monotonic(), process_cpu_seconds()
            producer.begin_transaction()
            for message in messages:
                if message.error() is not None:
                    raise RuntimeError(f"consume failed: {message.error()}")
                producer.produce(sink, message.value(), message.key(), headers=message.headers())
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata()
            )
            producer.commit_transaction()
            done += len(messages)
        return LoopRun(
            done / (time.monotonic() - started), process_cpu_seconds() - cpu_at_start, done
        )
    finally:
        consumer.close()
