"""How long a worker with no local state takes to restore its dedupe table, per million ids.

    python -m benchmarks.restore [--ids 1000000] [--partitions 4] [--ttl 24h]

On the real broker (KAFKA_BOOTSTRAP_SERVERS, else the local broker of `make kafka`), for a
fresh app id: create the stream's topics (`streams.topics.topology`, so the `seen` changelog
has its real `compact,delete` policy), fill the `seen` changelog with N dedupe ids directly
with aiokafka, in the format `streams.emitting` writes (key `<instance>/<event id>`, value
the absolute expiry as an ASCII float), spread over its partitions; then start
`faust -A streams worker` with an EMPTY state directory and time it until `/ready` answers
200 (readiness waits for table recovery). The same start against a second fresh app id with
an empty changelog gives the fixed start-up cost, which is subtracted. Finally the first
worker is stopped and started again on the state directory it kept (a pod restarted with
its PersistentVolumeClaim), which restores only what the changelog holds beyond the
offsets RocksDB recorded.

Prints one table. The topics it created are deleted at the end. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from benchmarks.harness import FAUST, ROOT, bootstrap_servers, free_port
from streams.config import load_settings, parse_duration
from streams.emitting import encode_expiry, seen_key
from streams.topics import SEEN_TABLE, changelog_topic, ensure_topics, topology

INSTANCE = "default"


def write_config(workdir: Path, app_id: str, partitions: int, ttl: str) -> Path:
    path = workdir / f"{app_id}.toml"
    path.write_text(
        f'[stream]\napp_id = "{app_id}"\nraw_topics = ["{app_id}.raw"]\n'
        f'repartition_topic = "{app_id}.by-key"\ndead_letter_topic = "{app_id}.dead-letter"\n'
        f"partitions = {partitions}\n"
        f'[[instances]]\nname = "{INSTANCE}"\ndedupe_ttl = "{ttl}"\n'
        f'topic = "{app_id}.events"\nstale_topic = "{app_id}.stale"\n'
    )
    return path


async def fill_changelog(
    bootstrap: str, topic: str, partitions: int, ids: int, ttl_s: float
) -> float:
    """Write `ids` dedupe entries to the `seen` changelog; return the seconds it took."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=20,
        max_batch_size=512 * 1024,
    )
    await producer.start()
    started = time.monotonic()
    try:
        expiry = encode_expiry(time.time() + ttl_s)
        chunk: list[asyncio.Future[object]] = []
        for index in range(ids):
            # An S3-like derived id: the size of the ids the stream records.
            key = seen_key(INSTANCE, f"s3:{uuid.UUID(int=index).hex}")
            chunk.append(await producer.send(topic, expiry, key=key, partition=index % partitions))
            if len(chunk) >= 20_000:
                await asyncio.gather(*chunk)
                chunk = []
        await asyncio.gather(*chunk)
        await producer.flush()
    finally:
        await producer.stop()
    return time.monotonic() - started


@dataclass
class Start:
    ready_s: float
    metrics_first_s: float | None
    """when /metrics first answered 200 (what a liveness probe on that port would see)"""
    metrics_slowest_s: float
    """the slowest /metrics answer before /ready said 200 (a liveness probe's timeout)"""


class Worker:
    def __init__(self, bootstrap: str, config: Path, data_dir: Path, log: Path) -> None:
        self.port = free_port()
        self.log = log
        self.env = {
            **os.environ,
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "STREAMS_CONFIG": str(config),
            "STREAMS_DATA_DIR": str(data_dir),
            "STREAMS_WEB_PORT": str(self.port),
        }
        self.process: subprocess.Popen[bytes] | None = None

    def _status(self, path: str) -> int | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return None

    def start(self, timeout_s: float) -> Start:
        started = time.monotonic()
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [str(FAUST), "-A", "streams", "worker", "-l", "info"],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        metrics_first: float | None = None
        slowest = 0.0
        while time.monotonic() - started < timeout_s:
            if self.process.poll() is not None:
                raise SystemExit(f"worker exited with {self.process.returncode}; see {self.log}")
            asked = time.monotonic()
            if self._status("/metrics") == 200:
                slowest = max(slowest, time.monotonic() - asked)
                if metrics_first is None:
                    metrics_first = time.monotonic() - started
            if self._status("/ready") == 200:
                return Start(time.monotonic() - started, metrics_first, slowest)
            time.sleep(0.05)
        self.stop()
        raise SystemExit(f"worker not ready after {timeout_s:.0f} s; see {self.log}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(90)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


async def delete_topics(bootstrap: str, names: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        with contextlib.suppress(Exception):
            await admin.delete_topics(names)
    finally:
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ids", type=int, default=1_000_000, help="dedupe ids (default 1e6)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--ttl", default="24h", help="dedupe TTL of the instance (default 24h)")
    parser.add_argument("--timeout", type=float, default=900.0, help="per start, seconds")
    args = parser.parse_args()
    # Stopped early: still delete the topics and stop the worker (the finally blocks).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    bootstrap = bootstrap_servers()
    workdir = Path(tempfile.mkdtemp(prefix="storage-events-restore-"))
    suffix = uuid.uuid4().hex[:8]
    created: list[str] = []
    try:
        loaded = []
        for app_id in (f"restore-{suffix}", f"restore-empty-{suffix}"):
            config = write_config(workdir, app_id, args.partitions, args.ttl)
            settings = load_settings(config, environ={})
            specs = topology(settings)
            asyncio.run(ensure_topics(bootstrap, specs, retry_for_s=60))
            created += [spec.name for spec in specs] + [f"{app_id}-__assignor-__leader"]
            loaded.append((app_id, config, changelog_topic(settings, SEEN_TABLE)))
        (app_id, config, seen_topic), (_, empty_config, _) = loaded
        fill_s = asyncio.run(
            fill_changelog(
                bootstrap, seen_topic, args.partitions, args.ids, parse_duration(args.ttl)
            )
        )
        print(f"# wrote {args.ids:,} ids to {seen_topic} in {fill_s:.1f} s", file=sys.stderr)

        baseline = Worker(bootstrap, empty_config, workdir / "empty-state", workdir / "e.log")
        try:
            empty = baseline.start(args.timeout)
        finally:
            baseline.stop()

        worker = Worker(bootstrap, config, workdir / "state", workdir / "worker.log")
        try:
            cold = worker.start(args.timeout)
            worker.stop()
            warm = worker.start(args.timeout)  # same state directory: the PVC survived
        finally:
            worker.stop()
    finally:
        if created:
            asyncio.run(delete_topics(bootstrap, created))
        shutil.rmtree(workdir, ignore_errors=True)

    restore_s = cold.ready_s - empty.ready_s
    per_million = restore_s / args.ids * 1_000_000
    today = datetime.date.today().isoformat()
    print(
        f"date {today}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"broker {bootstrap}, {args.partitions} partitions, {args.ids:,} ids"
    )
    print("| start | until /ready | /metrics first answered | slowest /metrics before ready |")
    print("|---|---|---|---|")
    for name, start in (
        ("empty changelog (fixed start-up cost)", empty),
        (f"empty state dir, {args.ids:,} ids to restore", cold),
        ("restart on the kept state dir", warm),
    ):
        first = "-" if start.metrics_first_s is None else f"{start.metrics_first_s:.1f} s"
        slowest = f"{start.metrics_slowest_s * 1000:.0f} ms"
        print(f"| {name} | {start.ready_s:.1f} s | {first} | {slowest} |")
    print(f"restore: {restore_s:.1f} s for {args.ids:,} ids = {per_million:.1f} s per million ids")


if __name__ == "__main__":
    main()
