"""The client floor of `make bench`: the job's Kafka and RocksDB calls per delivery, no decisions.

What any CPython worker built on the chosen clients (confluent-kafka, rocksdict) pays before
it decides anything, for the pipeline's exact record counts on the same filled topic:

* stage one: consume each delivery, produce it (its bytes unchanged, standing in for the event
  JSON) to a repartition topic keyed by its object key, one transaction per batch with its
  offsets (KIP-447);
* stage two: consume each keyed record; for an event the pipeline emits, one RocksDB read (its
  key's record: mark and recent ids, streams.core.keystate), the output record and one
  changelog record in the batch's transaction, and one state write in a write batch after it
  commits; for a duplicate, nothing but the consume. `two_tables=True` makes the calls of the
  design before per-key state instead (two reads, two changelog records, two writes: `seen`
  and `marks`), for comparison.

Which records are duplicates is decided before the timed run, from the workload (the first
delivery of each change is emitted), so the loop makes only the calls. Both stages share one
thread, as the pipeline's share one event loop. It runs in the bench process, whose CPU (all
threads, librdkafka's included) over the run is reported: a lower bound on the pipeline's.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import rocksdict
from confluent_kafka import Consumer, Message, Producer

from benchmarks.ceiling import BATCH, LoopRun, process_cpu_seconds
from benchmarks.harness import kafka_settings


class _Stage:
    """One consumer and its transactional producer: a batch in, one transaction out."""

    def __init__(self, base: dict[str, object], name: str, topic: str) -> None:
        self.consumer = Consumer(
            {
                **base,
                "group.id": name,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
            }
        )
        self.producer = Producer({**base, "transactional.id": name, "acks": "all", "linger.ms": 5})
        self.producer.init_transactions(30)
        self.consumer.subscribe([topic])

    def batch(self) -> list[Message]:
        messages = self.consumer.consume(num_messages=BATCH, timeout=0.05)
        for message in messages:
            if message.error() is not None:
                raise RuntimeError(f"consume failed: {message.error()}")
        return messages

    def commit(self) -> None:
        self.producer.send_offsets_to_transaction(
            self.consumer.position(self.consumer.assignment()),
            self.consumer.consumer_group_metadata(),
        )
        self.producer.commit_transaction()

    def close(self) -> None:
        self.consumer.close()


def client_floor(
    bootstrap: str,
    source: str,
    create_topics: Callable[..., None],
    firsts: Iterable[bytes],
    count: int,
    emitted: int,
    timeout_s: float = 900.0,
    two_tables: bool = False,
) -> LoopRun:
    """Run both stages over `count` deliveries of `source` until `emitted` outputs are out.

    `firsts`: the values of the deliveries the pipeline emits (the first of each change).
    `create_topics(*names)` makes the floor's topics with the bench's partition count."""
    suffix = uuid.uuid4().hex[:8]
    keyed, output = f"floor-keyed-{suffix}", f"floor-out-{suffix}"
    seen_log, marks_log = f"floor-seen-{suffix}", f"floor-marks-{suffix}"
    create_topics(keyed, output, seen_log, marks_log)
    base = kafka_settings(bootstrap).librdkafka_config()
    one = _Stage(base, f"floor-one-{suffix}", source)
    two = _Stage(base, f"floor-two-{suffix}", keyed)
    pending = set(firsts)
    with tempfile.TemporaryDirectory(prefix="client-floor-") as tmp:
        db = rocksdict.Rdict(str(Path(tmp) / "state"), options=rocksdict.Options(raw_mode=True))
        consumed = written = 0
        started = cpu_at_start = 0.0
        deadline = time.monotonic() + timeout_s
        try:
            while consumed < count or written < emitted:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"client floor: {consumed:,} of {count:,} consumed, {written:,} of "
                        f"{emitted:,} emitted after {timeout_s:.0f} s"
                    )
                messages = one.batch()
                if messages:
                    if not started:
                        started, cpu_at_start = time.monotonic(), process_cpu_seconds()
                    one.producer.begin_transaction()
                    for message in messages:
                        one.producer.produce(
                            keyed, message.value(), message.key(), headers=message.headers()
                        )
                    one.commit()
                    consumed += len(messages)
                messages = two.batch()
                if not messages:
                    continue
                writes = rocksdict.WriteBatch(raw_mode=True)
                two.producer.begin_transaction()
                for message in messages:
                    value, key = message.value(), message.key()
                    if value not in pending:
                        continue  # a duplicate: the pipeline writes nothing for it
                    pending.discard(value)
                    db.get(key)
                    two.producer.produce(output, value, key, headers=message.headers())
                    two.producer.produce(marks_log, b"record", key)
                    writes.put(key, b"record")
                    if two_tables:
                        seen_id = b"seen/" + key + value[-16:]
                        db.get(seen_id)
                        two.producer.produce(seen_log, b"expiry", seen_id)
                        writes.put(seen_id, b"expiry")
                    written += 1
                two.commit()
                db.write(writes)
            elapsed = time.monotonic() - started
            return LoopRun(count / elapsed, process_cpu_seconds() - cpu_at_start, count)
        finally:
            one.close()
            two.close()
            db.close()
