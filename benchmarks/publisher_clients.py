"""The bridges' publisher on aiokafka against a confluent-kafka (librdkafka) one, side by side.

    python -m benchmarks.publisher_clients [--deliveries 4000] [--concurrency 1,32,100]

What a bridge does per delivery: publish one raw record and wait until Kafka acknowledged it
(idempotent, `acks=all`), then answer the provider. Two contestants do exactly that, in one
process, on the real broker (KAFKA_BOOTSTRAP_SERVERS, else the local broker of `make kafka`):

1. aiokafka: `connectors.publisher.RawPublisher`, the bridges' real publisher;
2. librdkafka: a confluent-kafka `Producer` with the same guarantees and batching
   (`acks=all`, `enable.idempotence`, `linger.ms` and `message.max.bytes` from
   `connectors.publisher.producer_settings`, the connection from `KafkaSettings`), `produce`
   on the event loop and a thread serving its delivery reports, each of which resolves its
   delivery's future on the loop (one wake-up of the loop per burst of reports, not per
   report).

Each concurrency level (1 = the latency of one publish-and-acknowledge; 32 = the webhook
benchmark's connections; 100 = the pull bridges' default `max_in_flight`) runs as a closed
loop: that many tasks, each publishing its next delivery (a ~1.1 KB MinIO event with the
webhook's raw headers) when the previous one is acknowledged. Every run has a fresh topic
(4 partitions) and an untimed warm-up; the contestants alternate (A B B A ...) and each
figure is the median of its rounds. After each run the topic's end offsets must add up to
the acknowledged publishes. Per contestant: deliveries/s, p50 and p99 of publish-and-ack,
the process's CPU (all threads) per delivery, and the retried produce errors its client
reported (aiokafka: its WARNING lines, e.g. "Got error produce response ..., retrying";
librdkafka: the request retries of its statistics, `txretries`, and its error callback).

The machine's cores are shared by the broker, the contestant and whatever else runs: compare
the ratios within one run (the last lines), never absolute figures across runs. A
measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import logging
import os
import platform
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any, Protocol, cast

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka import libversion as librdkafka_version

from benchmarks.harness import bootstrap_servers, kafka_settings
from benchmarks.webhook import PARTITIONS, REQUEST_HEADERS, minio_body, records_on
from connectors.publisher import RawPublisher, producer_settings, raw_headers
from streams.engine.topics import RAW_MAX_MESSAGE_BYTES
from streams.kafka_settings import KafkaSettings

TIMEOUT_S = 10.0
WARMUP = 200
BODIES = 256
STATS_EVERY_MS = 200


@dataclass(slots=True)
class Figures:
    """One contestant's run at one concurrency."""

    rate: float
    p50: float
    p99: float
    cpu: float
    """Process CPU seconds (all threads) per delivery."""
    retried: Counter[str] = field(default_factory=Counter)
    """Retried errors the client reported during the measured phase."""
    warmup_retried: Counter[str] = field(default_factory=Counter)
    """... during the warm-up on the freshly created topic (a leader still being elected)."""
    held_ok: bool = True


class Contestant(Protocol):
    name: str

    async def start(self, topic: str) -> None: ...

    async def publish(self, value: bytes, headers: list[tuple[str, bytes]]) -> None: ...

    def reported(self) -> Counter[str]:
        """The retried errors the client reported since start, so far."""
        ...

    async def stop(self) -> Counter[str]:
        """Stop; the retried errors the client reported since start."""
        ...


