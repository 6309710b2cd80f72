"""What back-to-back emit transactions wait for: the same transactions under librdkafka's
`retry.backoff.ms` 100 (its default) and the emit producer's RETRY_BACKOFF_MS, alternating
(issue 32 item 9).

    python -m benchmarks.txn_backoff [--transactions 200] [--rounds 3] [--records 1]
        [--backoffs 100,10]  # retry.backoff.ms[:retry.backoff.max.ms],...

Each round runs the emit member's MemberTransactions (streams.engine.librdkafka.transactions)
on the local broker (KAFKA_BOOTSTRAP_SERVERS, else `make kafka`'s), committing `--transactions`
transactions one after the other, each as soon as the one before returned: one output record,
one changelog record and the next input offset, as a partition's emit part. It prints each
setting's transaction time (p50, p99, mean) and the time in each phase (TransactionPhases:
producing, send_offsets_to_transaction, commit_transaction): the coordinator answers a
transaction's AddOffsetsToTxn with CONCURRENT_TRANSACTIONS while the previous one's markers
are being written, and librdkafka sends it again after `retry.backoff.ms`. A measurement, not
a test.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

from aiokafka import TopicPartition
from confluent_kafka import Consumer, Producer
from prometheus_client import REGISTRY

from benchmarks.harness import bootstrap_servers
from benchmarks.pipeline import create_topics
from streams.core.records import OutRecord
from streams.engine.librdkafka.transactions import RETRY_BACKOFF_MS, MemberTransactions
from streams.progress import Progress

LIBRDKAFKA_DEFAULT_MS = 100


PHASES = ("txn-produce", "txn-offsets", "txn-commit")


def phase_seconds() -> dict[str, float]:
    """The emit transactions' seconds per phase so far (streams.metrics.STAGE_SECONDS)."""
    return {
        phase: REGISTRY.get_sample_value(
            "storage_events_stage_seconds_total", {"stage": "emit", "phase": phase}
        )
        or 0.0
        for phase in PHASES
    }


async def one_round(
    bootstrap: str, setting: str, count: int, size: int
) -> tuple[list[float], dict[str, float]]:
    """`count` back-to-back transactions of `size` output records (over the output topic's
    partitions) and one changelog record each, with `retry.backoff.ms` (and, after a colon,
    `retry.backoff.max.ms`) from `setting`: each one's seconds, and the mean seconds per
    transaction in each phase."""
    backoff_ms, _, max_ms = setting.partition(":")
    overrides: dict[str, Any] = {"retry.backoff.ms": int(backoff_ms)}
    if max_ms:
        overrides["retry.backoff.max.ms"] = int(max_ms)
    tag = uuid.uuid4().hex[:8]
    output, changelog, source = f"txb-out-{tag}", f"txb-log-{tag}", f"txb-in-{tag}"
    await create_topics(bootstrap, output, changelog, source)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"txb-{tag}"})

    def factory(config: dict[str, Any]) -> Producer:
        return Producer({**config, **overrides})

    member = MemberTransactions(
        bootstrap,
        f"txb-{tag}",
        "w0",
        consumer.consumer_group_metadata,
        Progress(),
        producer_factory=factory,
        group_id=f"txb-{tag}",
    )
    seconds: list[float] = []
    before: dict[str, float] = {}
    try:
        await member.prepare(set())
        for index in range(count + 5):  # the first five: coordinators looked up, not timed
            records = [
                *(OutRecord(output, b"k%d" % n, b"event %d %d" % (index, n)) for n in range(size)),
                OutRecord(changelog, b"k", b"state %d" % index, (), 0),
            ]
            started = time.monotonic()
            await member.commit(0, records, {TopicPartition(source, 0): index + 1})
            if index >= 5:
                seconds.append(time.monotonic() - started)
            else:
                before = phase_seconds()
    finally:
        await member.stop()
        consumer.close()
    after = phase_seconds()
    return seconds, {phase: (after[phase] - before[phase]) / count for phase in PHASES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=1, help="output records per transaction")
    parser.add_argument(
        "--backoffs",
        default=f"{LIBRDKAFKA_DEFAULT_MS},{RETRY_BACKOFF_MS}",
        help="the retry.backoff.ms values to compare, comma-separated; each may add "
        "`:retry.backoff.max.ms`",
    )
    args = parser.parse_args()
    bootstrap = bootstrap_servers()
    results: dict[str, list[float]] = {setting: [] for setting in args.backoffs.split(",")}
    for round_ in range(args.rounds):
        order = list(results) if round_ % 2 == 0 else list(reversed(results))
        for backoff_ms in order:
            seconds, phases = asyncio.run(
                one_round(bootstrap, backoff_ms, args.transactions, args.records)
            )
            results[backoff_ms].extend(seconds)
            ordered = sorted(seconds)
            print(
                f"round {round_ + 1}, retry.backoff.ms {backoff_ms:>8}: transaction p50 "
                f"{ordered[len(ordered) // 2] * 1000:.1f} ms, p99 "
                f"{ordered[int(len(ordered) * 0.99)] * 1000:.1f} ms, mean "
                f"{statistics.fmean(seconds) * 1000:.1f} ms; mean per phase: producing "
                f"{phases['txn-produce'] * 1000:.1f} ms, send_offsets_to_transaction "
                f"{phases['txn-offsets'] * 1000:.1f} ms, commit_transaction "
                f"{phases['txn-commit'] * 1000:.1f} ms",
                flush=True,
            )
    for backoff_ms, seconds in results.items():
        ordered = sorted(seconds)
        print(
            f"retry.backoff.ms {backoff_ms:>8}, {len(seconds)} transactions: p50 "
            f"{ordered[len(ordered) // 2] * 1000:.1f} ms, p99 "
            f"{ordered[int(len(ordered) * 0.99)] * 1000:.1f} ms, mean "
            f"{statistics.fmean(seconds) * 1000:.1f} ms"
        )


if __name__ == "__main__":
    main()
