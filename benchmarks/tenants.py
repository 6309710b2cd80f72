"""Issue 33: what the number of storage instances (tenants) costs stage one, in-process.

    python -m benchmarks.tenants [--deliveries 2000] [--sizes 1,100,10000]

For each size, a configuration of that many instances sharing one bucket, each keeping its
prefix (`bucket = "uploads"`, `prefix = "tenant-<i>"`, `sources = ["s3"]`, the spec's
multi-tenant case), written as TOML and loaded by `load_settings` (best of 3, wall clock and
this process's CPU: most of it is reading the TOML, tomllib being pure Python);
then `streams.core.routing.route` over the same number of S3 deliveries (one object each, keys
`tenant-<i>/...` spread evenly over the tenants, so every delivery is kept by exactly one
instance), best of 3 passes, this process's CPU, after one delivery has built the instance
index (its build, once per Settings, is its own column). One table; the last line compares
10,000 instances with 1 (issue 33: at most 1.5x). `STORAGE_EVENTS_PURE=1` times the
interpreted core instead of the compiled one.

    python -m benchmarks.tenants --worker [--worker-deliveries 400000] [--worker-sizes 1,1000]
        [--worker-rounds 1] [--worker-stream 'batch_size = 100000' ...]

adds the whole worker (`faust -A streams worker`, both stages, `exactly_once`) on a PRIVATE
broker of its own (dev/kafka/private.py, in a temporary directory), on the same input for
each size: `--worker-deliveries` S3 deliveries (one object each, distinct keys
`tenant-<i % 1000>/...`, so that nothing is a duplicate or stale). With 1
instance, that instance takes the whole bucket (no prefix), so that it emits every event as
the 1,000 tenants do between them (with 2 to 999 instances, the first tenants' events are
kept, the others counted `no-instance`). Per size, on a raw topic of its own filled before the
worker starts: `create-topics`, the worker's start-up (its ready line's "started in"), events/s
while its emitted count goes from 20% to 80% of what it keeps (`WINDOW`: the steady state; its
`/metrics`, aggregated by `STREAMS_INSTANCE_METRICS_LIMIT=0` so that the page polled is the
same size), the worker's CPU (both processes) and the broker's (its JVM: on a machine that
hosts both, they share the cores) per event over that time, and the emit stage's
batches and seconds in its transactional calls over the run (producing,
`send_offsets_to_transaction`, `commit_transaction`): with many instances, each transaction
pays Kafka's cost per output partition (a ProduceRequest, a commit marker), so the ratio grows
with the records each transaction carries per partition (`batch_size`), and a short input is
a few transactions.

    python -m benchmarks.tenants --producer-floor [--floor-seconds 8]

adds the floor under the emit stage at scale, on a private broker of its own: one
transactional librdkafka producer (the engine's PRODUCER_CONFIG) writing batches of 2,000
records (600 bytes, distinct keys) spread over the output topics of 1 instance (4 partitions),
of 1,000 instances with 4 partitions each, and with 1 each; a transaction per batch,
alternating layouts for two rounds. Per layout: records/s, transactions/s, ProduceRequests
per record and broker-thread wake-ups per record (librdkafka's statistics), and the producer
process's CPU per record. librdkafka puts ONE partition in each ProduceRequest (librdkafka
issue #1700) and serves every partition it knows on each wake-up of a broker thread, so a
batch spread over thousands of partitions costs a round trip and a scan of them all per
record; this section measures what that leaves to the emit stage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from benchmarks.harness import (
    ROOT,
    PrivateBroker,
    WorkerProcess,
    finish_on_sigterm,
    free_port,
    metric_sums,
    private_broker_env,
)
from benchmarks.pipeline import Raw, cpu_seconds, fill, tree_cpu_seconds
from streams import core
from streams.config import Settings, load_settings
from streams.core.records import RawRecord
from streams.core.routing import route
from streams.stages.normalize import route_policy
from streams.stages.pipeline import settle_collector

BUCKET = "uploads"


def config_text(instances: int) -> str:
    lines = ['[stream]\nraw_topics = ["files.raw"]\n']
    for number in range(instances):
        lines.append(
            f'[[instances]]\nname = "tenant-{number}"\nbucket = "{BUCKET}"\n'
            f'prefix = "tenant-{number}"\nsources = ["s3"]\n'
        )
    return "".join(lines)


def s3_delivery(key: str, sequencer: int) -> RawRecord:
    record = {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "awsRegion": "us-east-1",
        "eventTime": "2026-12-07T00:00:00.000Z",
        "eventName": "ObjectCreated:Put",
        "s3": {
            "s3SchemaVersion": "1.0",
            "bucket": {"name": BUCKET},
            "object": {"key": key, "size": 1024, "eTag": "abc", "sequencer": f"{sequencer:016X}"},
        },
    }
    body = json.dumps({"Records": [record]}).encode()
    return RawRecord("files.raw", body, {"source": b"s3"})


def best_of_three(work: Callable[[], object], clock: Callable[[], float]) -> float:
    best = float("inf")
    for _ in range(3):
        started = clock()
        work()
        best = min(best, clock() - started)
    return best


def measure(
    instances: int, deliveries: int, workdir: Path
) -> tuple[float, float, float, float, int]:
    """(settings load s wall, and CPU, index build s, route s per delivery, records routed)."""
    config = workdir / f"tenants-{instances}.toml"
    config.write_text(config_text(instances))
    loaded: list[Settings] = []
    load = best_of_three(
        lambda: loaded.append(load_settings(config, environ={})), time.perf_counter
    )
    load_cpu = best_of_three(lambda: load_settings(config, environ={}), time.process_time)
    settings = loaded[-1]
    started = time.perf_counter()
    policy = route_policy(settings)  # the instance index is built with it, once per Settings
    build = time.perf_counter() - started
    raws = [
        s3_delivery(f"tenant-{number % instances}/photos/{number}.jpg", number)
        for number in range(deliveries)
    ]
    routed = [route(raw, None, policy) for raw in raws]
    kept = sum(len(one.records) for one in routed)
    assert kept == deliveries, f"{kept} records for {deliveries} deliveries"
    assert all(not one.filtered and one.dead_letter_reason is None for one in routed)
    spent = best_of_three(lambda: [route(raw, None, policy) for raw in raws], time.process_time)
    return load, load_cpu, build, spent / deliveries, kept


def worker_config(
    instances: int, app_id: str, raw_topic: str, stream_lines: tuple[str, ...] = ()
) -> str:
    """The worker's configuration: `instances` tenants (prefixes of one bucket), or for 1 one
    instance that takes the whole bucket; topics named after the run's app id; `stream_lines`
    added to its `[stream]` table (e.g. `partitions = 1`)."""
    lines = [
        f'[stream]\napp_id = "{app_id}"\nraw_topics = ["{raw_topic}"]\n'
        f'repartition_topic = "{app_id}.by-key"\ndead_letter_topic = "{app_id}.dead-letter"\n',
        *(f"{line}\n" for line in stream_lines),
    ]
    for number in range(instances):
        name = "everything" if instances == 1 else f"tenant-{number}"
        prefix = "" if instances == 1 else f'prefix = "{name}"\n'
        lines.append(
            f'[[instances]]\nname = "{name}"\nbucket = "{BUCKET}"\n{prefix}sources = ["s3"]\n'
            f'topic = "{app_id}.out.{name}"\nstale_topic = "{app_id}.stale.{name}"\n'
        )
    return "".join(lines)


def worker_input(deliveries: int) -> list[Raw]:
    """The same deliveries for every size: keys spread over 1,000 tenants' prefixes."""
    found: list[Raw] = []
    for number in range(deliveries):
        raw = s3_delivery(f"tenant-{number % 1000}/photos/{number}.jpg", number + 1)
        found.append((f"k{number}".encode(), raw.value, [("source", b"s3")]))
    return found


