"""Kill the worker with SIGKILL while it works, and count what was lost and duplicated.

    python -m benchmarks.crash_recovery [--guarantee at_least_once|exactly_once|both]
                                        [--deliveries 30000] [--rate 3000] [--kills 5]

On the real broker (KAFKA_BOOTSTRAP_SERVERS, else the local broker of `make kafka`), with a
fresh app id and fresh topics: a producer writes distinct S3 changes to the raw topic at a
steady rate while the worker is SIGKILLed at random moments and restarted; at the end the
output topic is read with isolation.level=read_committed and compared with what was sent.
Prints one table row per guarantee. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from benchmarks.harness import WorkerProcess, bootstrap_servers, kafka_args, metric


def s3_change(index: int, keys: int) -> tuple[bytes, bytes]:
    key = f"chaos/{index % keys:05d}.bin"
    sequencer = f"{0x0069B21FFD0745EE4E + index:018X}"
    body = {
        "Records": [
            {
                "eventVersion": "2.1",
                "eventSource": "aws:s3",
                "eventTime": "2026-11-30T00:00:00.000Z",
                "eventName": "ObjectCreated:Put",
                "s3": {
                    "bucket": {"name": "chaos"},
                    "object": {
                        "key": key,
                        "size": index,
                        "eTag": f"{index:032x}",
                        "sequencer": sequencer,
                    },
                },
            }
        ]
    }
    return key.encode(), json.dumps(body).encode()


@dataclass
class Run:
    guarantee: str
    sent: int = 0
    kills: list[float] = field(default_factory=list)
    """seconds from each SIGKILL until the restarted worker was ready"""
    emitted_total: int = 0
    emitted_distinct: int = 0
    lost: int = 0
    stale: int = 0


def produce_steadily(bootstrap: str, topic: str, count: int, rate: float, keys: int) -> None:
    async def run() -> None:
        producer = AIOKafkaProducer(
            **kafka_args(bootstrap), acks="all", enable_idempotence=True, linger_ms=5
        )
        await producer.start()
        try:
            started = time.monotonic()
            for index in range(count):
                key, value = s3_change(index, keys)
                await producer.send(topic, value, key=key, headers=[("source", b"s3")])
                ahead = index / rate - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(run())


async def read_output(bootstrap: str, topic: str) -> list[str]:
    consumer = AIOKafkaConsumer(
        **kafka_args(bootstrap),
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    try:
        await consumer._client.add_topic(topic)  # track its metadata without subscribing
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        ids: list[str] = []
        while True:
            positions = [await consumer.position(tp) for tp in partitions]
            if all(
                position >= ends[tp] for position, tp in zip(positions, partitions, strict=True)
            ):
                return ids
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                ids.extend(dict(m.headers)["ce_id"].decode() for m in messages)
    finally:
        await consumer.stop()


def run_once(bootstrap: str, guarantee: str, args: argparse.Namespace, workdir: Path) -> Run:
    suffix = uuid.uuid4().hex[:8]
    app_id, raw_topic, output = f"chaos-{suffix}", f"chaos-raw-{suffix}", f"chaos-out-{suffix}"
    config = workdir / f"{guarantee}.toml"
    config.write_text(
        f'[stream]\napp_id = "{app_id}"\nraw_topics = ["{raw_topic}"]\n'
        f'repartition_topic = "{app_id}.by-key"\ndead_letter_topic = "chaos-dl-{suffix}"\n'
        f'partitions = 4\nprocessing_guarantee = "{guarantee}"\n'
        f'[[instances]]\nname = "default"\ntopic = "{output}"\n'
        f'stale_topic = "chaos-stale-{suffix}"\n'
    )
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "STREAMS_CONFIG": str(config),
        "STREAMS_DATA_DIR": str(workdir / f"state-{guarantee}"),
        "STREAMS_WEB_PORT": str(random.Random().randrange(20000, 30000)),
        # Static membership: the restarted worker takes its partitions back at once.
        "STREAMS_GROUP_INSTANCE_ID": f"{app_id}-worker-0",
    }
    if args.window:
        env["STREAMS_FAILPOINT"] = f"after-output:{random.Random(args.seed).randint(2, 4)}"
    worker = WorkerProcess(env, workdir / f"{guarantee}.log")
    result = Run(guarantee, sent=args.deliveries)
    worker.start()
    worker.wait_ready(allow_exit=True)
    producer = threading.Thread(
        target=produce_steadily,
        daemon=True,
        args=(bootstrap, raw_topic, args.deliveries, args.rate, args.keys),
    )
    producer.start()
    chooser = random.Random(args.seed)
    try:
        for kill in range(args.kills):
            if args.window:
                # The worker kills itself right after a batch's outputs were acknowledged,
                # before its state and offsets are recorded (streams/engine/failpoints.py).
                assert worker.process is not None
                worker.process.wait()
            else:
                time.sleep(chooser.uniform(1.0, 3.0))  # a random moment mid-stream
                worker.kill()
            killed_at = time.monotonic()
            last_kill = kill == args.kills - 1
            worker.env["STREAMS_FAILPOINT"] = (
                "" if last_kill or not args.window else f"after-output:{chooser.randint(1, 4)}"
            )
            worker.start()
            worker.wait_ready(allow_exit=True)
            result.kills.append(time.monotonic() - killed_at)
        producer.join()
        port = env["STREAMS_WEB_PORT"]
        last, unchanged_since = -1.0, time.monotonic()
        while time.monotonic() - unchanged_since < 15:
            done = metric(port, "storage_events_emitted_total") + metric(
                port, "storage_events_duplicates_total"
            )
            if done != last:
                last, unchanged_since = done, time.monotonic()
            time.sleep(0.5)
    finally:
        worker.stop()
    ids = asyncio.run(read_output(bootstrap, output))
    counts = Counter(ids)
    result.emitted_total = len(ids)
    result.emitted_distinct = len(counts)
    result.lost = args.deliveries - len(counts)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--guarantee", choices=["at_least_once", "exactly_once", "both"], default="both"
    )
    parser.add_argument("--deliveries", type=int, default=30_000)
    parser.add_argument("--rate", type=float, default=3000.0, help="deliveries per second")
    parser.add_argument("--keys", type=int, default=2000, help="distinct object keys")
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--window",
        action="store_true",
        help="kill exactly between a batch's output and its commit "
        "(STREAMS_FAILPOINT=after-output) instead of at random moments",
    )
    args = parser.parse_args()
    bootstrap = bootstrap_servers()
    guarantees = ["at_least_once", "exactly_once"] if args.guarantee == "both" else [args.guarantee]
    rows = []
    with tempfile.TemporaryDirectory(prefix="crash-recovery-") as tmp:
        for guarantee in guarantees:
            print(
                f"# {guarantee}: {args.deliveries} distinct changes at {args.rate:.0f}/s, "
                f"{args.kills} SIGKILLs ...",
                flush=True,
            )
            rows.append(run_once(bootstrap, guarantee, args, Path(tmp)))
    print(
        f"{'guarantee':<15}{'sent':>8}{'emitted':>9}{'distinct':>9}{'lost':>6}"
        f"{'duplicates':>11}  recovery after each kill (s)"
    )
    for row in rows:
        recovery = " ".join(f"{seconds:.1f}" for seconds in row.kills)
        print(
            f"{row.guarantee:<15}{row.sent:>8}{row.emitted_total:>9}{row.emitted_distinct:>9}"
            f"{row.lost:>6}{row.emitted_total - row.emitted_distinct:>11}  {recovery}"
        )
    return 1 if any(row.lost for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