class _WarningCounter(logging.Handler):
    """Counts the WARNING-or-worse records of a client library's loggers, by cause."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.by_cause: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "retrying" in message:  # "... retrying. Error: <class 'aiokafka.errors.X'>"
            cause = message.rpartition("Error: ")[2].rpartition(".")[2].strip("'> ")
        else:
            cause = message[:100]
        self.by_cause[cause] += 1


class AiokafkaContestant:
    """The bridges' real publisher (connectors.publisher.RawPublisher)."""

    name = "aiokafka (RawPublisher)"

    def __init__(self, kafka: KafkaSettings) -> None:
        self.kafka = kafka
        self._publisher: RawPublisher | None = None
        self._warnings = _WarningCounter()

    async def start(self, topic: str) -> None:
        self._warnings.by_cause.clear()
        logging.getLogger("aiokafka").addHandler(self._warnings)
        self._publisher = RawPublisher(self.kafka, topic, TIMEOUT_S)
        await self._publisher.start()

    async def publish(self, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        assert self._publisher is not None
        await self._publisher.publish(value, headers)

    def reported(self) -> Counter[str]:
        return Counter(self._warnings.by_cause)

    async def stop(self) -> Counter[str]:
        if self._publisher is not None:
            await self._publisher.stop()
        logging.getLogger("aiokafka").removeHandler(self._warnings)
        return Counter(self._warnings.by_cause)


class LibrdkafkaContestant:
    """A confluent-kafka Producer with the bridges' guarantees, awaited per delivery."""

    name = "librdkafka (Producer)"

    def __init__(self, kafka: KafkaSettings) -> None:
        self.kafka = kafka
        self._producer: Producer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._topic = ""
        self._stopped = threading.Event()
        self._poller: threading.Thread | None = None
        self._lock = threading.Lock()
        self._settled: list[tuple[asyncio.Future[None], KafkaError | None]] = []
        self._wake_pending = False
        self._errors: Counter[str] = Counter()
        self._retries = 0
        self._stats_at = 0.0

    def config(self) -> dict[str, Any]:
        """The bridges' producer settings in librdkafka's words."""
        aiokafka = producer_settings(self.kafka, TIMEOUT_S)
        return {
            **self.kafka.librdkafka_config(),
            "client.id": aiokafka["client_id"],
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": aiokafka["linger_ms"],
            "message.max.bytes": RAW_MAX_MESSAGE_BYTES,
            "request.timeout.ms": aiokafka["request_timeout_ms"],
            "message.timeout.ms": aiokafka["request_timeout_ms"],
            "statistics.interval.ms": STATS_EVERY_MS,
            "stats_cb": self._stats,
            "error_cb": self._error,
        }

    async def start(self, topic: str) -> None:
        self._loop = asyncio.get_running_loop()
        self._topic = topic
        self._errors.clear()
        self._retries, self._stats_at = 0, 0.0
        self._stopped.clear()
        self._producer = Producer(self.config())
        self._poller = threading.Thread(target=self._serve, name="reports", daemon=True)
        self._poller.start()

    def _serve(self) -> None:
        assert self._producer is not None
        while not self._stopped.is_set():
            self._producer.poll(0.05)

    def _stats(self, text: str) -> None:
        stats = json.loads(text)
        self._retries = sum(broker.get("txretries", 0) for broker in stats["brokers"].values())
        self._stats_at = time.monotonic()

    def _error(self, error: KafkaError) -> None:
        self._errors[error.name()] += 1

    def _delivered(self, future: asyncio.Future[None]) -> Callable[[Any, Message], None]:
        def report(error: KafkaError | None, message: Message) -> None:
            # The report thread: hand the result to the loop, one wake-up per burst.
            with self._lock:
                self._settled.append((future, error))
                if self._wake_pending:
                    return
                self._wake_pending = True
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._settle)

        return report

    def _settle(self) -> None:
        with self._lock:
            settled, self._settled = self._settled, []
            self._wake_pending = False
        for future, error in settled:
            if future.done():
                continue
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(RuntimeError(f"Kafka did not acknowledge: {error}"))

    async def publish(self, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        assert self._producer is not None and self._loop is not None
        future: asyncio.Future[None] = self._loop.create_future()
        # The same list aiokafka gets (confluent-kafka's stub types its items wider).
        rd_headers = cast("list[tuple[str, str | bytes | None]]", headers)
        self._producer.produce(
            self._topic, value, headers=rd_headers, on_delivery=self._delivered(future)
        )
        async with asyncio.timeout(TIMEOUT_S):
            await future

    def reported(self) -> Counter[str]:
        retried = Counter(self._errors)
        if self._retries:
            retried["request retries (txretries)"] = self._retries
        return retried

    async def stop(self) -> Counter[str]:
        ended = time.monotonic()
        deadline = ended + 5.0
        while self._stats_at <= ended and time.monotonic() < deadline:
            await asyncio.sleep(STATS_EVERY_MS / 4000)  # a statistics report after the run
        self._stopped.set()
        if self._poller is not None:
            await asyncio.to_thread(self._poller.join)
        if self._producer is not None:
            await asyncio.to_thread(self._producer.flush, TIMEOUT_S)
        self._producer = None
        return self.reported()


async def create_topic(kafka: KafkaSettings) -> str:
    topic = f"bench-publisher-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(**kafka.aiokafka_args())
    await admin.start()
    try:
        config = {"max.message.bytes": str(RAW_MAX_MESSAGE_BYTES)}
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1, topic_configs=config)])
    finally:
        await admin.close()
    return topic


