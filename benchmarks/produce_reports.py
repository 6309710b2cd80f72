"""What a delivery report per record costs the normalize stage's producer, side by side.

    python -m benchmarks.produce_reports [--records 100000] [--rounds 2]

Writes the same records (900 bytes, two headers) in batches of 2,000 through the engine's
`produce_round` three ways, alternating, and prints this process's CPU (every thread,
librdkafka's included) per record:

* `reports`: the idempotent producer, a Python callback per record, served by a report
  thread (stage one before 2026-12-05; the emit stage's `at_least_once` writes);
* `failures only`: the idempotent producer with `delivery.report.only.error`, a round done
  once the producer holds none of its records (QuietRounds: stage one since 2026-12-05);
* `transaction`: a transactional producer, a transaction per batch, no callback; librdkafka
  still hands each record's report to the client, which takes the GIL to find none;
* `transaction, errors only`: the same with `delivery.report.only.error` (stage one in
  transactions, tried and set aside: BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from benchmarks.ceiling import process_cpu_seconds
from benchmarks.harness import kafka_settings
from streams.core.records import OutRecord
from streams.engine.librdkafka.producer import (
    PRODUCER_CONFIG,
    QuietRounds,
    ReportThread,
    produce_round,
)

BATCH = 2_000


async def with_reports(config: dict[str, object], records: list[OutRecord]) -> None:
    producer = Producer({**config, **PRODUCER_CONFIG})
    reports = ReportThread(producer, "reports")
    for start in range(0, len(records), BATCH):
        round_ = await produce_round(producer, records[start : start + BATCH])
        await round_.done
    await reports.stop()


async def failures_only(config: dict[str, object], records: list[OutRecord]) -> None:
    quiet = QuietRounds()
    producer = Producer(
        {
            **config,
            **PRODUCER_CONFIG,
            "delivery.report.only.error": True,
            "on_delivery": quiet.failed,
        }
    )
    reports = ReportThread(producer, "reports", quiet)
    for start in range(0, len(records), BATCH):
        round_ = await produce_round(producer, records[start : start + BATCH], quiet=quiet)
        await round_.done
    await reports.stop()


async def in_transactions(
    config: dict[str, object], records: list[OutRecord], only_errors: bool
) -> None:
    producer = Producer(
        {
            **config,
            **PRODUCER_CONFIG,
            "transactional.id": f"bench-reports-{os.getpid()}-{time.monotonic_ns()}",
            "delivery.report.only.error": only_errors,
        }
    )
    producer.init_transactions(30)
    for start in range(0, len(records), BATCH):
        producer.begin_transaction()
        await produce_round(producer, records[start : start + BATCH], set())
        await asyncio.to_thread(producer.commit_transaction, 30)


async def timed(write: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """CPU seconds and wall seconds of `write()`."""
    cpu, wall = process_cpu_seconds(), time.monotonic()
    await write()
    return process_cpu_seconds() - cpu, time.monotonic() - wall


async def run(bootstrap: str, count: int, rounds: int) -> None:
    connection = kafka_settings(bootstrap).librdkafka_config()
    config: dict[str, object] = dict(connection)
    topic = f"bench-reports-{os.getpid()}"
    admin = AdminClient(connection)
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(30)
    value = b"x" * 900
    records = [
        OutRecord(topic, value, f"k{n}".encode(), (("ce_id", b"%d" % n), ("ce_type", b"t")))
        for n in range(count)
    ]
    ways: list[tuple[str, Callable[[], Awaitable[None]]]] = [
        ("reports", lambda: with_reports(config, records)),
        ("failures only", lambda: failures_only(config, records)),
        ("transaction", lambda: in_transactions(config, records, False)),
        ("transaction, errors only", lambda: in_transactions(config, records, True)),
    ]
    for _ in range(rounds):
        for name, write in ways:
            cpu, wall = await timed(write)
            print(
                f"{name:<26} CPU {cpu / count * 1e6:5.1f} µs per record, "
                f"{count / wall:>9,.0f} records/s",
                flush=True,
            )
    admin.delete_topics([topic])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    )
    args = parser.parse_args()
    asyncio.run(run(args.bootstrap, args.records, args.rounds))


if __name__ == "__main__":
    main()