Found = TypeVar("Found")


def wait_until(
    check: Callable[[], Found | None], timeout_s: float, what: str, every_s: float
) -> Found:
    """What `check` found, once it found something (not None)."""
    deadline = time.monotonic() + timeout_s
    while (found := check()) is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(every_s)
    return found


WINDOW = (0.2, 0.8)
"""events/s and CPU are measured while the emitted count goes from the first to the second
share of what the worker keeps: its steady state, without the start-up, the first batch and
the last transaction (a worker of many instances makes few, large ones)."""
EMIT_PHASES = ("txn-produce", "txn-offsets", "txn-commit")
"""The emit stage's transactional calls (streams.metrics STAGE_SECONDS phases): where a worker
of many instances waits (Kafka's cost per partition per transaction)."""


def emit_breakdown(port: int | str) -> tuple[float, dict[str, float]]:
    """The emit stage's batches, and its seconds in each of EMIT_PHASES, from one read of the
    worker's `/metrics`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    batches, seconds = 0.0, dict.fromkeys(EMIT_PHASES, 0.0)
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if 'stage="emit"' not in rest:
            continue
        value = float(line.rpartition(" ")[2])
        if name == "storage_events_stage_batches_total":
            batches += value
        elif name == "storage_events_stage_seconds_total":
            phase = re.search(r'phase="([^"]+)"', rest)
            if phase is not None and phase.group(1) in seconds:
                seconds[phase.group(1)] += value
    return batches, seconds


def worker_run(
    bootstrap: str,
    instances: int,
    records: list[Raw],
    workdir: Path,
    stream_lines: tuple[str, ...] = (),
    broker_pid: int | None = None,
) -> tuple[float, float, float, float, float, tuple[float, dict[str, float]]]:
    """(create-topics s, start-up s, events/s, the worker's and the broker's (`broker_pid`;
    NaN without it) CPU µs per event within WINDOW, the emit stage's batches and transactional
    seconds over the run) of a worker of `instances` instances on a raw topic of its own,
    filled with `records` before it starts."""
    app_id = f"tenants-{instances}-{uuid.uuid4().hex[:6]}"
    raw_topic = f"{app_id}.raw"
    config = workdir / f"{app_id}.toml"
    config.write_text(worker_config(instances, app_id, raw_topic, stream_lines))
    env = private_broker_env(
        bootstrap,
        STREAMS_CONFIG=str(config),
        STREAMS_DATA_DIR=str(workdir / app_id),
        STREAMS_WEB_PORT=str(free_port()),
        STREAMS_INSTANCE_METRICS_LIMIT="0",
    )
    env.pop("STREAMS_FAILPOINT", None)
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "streams", "create-topics"],
        cwd=ROOT,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        timeout=600,
    )
    created = time.monotonic() - started
    asyncio.run(fill(bootstrap, raw_topic, records))
    worker = WorkerProcess(env, workdir / f"{app_id}.log")
    port = env["STREAMS_WEB_PORT"]
    deliveries = len(records)
    # What its instances keep: every event with one instance (the whole bucket), else the
    # events of tenants 0 to instances - 1 (worker_input spreads them over 1,000).
    kept = deliveries if instances == 1 else sum(n % 1000 < instances for n in range(deliveries))
    try:
        started = time.monotonic()
        worker.start()

        def received() -> bool | None:
            if worker.process is not None and worker.process.poll() is not None:
                raise SystemExit(f"the worker exited; see {worker.log}")
            read = metric_sums(port, "storage_events_received_total")
            return read["storage_events_received_total"] >= 1 or None

        wait_until(received, 600, "the first delivery read", 0.05)

        def emitted(count: float) -> Callable[[], float | None]:
            def check() -> float | None:
                done = metric_sums(port, "storage_events_emitted_total")
                total = done["storage_events_emitted_total"]
                return total if total >= count else None

            return check

        low, high = WINDOW
        emitted_first = wait_until(
            emitted(low * kept), 1800, f"{low:.0%} of {kept:,} events emitted", 0.1
        )
        first = time.monotonic()
        cpu_before = tree_cpu_seconds(worker.pid)
        broker_before = cpu_seconds(broker_pid) if broker_pid is not None else float("nan")
        emitted_last = wait_until(
            emitted(high * kept), 1800, f"{high:.0%} of {kept:,} events emitted", 0.1
        )
        seconds, events = time.monotonic() - first, emitted_last - emitted_first
        cpu_after = tree_cpu_seconds(worker.pid)
        broker_cpu = (
            cpu_seconds(broker_pid) - broker_before if broker_pid is not None else float("nan")
        )
        cpu = sum(value - cpu_before.get(pid, 0.0) for pid, value in cpu_after.items())
        wait_until(emitted(kept), 1800, f"{kept:,} events emitted", 0.25)
        emit = emit_breakdown(port)
        worker.wait_ready(600)
        ready = time.monotonic() - started
        said = re.search(r"started in (\d+(?:\.\d+)?) s", worker.log.read_text(errors="replace"))
        if said is not None:  # the worker's own ready line (its start to ready)
            ready = float(said.group(1))
        per_event = 1e6 / events
        return created, ready, events / seconds, cpu * per_event, broker_cpu * per_event, emit
    finally:
        worker.stop()


def worker_section(
    deliveries: int, sizes: list[int], stream_lines: tuple[str, ...] = (), rounds: int = 1
) -> None:
    """The whole worker at each of `sizes`, in `rounds` alternating rounds (each a worker and
    topics of its own on one private broker); the last line compares the largest size's
    median events/s with the smallest's."""
    workdir = Path(tempfile.mkdtemp(prefix="tenants-worker-"))
    broker = PrivateBroker(workdir / "kafka", heap="1g")
    print(f"# starting a private broker in {workdir / 'kafka'} ...", flush=True)
    broker.start(fresh=True)
    try:
        records = worker_input(deliveries)
        print(
            f"\nthe whole worker on {deliveries:,} S3 deliveries (one object each, keys over "
            "1,000 tenants' prefixes), private broker, exactly_once"
        )
        print(
            "| instances | create-topics | start-up (ready line) | events/s "
            "| worker CPU per event | broker CPU per event | emit batches "
            "| emit s producing / sending offsets / committing |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        rates: dict[int, list[float]] = {size: [] for size in sizes}
        for size in [size for _ in range(rounds) for size in sizes]:
            created, ready, rate, cpu, broker_cpu, (batches, phases) = worker_run(
                broker.bootstrap, size, records, workdir, stream_lines, broker.pid()
            )
            rates[size].append(rate)
            spent = " / ".join(f"{phases[phase]:.1f}" for phase in EMIT_PHASES)
            print(
                f"| {size:>9,} | {created:11.1f} s | {ready:19.1f} s | {rate:8,.0f} | "
                f"{cpu:19.0f} µs | {broker_cpu:19.0f} µs | {batches:12,.0f} | {spent} |",
                flush=True,
            )
        if len(sizes) > 1:
            smallest, largest = min(sizes), max(sizes)
            ratio = statistics.median(rates[largest]) / statistics.median(rates[smallest])
            verdict = "meets" if ratio >= 0.9 else "UNDER"
            print(
                f"events/s at {largest:,} instances / at {smallest:,}"
                f"{f' (medians of {rounds} rounds)' if rounds > 1 else ''}: {ratio:.2f}x "
                f"({verdict} issue 33's 0.9x)"
            )
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


FLOOR_LAYOUTS = ((1, 4), (100, 1), (1_000, 1), (1_000, 4))
"""(topics, partitions each): the output of 1 instance; of 100 and 1,000 at 1 partition each,
and of 1,000 at the default 4."""


def floor_round(bootstrap: str, topics: list[str], seconds: float, batch: int) -> dict[str, float]:
    """One transactional producer writing `batch` records per transaction, spread evenly
    over `topics` (keyed, so over their partitions too), for about `seconds`."""
    from confluent_kafka import KafkaException, Producer

    from streams.engine.librdkafka.producer import PRODUCER_CONFIG

    stats: dict[str, float] = {}

    def on_stats(text: str) -> None:
        brokers = json.loads(text)["brokers"].values()
        stats["wakeups"] = sum(broker.get("wakeups", 0) for broker in brokers)
        stats["requests"] = sum(broker.get("req", {}).get("Produce", 0) for broker in brokers)
        stats["reports"] = stats.get("reports", 0) + 1

    producer = Producer(
        {
            **PRODUCER_CONFIG,
            "bootstrap.servers": bootstrap,
            "transactional.id": f"floor-{uuid.uuid4().hex}",
            "statistics.interval.ms": 100,
            "stats_cb": on_stats,
        }
    )
    deadline = time.monotonic() + 180  # a fresh broker creates its transaction log first
    while True:
        try:
            producer.init_transactions(30)
            break
        except KafkaException as error:
            if not error.args[0].retriable() or time.monotonic() > deadline:
                raise
    started = time.monotonic()
    producer.begin_transaction()  # every topic known (its metadata) before the clock starts
    for topic in topics:
        producer.produce(topic, b"warm", b"warm")
    producer.commit_transaction(900)
    warm = time.monotonic() - started
    wait_until(
        lambda: (producer.poll(0.1) >= 0 and "wakeups" in stats) or None, 10, "statistics", 0.1
    )
    before = dict(stats)
    value = b"x" * 600
    written = transactions = 0
    started, cpu = time.monotonic(), time.process_time()
    while time.monotonic() - started < seconds:
        producer.begin_transaction()
        for number in range(written, written + batch):
            producer.produce(topics[number % len(topics)], value, f"key-{number}".encode())
        producer.commit_transaction(900)
        written += batch
        transactions += 1
    wall, cpu = time.monotonic() - started, time.process_time() - cpu
    seen = stats["reports"]  # statistics taken after the last commit
    wait_until(
        lambda: (producer.poll(0.1) >= 0 and stats["reports"] > seen + 1) or None, 10, "stats", 0.1
    )
    return {
        "records/s": written / wall,
        "transactions/s": transactions / wall,
        "requests/record": (stats["requests"] - before["requests"]) / written,
        "wakeups/record": (stats["wakeups"] - before["wakeups"]) / written,
        "cpu µs/record": cpu / written * 1e6,
        "warm-up s": warm,
    }


def producer_floor_section(
    seconds: float, batches: list[int], wanted: tuple[tuple[int, int], ...] = FLOOR_LAYOUTS
) -> None:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    workdir = Path(tempfile.mkdtemp(prefix="tenants-floor-"))
    broker = PrivateBroker(workdir / "kafka", heap="1g")
    print(f"# starting a private broker in {workdir / 'kafka'} ...", flush=True)
    broker.start(fresh=True)
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        layouts: dict[tuple[int, int], list[str]] = {}
        for count, partitions in wanted:
            names = [f"floor-{count}x{partitions}.out.{number}" for number in range(count)]
            for start in range(0, count, 500):  # well under KRaft's records per request
                new = [NewTopic(name, partitions, 1) for name in names[start : start + 500]]
                for future in admin.create_topics(new, operation_timeout=60).values():
                    future.result()
            layouts[(count, partitions)] = names
        print(
            "\nthe emit stage's floor: one transactional librdkafka producer, a transaction "
            f"per batch spread over the output topics, {seconds:.0f} s per round, alternating"
        )
        print(
            "| round | records per transaction | output topics x partitions | records/s "
            "| transactions/s | ProduceRequests per record | wake-ups per record "
            "| CPU µs per record | warm-up transaction, one record per topic |"
        )
        print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
        rates: dict[tuple[int, int, int], float] = {}
        for round_number in (1, 2):
            for batch in batches:
                for layout, names in layouts.items():
                    got = floor_round(broker.bootstrap, names, seconds, batch)
                    rates[(batch, *layout)] = got["records/s"]
                    print(
                        f"| {round_number} | {batch:,} | {layout[0]:,} x {layout[1]} "
                        f"| {got['records/s']:,.0f} | {got['transactions/s']:.1f} "
                        f"| {got['requests/record']:.3f} | {got['wakeups/record']:.2f} "
                        f"| {got['cpu µs/record']:,.1f} | {got['warm-up s']:.1f} s |",
                        flush=True,
                    )
        for batch in batches:
            one = rates[(batch, *wanted[0])]
            for layout in wanted[1:]:
                print(
                    f"{batch:,} per transaction: records/s over {layout[0]:,} x {layout[1]} "
                    f"partitions / over {wanted[0][0]:,} x {wanted[0][1]}: "
                    f"{rates[(batch, *layout)] / one:.3f}x (round 2)"
                )
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deliveries", type=int, default=2000)
    parser.add_argument("--sizes", default="1,100,10000", help="instance counts, comma-separated")
    parser.add_argument("--worker", action="store_true", help="also the whole worker's events/s")
    parser.add_argument("--worker-deliveries", type=int, default=400_000)
    parser.add_argument("--worker-sizes", default="1,1000")
    parser.add_argument(
        "--worker-rounds", type=int, default=1, help="rounds of the sizes, alternating"
    )
    parser.add_argument(
        "--worker-stream",
        action="append",
        default=[],
        help="a TOML line for the workers' [stream] table, e.g. 'partitions = 1' (repeatable)",
    )
    parser.add_argument(
        "--producer-floor", action="store_true", help="also the emit stage's producer floor"
    )
    parser.add_argument("--floor-seconds", type=float, default=10.0)
    parser.add_argument(
        "--floor-layouts",
        default=",".join(f"{count}x{partitions}" for count, partitions in FLOOR_LAYOUTS),
        help="output topics x partitions each, comma-separated; the first is the reference",
    )
    parser.add_argument(
        "--floor-batches", default="2000,20000", help="records per transaction, comma-separated"
    )
    args = parser.parse_args()
    finish_on_sigterm()
    # A topic just created has no leader for a moment: aiokafka's producer retries, saying so.
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    sizes = [int(size) for size in args.sizes.split(",")]
    build = getattr(getattr(core, "compiled", None), "STATE", "interpreted")
    settle_collector()
    print(
        f"route over {args.deliveries:,} S3 deliveries, tenants = prefixes of one bucket "
        f"(core {build}; best of 3)"
    )
    print(
        f"| {'instances':>9} | route, µs per delivery | settings load (wall, CPU) | index build |"
    )
    print("|---:|---:|---:|---:|")
    per_delivery: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="tenants-") as tmp:
        for size in sizes:
            load, load_cpu, index, route_s, _ = measure(size, args.deliveries, Path(tmp))
            per_delivery[size] = route_s
            print(
                f"| {size:>9,} | {route_s * 1e6:22.1f} | {load:9.2f} s, {load_cpu:.2f} s CPU "
                f"| {index * 1e3:8.1f} ms |",
                flush=True,
            )
    if len(sizes) > 1:
        smallest, largest = min(sizes), max(sizes)
        ratio = per_delivery[largest] / per_delivery[smallest]
        verdict = "within" if ratio <= 1.5 else "OVER"
        print(
            f"route at {largest:,} instances / at {smallest:,}: {ratio:.2f}x "
            f"({verdict} issue 33's 1.5x)"
        )
    if args.worker:
        sizes = [int(size) for size in args.worker_sizes.split(",")]
        worker_section(args.worker_deliveries, sizes, tuple(args.worker_stream), args.worker_rounds)
    if args.producer_floor:
        batches = [int(batch) for batch in args.floor_batches.split(",")]
        layouts = tuple(
            (int(count), int(partitions))
            for count, partitions in (one.split("x") for one in args.floor_layouts.split(","))
        )
        producer_floor_section(args.floor_seconds, batches, layouts)


if __name__ == "__main__":
    main()