async def delete_topic(kafka: KafkaSettings, topic: str) -> None:
    admin = AIOKafkaAdminClient(**kafka.aiokafka_args())
    await admin.start()
    try:
        await admin.delete_topics([topic])
    finally:
        await admin.close()


async def run_one(
    contestant: Contestant, kafka: KafkaSettings, concurrency: int, deliveries: int
) -> Figures:
    """Warm up, then `deliveries` publishes over `concurrency` closed-loop tasks."""
    bodies = [minio_body(n) for n in range(BODIES)]
    headers = raw_headers("minio", "webhook", REQUEST_HEADERS)
    topic = await create_topic(kafka)
    await contestant.start(topic)
    try:
        warmup = (contestant.publish(bodies[n % BODIES], headers) for n in range(WARMUP))
        await asyncio.gather(*warmup)
        warmup_retried = contestant.reported()
        latencies: list[float] = []
        clock = time.perf_counter
        next_n = 0

        async def task() -> None:
            nonlocal next_n
            while next_n < deliveries:
                n, next_n = next_n, next_n + 1
                started = clock()
                await contestant.publish(bodies[n % BODIES], headers)
                latencies.append(clock() - started)

        cpu, started = time.process_time(), clock()
        await asyncio.gather(*(task() for _ in range(concurrency)))
        elapsed, cpu = clock() - started, time.process_time() - cpu
    finally:
        retried = await contestant.stop()
    held = await records_on(kafka, topic)
    await delete_topic(kafka, topic)
    latencies.sort()
    return Figures(
        rate=len(latencies) / elapsed,
        p50=latencies[len(latencies) // 2],
        p99=latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        cpu=cpu / len(latencies),
        retried=retried - warmup_retried,
        warmup_retried=warmup_retried,
        held_ok=held == WARMUP + deliveries,
    )


def median_of(runs: list[Figures]) -> Figures:
    retried: Counter[str] = Counter()
    warmup_retried: Counter[str] = Counter()
    for run in runs:
        retried.update(run.retried)
        warmup_retried.update(run.warmup_retried)
    return Figures(
        rate=statistics.median(run.rate for run in runs),
        p50=statistics.median(run.p50 for run in runs),
        p99=statistics.median(run.p99 for run in runs),
        cpu=statistics.median(run.cpu for run in runs),
        retried=retried,
        warmup_retried=warmup_retried,
        held_ok=all(run.held_ok for run in runs),
    )


def line(name: str, figures: Figures, deliveries: int, rounds: int) -> str:
    def listed(causes: Counter[str]) -> str:
        return ", ".join(f"{cause} x{count}" for cause, count in causes.items()) or "none"

    return (
        f"  {name:<24} {figures.rate:>7,.0f} deliveries/s  p50 {figures.p50 * 1000:6.2f} ms  "
        f"p99 {figures.p99 * 1000:6.2f} ms  CPU/delivery {figures.cpu * 1000:.3f} ms\n"
        f"  {'':<24} retried errors: {listed(figures.retried)} (warm-up on the new topic: "
        f"{listed(figures.warmup_retried)}); "
        f"topics hold every acknowledged publish ({rounds} x {WARMUP + deliveries:,}): "
        + ("ok" if figures.held_ok else "MISMATCH")
    )


async def run(bootstrap: str, deliveries: int, levels: list[int], rounds: int) -> list[str]:
    """Every measurement; print each line as it comes and return them all."""
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.extend(text.splitlines())

    kafka = kafka_settings(bootstrap)
    aio = AiokafkaContestant(kafka)
    rd = LibrdkafkaContestant(kafka)
    settings = producer_settings(kafka, TIMEOUT_S)
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    say(
        f"# bridge publisher clients, {now}, {platform.node()}: {os.cpu_count()} cores "
        f"(load average {os.getloadavg()[0]:.2f} at start) shared by broker and contestant\n"
        f"# broker {bootstrap}; aiokafka {version('aiokafka')}, confluent-kafka "
        f"{version('confluent-kafka')} (librdkafka {librdkafka_version()[0]})\n"
        f"# both: acks=all, idempotent, linger {settings['linger_ms']} ms, each delivery "
        f"awaited until acknowledged; a {len(minio_body(0)):,} B MinIO delivery with the "
        f"webhook's raw headers; a fresh {PARTITIONS}-partition topic and {WARMUP} untimed "
        f"publishes per run; median of {rounds} rounds, contestants alternating"
    )
    ratios: dict[int, tuple[float, float, float]] = {}
    for concurrency in levels:
        say(f"concurrency {concurrency}, {deliveries:,} deliveries:")
        runs: dict[str, list[Figures]] = {aio.name: [], rd.name: []}
        for round_ in range(rounds):
            order: list[Contestant] = [aio, rd] if round_ % 2 == 0 else [rd, aio]
            for contestant in order:
                runs[contestant.name].append(
                    await run_one(contestant, kafka, concurrency, deliveries)
                )
        a, r = median_of(runs[aio.name]), median_of(runs[rd.name])
        say(line(aio.name, a, deliveries, rounds))
        say(line(rd.name, r, deliveries, rounds))
        ratios[concurrency] = (r.rate / a.rate, r.p99 / a.p99, r.cpu / a.cpu)
        say(
            f"  librdkafka / aiokafka: deliveries/s {r.rate / a.rate:.2f}, p50 "
            f"{r.p50 / a.p50:.2f}, p99 {r.p99 / a.p99:.2f}, CPU per delivery {r.cpu / a.cpu:.2f}"
        )
    say(
        "librdkafka / aiokafka, deliveries/s at concurrency "
        + ", ".join(f"{level}: {ratio[0]:.2f}" for level, ratio in ratios.items())
        + "; CPU per delivery "
        + ", ".join(f"{level}: {ratio[2]:.2f}" for level, ratio in ratios.items())
    )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=4000, help="per run (after warm-up)")
    parser.add_argument(
        "--concurrency", default="1,32,100", help="comma-separated publishes in flight"
    )
    parser.add_argument("--rounds", type=int, default=2, help="runs per contestant and level")
    args = parser.parse_args()
    levels = [int(level) for level in args.concurrency.split(",")]
    if args.deliveries < 1 or args.rounds < 1 or any(level < 1 for level in levels):
        parser.error("--deliveries, --rounds and every --concurrency level must be at least 1")
    asyncio.run(run(bootstrap_servers(), args.deliveries, levels, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
