"""The worker's dedupe state: restore time, memory, bytes on disk per id, and the TTL bound.

    python -m benchmarks.restore [--ids 1000000] [--partitions 4] [--ttl 24h]
                                 [--expiry-ids N] [--expiry-ttl 60s] [--sweep-interval 2]
                                 [--keys N] [--before-tree DIR [--rounds 3]]

On the real broker (KAFKA_BOOTSTRAP_SERVERS, else the local broker of `make kafka`), for a
fresh app id: create the stream's topics (`streams.engine.topics.topology`, so the `seen` changelog
has its real `compact,delete` policy), fill the `seen` changelog with N dedupe ids directly
with aiokafka, in the format `streams.core.emitting` writes (key `<instance>/<event id>` with an
id shaped like the S3 normalizer's (`s3:` + 32 hex digits of a SHA-256), value the absolute
expiry as an ASCII float, `now + TTL` when the record is written), spread over its
partitions. Then:

1. Restore: start `faust -A streams worker` with an EMPTY state directory and time it until
   `/ready` answers 200 (readiness waits for the state restore). The same start against a
   second fresh app id with an empty changelog gives the fixed start-up cost, which is
   subtracted. The worker's RSS (VmRSS of /proc/<pid>/status, and its peak VmHWM; with its
   stage child process' added) is read as soon as it is ready.
2. Disk: the worker is stopped (SIGTERM: the store flushes and closes its databases), the
   files of the `seen-*.db` databases are summed, all of them (SST, MANIFEST, OPTIONS, the
   info LOGs, ...), and the live ids counted by opening them read-only.
3. Restart: the worker starts again on the state directory it kept (a pod restarted with its
   PersistentVolumeClaim), which restores only what the changelog holds beyond the offsets
   RocksDB recorded.
4. TTL bound: a third app id whose instance has a short `dedupe_ttl` (`--expiry-ttl`) and a
   sweeper every `--sweep-interval` seconds (`stream.dedupe_sweep_interval_s`). Its
   changelog is filled with `--expiry-ids` ids (default: N); a worker restores them and is
   stopped (so they sit in SST files, as in a store that ran longer than its memtables
   hold: the disk per id is reported), then one restarts on that state directory, and the
   run waits until `storage_events_dedupe_expired_total` on its /metrics reaches that
   count (ids already past their expiry when restored are skipped rather than swept; the
   run says how many), lets it run a few seconds more and stops it. The store must then
   hold no id; the disk it still uses is reported. The TTL must exceed the fill, the
   restore and the restart, or ids expire before they are swept.

5. Keys (`--keys N`, default 0 = skipped): a fourth app id whose `keys` changelog is filled
   with N records of live keys each changed once, in the format `streams.core.keystate`
   writes (key `<instance>|s3|<bucket>/<key>` with an S3-like object key; value the record:
   the mark of an S3 `created` with its sequencer padded to 64 hex digits, its one id with
   its expiry, its ETag), its `seen` changelog left empty: what the stream knows of a key,
   whole (before per-key state, a key changed once was a `marks` entry and a `seen` entry:
   compare with the first phase plus this one on that version, `--marks N`). A worker
   restores them into an empty state directory (timed as in 1, less the empty start), is
   stopped, and the `keys-*.db` files are summed: bytes on disk per live key, next to the
   mean changelog record (key + value) per key. Then a restart on the kept directory.

`--before-tree DIR` measures only the restore (1), side by side: the worker of another source
tree (`git archive <commit> | tar -x -C DIR`, e.g. the last commit before a change to the
restore) and this tree's, alternating rounds of cold starts on the same changelog, each less an
empty start of the same tree; it prints each round, the medians and their ratio.

Prints its lines (`run` returns them); progress goes to stderr. The topics it created are
deleted at the end. Other benchmarks may run on the same machine: timings are noisy. A
measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import rocksdict
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from benchmarks.harness import (
    FAUST,
    ROOT,
    bootstrap_servers,
    free_port,
    kafka_args,
    kafka_settings,
    metric,
    process_tree,
)
from streams.config import Settings, load_settings, parse_duration
from streams.core.emitting import (
    KEYS,
    KEYS_SWEEP_SCAN,
    deleted_mark_grace,
    encode_expiry,
    key_revision,
    seen_key,
)
from streams.core.keystate import KeyState, encode
from streams.core.normalizers.base import derived_id
from streams.core.ordering import Mark
from streams.engine.store import Revision, StateStore
from streams.engine.topics import KEYS_TABLE, SEEN_TABLE, changelog_topic, ensure_topics, topology

INSTANCE = "default"
EXPIRED_METRIC = "storage_events_dedupe_expired_total"
TARGET_BYTES_PER_ID = 150
MIB = 1024 * 1024


def write_config(
    workdir: Path, app_id: str, partitions: int, ttl: str, sweep_interval_s: float = 30.0
) -> Path:
    path = workdir / f"{app_id}.toml"
    path.write_text(
        f'[stream]\napp_id = "{app_id}"\nraw_topics = ["{app_id}.raw"]\n'
        f'repartition_topic = "{app_id}.by-key"\ndead_letter_topic = "{app_id}.dead-letter"\n'
        f"partitions = {partitions}\ndedupe_sweep_interval_s = {sweep_interval_s}\n"
        f'[[instances]]\nname = "{INSTANCE}"\ndedupe_ttl = "{ttl}"\n'
        f'topic = "{app_id}.events"\nstale_topic = "{app_id}.stale"\n'
    )
    return path


@dataclass(frozen=True)
class Fill:
    seconds: float
    first_expiry: float
    last_expiry: float


async def fill_changelog(
    bootstrap: str, topic: str, partitions: int, ids: int, ttl_s: float
) -> Fill:
    """Write `ids` dedupe entries to the `seen` changelog, each expiring `ttl_s` after it is
    written (as the stream records a new id)."""
    producer = AIOKafkaProducer(
        **kafka_args(bootstrap),
        acks="all",
        enable_idempotence=True,
        linger_ms=50,
        max_batch_size=1024 * 1024,
    )
    await producer.start()
    started = time.monotonic()
    first_expiry = last_expiry = time.time() + ttl_s
    try:
        chunk: list[asyncio.Future[object]] = []
        for index in range(ids):
            # The S3 normalizer's id shape: `s3:` + 32 hex digits of a SHA-256 (random
            # bytes, as RocksDB sees them; sequential ids would compress far better).
            key = seen_key(INSTANCE, derived_id("s3", "restore-benchmark", index))
            last_expiry = time.time() + ttl_s
            value = encode_expiry(last_expiry)
            chunk.append(await producer.send(topic, value, key=key, partition=index % partitions))
            if len(chunk) >= 50_000:
                await asyncio.gather(*chunk)
                chunk = []
        await asyncio.gather(*chunk)
        await producer.flush()
    finally:
        await producer.stop()
    return Fill(time.monotonic() - started, first_expiry, last_expiry)


@dataclass(frozen=True)
class MarksFill:
    seconds: float
    record_bytes: int
    """key + value bytes of all the records written"""


def benchmark_mark(index: int) -> tuple[bytes, bytes]:
    """The `keys` record of a live S3 key changed once, as `streams.core.emitting` records
    it: its mark, its one id, its ETag."""
    digest = derived_id("s3", "marks-benchmark", index)[3:]
    key = f"{INSTANCE}|s3|restore-benchmark/data/{digest[:2]}/{digest[2:10]}/{index}.parquet"
    sequencer = f"{(index * 7919) & 0xFFFFFFFFFFFFFFFF:016X}00"  # S3's: 18 hex digits
    mark = Mark(
        kind="aws-sequencer",
        token=(sequencer.ljust(64, "0"),),
        time=time.time(),
        event_id=derived_id("s3", "marks-benchmark-event", index),
        type="created",
    )
    record = KeyState(
        mark=mark,
        ids=[[mark.event_id, time.time() + 86_400]],
        etag=derived_id("s3", "etag", index)[3:35],
    )
    return key.encode(), encode(record)


async def fill_marks(bootstrap: str, topic: str, partitions: int, keys: int) -> MarksFill:
    """Write `keys` records of live keys to the `keys` changelog."""
    producer = AIOKafkaProducer(
        **kafka_args(bootstrap),
        acks="all",
        enable_idempotence=True,
        linger_ms=50,
        max_batch_size=1024 * 1024,
    )
    await producer.start()
    started = time.monotonic()
    size = 0
    try:
        chunk: list[asyncio.Future[object]] = []
        for index in range(keys):
            key, value = benchmark_mark(index)
            size += len(key) + len(value)
            chunk.append(await producer.send(topic, value, key=key, partition=index % partitions))
            if len(chunk) >= 50_000:
                await asyncio.gather(*chunk)
                chunk = []
                if index % 1_000_000 < 50_000:
                    progress(f"keys: {index + 1:,} written")
        await asyncio.gather(*chunk)
        await producer.flush()
    finally:
        await producer.stop()
    return MarksFill(time.monotonic() - started, size)


@dataclass
class Start:
    ready_s: float
    metrics_first_s: float | None
    """when /metrics first answered 200 (what a liveness probe on that port would see)"""
    metrics_slowest_s: float
    """the slowest /metrics answer before /ready said 200 (a liveness probe's timeout)"""
    rss: int = 0
    """VmRSS of the worker process when /ready first said 200, bytes"""
    rss_peak: int = 0
    """VmHWM (peak RSS) of the worker process by then, bytes"""


def memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process and its children (a stage child process), bytes."""
    found = {"VmRSS": 0, "VmHWM": 0}
    for member in process_tree(pid):
        for line in Path(f"/proc/{member}/status").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in found:
                found[name] += int(rest.split()[0]) * 1024  # kB
    return found["VmRSS"], found["VmHWM"]


class Worker:
    def __init__(
        self, bootstrap: str, config: Path, data_dir: Path, log: Path, tree: Path | None = None
    ) -> None:
        """`tree`: run the worker of another source tree (a `git archive` of an older commit):
        first on its PYTHONPATH, started in it; else this one's."""
        self.port = free_port()
        self.log = log
        self.data_dir = data_dir
        self.tree = tree or ROOT
        self.env = {
            **os.environ,
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "STREAMS_CONFIG": str(config),
            "STREAMS_DATA_DIR": str(data_dir),
            "STREAMS_WEB_PORT": str(self.port),
        }
        if tree is not None:
            paths = [str(tree), str(tree / "fileevents" / "src"), os.environ.get("PYTHONPATH", "")]
            self.env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
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
            # The console script is the Python process itself (no wrapper): its pid is the
            # worker's, whose memory is read below.
            self.process = subprocess.Popen(
                [str(FAUST), "-A", "streams", "worker", "-l", "info"],
                cwd=self.tree,
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
                ready_s = time.monotonic() - started
                rss, peak = memory(self.process.pid)
                return Start(ready_s, metrics_first, slowest, rss, peak)
            time.sleep(0.05)
        self.stop()
        raise SystemExit(f"worker not ready after {timeout_s:.0f} s; see {self.log}")

    def metric(self, name: str) -> float:
        return metric(self.port, name)

    def stop(self) -> float:
        """SIGTERM, and wait for the worker to exit (it closes, so flushes, its databases);
        return the seconds that took (0 if it was not running)."""
        if self.process is None or self.process.poll() is not None:
            return 0.0
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(90)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise SystemExit(
                f"the worker did not stop within 90 s of SIGTERM (killed: its databases "
                f"were not closed cleanly); see {self.log}"
            ) from None
        return time.monotonic() - started

    def state_dir(self, app_id: str) -> Path:
        return self.data_dir / f"{app_id}-state"


FILE_KINDS = ("SST", "MANIFEST", "OPTIONS", "info LOG", "WAL", "other")


def file_kind(name: str) -> str:
    if name.endswith(".sst"):
        return "SST"
    if name.startswith("MANIFEST-"):
        return "MANIFEST"
    if name.startswith("OPTIONS-"):
        return "OPTIONS"
    if name == "LOG" or name.startswith("LOG.old"):
        return "info LOG"
    if name.endswith(".log"):
        return "WAL"
    return "other"  # CURRENT, IDENTITY, LOCK, rocksdict's config


@dataclass
class Disk:
    """The files of the `seen-*.db` databases of one state directory."""

    databases: int = 0
    files: dict[str, int] = field(default_factory=dict)
    """kind -> number of files"""
    size: dict[str, int] = field(default_factory=dict)
    """kind -> bytes (st_size)"""
    allocated: dict[str, int] = field(default_factory=dict)
    """kind -> bytes allocated on the file system (st_blocks, what `du` counts)"""

    @property
    def total(self) -> int:
        return sum(self.size.values())

    @property
    def total_allocated(self) -> int:
        return sum(self.allocated.values())


def seen_databases(state_dir: Path, table: str = SEEN_TABLE) -> list[Path]:
    return sorted(path for path in state_dir.glob(f"{table}-*.db") if path.is_dir())


def disk_usage(state_dir: Path, table: str = SEEN_TABLE) -> Disk:
    disk = Disk()
    for db in seen_databases(state_dir, table):
        disk.databases += 1
        for path in db.rglob("*"):
            if not path.is_file():
                continue
            kind = file_kind(path.name)
            stat = path.stat()
            disk.files[kind] = disk.files.get(kind, 0) + 1
            disk.size[kind] = disk.size.get(kind, 0) + stat.st_size
            disk.allocated[kind] = disk.allocated.get(kind, 0) + stat.st_blocks * 512
    return disk


def live_ids(state_dir: Path, table: str = SEEN_TABLE) -> int:
    """The entries the `<table>-*.db` databases hold, NUL-led bookkeeping keys aside (opened
    read-only; call after sizing them: opening starts a new info LOG)."""
    count = 0
    for path in seen_databases(state_dir, table):
        db = rocksdict.Rdict(
            str(path),
            options=rocksdict.Options(raw_mode=True),
            access_type=rocksdict.AccessType.read_only(),
        )
        try:
            # keys(): iterating the Rdict itself fails in raw mode.
            keys = db.keys()
            count += sum(
                1 for key in keys if isinstance(key, bytes) and not key.startswith(b"\x00")
            )
        finally:
            db.close()
    return count


async def delete_topics(bootstrap: str, names: list[str]) -> None:
    admin = AIOKafkaAdminClient(**kafka_args(bootstrap))
    await admin.start()
    try:
        with contextlib.suppress(Exception):
            await admin.delete_topics(names)
    finally:
        await admin.close()


def progress(message: str) -> None:
    print(f"# {message}", file=sys.stderr, flush=True)


def mib(size: int) -> str:
    return f"{size / MIB:,.1f} MiB"


@dataclass
class Expiry:
    """What the TTL phase saw."""

    ids: int
    ttl_s: float
    sweep_interval_s: float
    fill: Fill
    start: Start
    """the start that restored the ids"""
    restart: Start
    """the start on the kept state directory, whose sweeper expires them"""
    live_before: int
    disk_before: Disk
    """after the restore and a clean stop: the ids sit in SST files"""
    expired: int
    """the workers' expired-ids counters when the run stopped waiting"""
    done_at: float
    """epoch seconds when the counter reached its final value"""
    waited_out: bool
    """the counter had not reached `ids` by the deadline"""
    live: int
    disk: Disk
    stop_s: float
    """SIGTERM to exit of the worker that swept"""


def expiry_phase(
    bootstrap: str,
    workdir: Path,
    app_id: str,
    config: Path,
    seen_topic: str,
    partitions: int,
    ids: int,
    ttl_s: float,
    sweep_interval_s: float,
    timeout_s: float,
) -> Expiry:
    """Fill, restore, stop (the store flushes: the ids are in SST files, as in a store that
    ran longer than its memtables hold), start again and wait for the sweeper to expire all
    ids; then let it run `settle_s` more, stop it and look at the store."""
    settle_s = max(5.0, 2 * sweep_interval_s)
    fill = asyncio.run(fill_changelog(bootstrap, seen_topic, partitions, ids, ttl_s))
    progress(f"TTL phase: wrote {ids:,} ids expiring after {ttl_s:g} s in {fill.seconds:.1f} s")
    worker = Worker(bootstrap, config, workdir / "ttl-state", workdir / "ttl.log")
    state_dir = worker.state_dir(app_id)
    try:
        start = worker.start(timeout_s)
        expired_first = int(worker.metric(EXPIRED_METRIC))  # 0 unless the TTL is too short
        worker.stop()
        disk_before = disk_usage(state_dir)
        live_before = live_ids(state_dir)
        restart = worker.start(timeout_s)
        progress(
            f"TTL phase: restored in a start of {start.ready_s:.1f} s, restarted; waiting for "
            f"the sweeper ({fill.last_expiry - time.time():.0f} s to the last expiry)"
        )
        # Each sweep reads up to streams.core.emitting.SEEN_SWEEP_SCAN ids per partition.
        deadline = fill.last_expiry + max(60.0, 20 * sweep_interval_s)
        expired, done_at = expired_first, time.time()
        while time.time() < deadline:
            now_expired = expired_first + int(worker.metric(EXPIRED_METRIC))
            if now_expired != expired:
                expired, done_at = now_expired, time.time()
            if expired >= ids:
                break
            time.sleep(0.25)
        # The worker runs on a little (RocksDB's background work, a next sweep) before it
        # is stopped, as a worker would.
        time.sleep(settle_s)
        stop_s = worker.stop()
    finally:
        worker.stop()
    disk = disk_usage(state_dir)
    return Expiry(
        ids,
        ttl_s,
        sweep_interval_s,
        fill,
        start,
        restart,
        live_before,
        disk_before,
        expired,
        done_at,
        expired < ids,
        live_ids(state_dir),
        disk,
        stop_s,
    )


@dataclass
class Marks:
    """What the marks phase saw."""

    keys: int
    fill: MarksFill
    cold: Start
    """the start that restored the marks into an empty state directory"""
    stop_s: float
    disk: Disk
    live: int
    scan_s: float
    scanned: int
    """a sweep's read of one partition's marks (`StateStore.revisions`), timed in-process"""
    warm: Start
    """the restart on the kept state directory"""


def marks_phase(
    bootstrap: str,
    workdir: Path,
    app_id: str,
    config: Path,
    topic: str,
    partitions: int,
    keys: int,
    timeout_s: float,
) -> Marks:
    """Fill the `keys` changelog, restore it into an empty state directory, stop (the
    store flushes), size the databases, and start again on the kept directory."""
    fill = asyncio.run(fill_marks(bootstrap, topic, partitions, keys))
    progress(f"keys: wrote {keys:,} records to {topic} in {fill.seconds:.1f} s")
    worker = Worker(bootstrap, config, workdir / "marks-state", workdir / "marks.log")
    state_dir = worker.state_dir(app_id)
    try:
        cold = worker.start(timeout_s)
        progress(f"keys: restored {keys:,} records; ready after {cold.ready_s:.1f} s")
        stop_s = worker.stop()
        disk = disk_usage(state_dir, KEYS_TABLE)
        live = live_ids(state_dir, KEYS_TABLE)
        scan_s, scanned = sweep_scan(state_dir, settings_of(config))
        warm = worker.start(timeout_s)
    finally:
        worker.stop()
    return Marks(keys, fill, cold, stop_s, disk, live, scan_s, scanned, warm)


def settings_of(config: Path) -> Settings:
    return load_settings(config, environ={})


def sweep_scan(state_dir: Path, settings: Settings) -> tuple[float, int]:
    """Time what a sweep does to partition 0's key records, read through to the end (the
    worker reads `streams.core.emitting.KEYS_SWEEP_SCAN` per sweep): (seconds, read)."""
    store = StateStore(state_dir, {KEYS: changelog_topic(settings, KEYS_TABLE)})
    store.open([0])
    read = 0
    now = time.time()

    def revise(key: bytes, value: bytes) -> Revision | None:
        nonlocal read
        read += 1
        return key_revision(key, value, now, lambda key: deleted_mark_grace(settings, INSTANCE))

    try:
        started = time.perf_counter()
        store.revisions(KEYS, 0, 50_000, revise)
        return time.perf_counter() - started, read
    finally:
        store.close()


def marks_lines(marks: Marks, empty: Start) -> list[str]:
    keys = marks.keys
    restore_s = marks.cold.ready_s - empty.ready_s
    lines = [
        f"keys: {keys:,} live keys written to the keys changelog in {marks.fill.seconds:.1f} s "
        f"({keys / marks.fill.seconds:,.0f}/s); changelog record (key + value) "
        f"{marks.fill.record_bytes / keys:.1f} bytes per key",
        f"keys restore: ready after {marks.cold.ready_s:.1f} s with an empty state dir, less "
        f"the empty start ({empty.ready_s:.1f} s) = {restore_s:.1f} s for {keys:,} keys = "
        f"{restore_s / keys * 1_000_000:.1f} s per million; worker RSS at ready "
        f"{mib(marks.cold.rss)} (peak {mib(marks.cold.rss_peak)})",
        f"keys on disk after a clean stop ({marks.stop_s:.1f} s from SIGTERM to exit): "
        f"{marks.live:,} live keys (counted read-only), {marks.disk.total:,} bytes = "
        f"{marks.disk.total / keys:.1f} per live key (SST only "
        f"{marks.disk.size.get('SST', 0) / keys:.1f})",
    ]
    lines += disk_lines(marks.disk, keys)
    lines.append(
        f"keys sweep: reading partition 0's {marks.scanned:,} records took {marks.scan_s:.1f} s "
        f"= {marks.scan_s / max(marks.scanned, 1) * 1e6:.1f} us per record (a sweep reads "
        f"{KEYS_SWEEP_SCAN:,} per partition)"
    )
    lines.append(f"keys: restart on the kept state dir ready after {marks.warm.ready_s:.1f} s")
    return lines


def disk_lines(disk: Disk, ids: int) -> list[str]:
    lines = [
        "| files | count | bytes | allocated (du) | bytes per id |",
        "|---|---|---|---|---|",
    ]
    for kind in FILE_KINDS:
        if kind in disk.size:
            lines.append(
                f"| {kind} | {disk.files[kind]} | {disk.size[kind]:,} | "
                f"{disk.allocated[kind]:,} | {disk.size[kind] / ids:.1f} |"
            )
    lines.append(
        f"| all | {sum(disk.files.values())} | {disk.total:,} | {disk.total_allocated:,} | "
        f"{disk.total / ids:.1f} |"
    )
    return lines


def run(
    bootstrap: str,
    ids: int = 1_000_000,
    *,
    partitions: int = 4,
    ttl: str = "24h",
    expiry_ids: int | None = None,
    expiry_ttl: str = "60s",
    sweep_interval_s: float = 2.0,
    timeout_s: float = 900.0,
    marks: int = 0,
    before_tree: Path | None = None,
    rounds: int = 3,
) -> list[str]:
    """Measure, print and return the lines. `expiry_ids` (default `ids`) ids go through the
    TTL phase with `expiry_ttl`; 0 skips it. `marks` live keys' records go through the keys
    phase; 0 skips it. `before_tree`: only the restore, side by side: `rounds` alternating
    cold starts of that tree's worker and this one's on the same changelog (`side_by_side`)."""
    expiry_ids = ids if expiry_ids is None else expiry_ids
    workdir = Path(tempfile.mkdtemp(prefix="storage-events-restore-"))
    suffix = uuid.uuid4().hex[:8]
    created: list[str] = []
    succeeded = False
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    try:
        phases = [
            (f"restore-{suffix}", ttl, 30.0),
            (f"restore-empty-{suffix}", ttl, 30.0),
        ]
        if expiry_ids:
            phases.append((f"restore-ttl-{suffix}", expiry_ttl, sweep_interval_s))
        if marks:
            phases.append((f"restore-keys-{suffix}", ttl, 30.0))
        loaded = []
        marks_topic = ""
        for app_id, app_ttl, interval in phases:
            config = write_config(workdir, app_id, partitions, app_ttl, interval)
            settings = load_settings(config, environ={})
            specs = topology(settings)
            asyncio.run(ensure_topics(kafka_settings(bootstrap), specs, retry_for_s=60))
            created += [spec.name for spec in specs] + [f"{app_id}-__assignor-__leader"]
            loaded.append((app_id, config, changelog_topic(settings, SEEN_TABLE)))
            marks_topic = changelog_topic(settings, KEYS_TABLE)
        (app_id, config, seen_topic), (_, empty_config, _) = loaded[:2]

        fill = asyncio.run(
            fill_changelog(bootstrap, seen_topic, partitions, ids, parse_duration(ttl))
        )
        progress(f"wrote {ids:,} ids to {seen_topic} in {fill.seconds:.1f} s")

        if before_tree is not None:
            for line in side_by_side(
                bootstrap, config, empty_config, workdir, before_tree, rounds, ids, timeout_s
            ):
                say(line)
            succeeded = True
            return lines

        baseline = Worker(bootstrap, empty_config, workdir / "empty-state", workdir / "e.log")
        try:
            empty = baseline.start(timeout_s)
        finally:
            baseline.stop()

        worker = Worker(bootstrap, config, workdir / "state", workdir / "worker.log")
        try:
            cold = worker.start(timeout_s)
            progress(f"restored {ids:,} ids; ready after {cold.ready_s:.1f} s")
            running_disk = disk_usage(worker.state_dir(app_id))
            stop_s = worker.stop()
            disk = disk_usage(worker.state_dir(app_id))
            live = live_ids(worker.state_dir(app_id))
            warm = worker.start(timeout_s)  # same state directory: the PVC survived
        finally:
            worker.stop()

        expiry: Expiry | None = None
        if expiry_ids:
            ttl_app_id, ttl_config, ttl_topic = loaded[2]
            expiry = expiry_phase(
                bootstrap,
                workdir,
                ttl_app_id,
                ttl_config,
                ttl_topic,
                partitions,
                expiry_ids,
                parse_duration(expiry_ttl),
                sweep_interval_s,
                timeout_s,
            )
        marks_seen: Marks | None = None
        if marks:
            marks_app_id, marks_config, _ = loaded[-1]
            marks_seen = marks_phase(
                bootstrap,
                workdir,
                marks_app_id,
                marks_config,
                marks_topic,
                partitions,
                marks,
                timeout_s,
            )
        succeeded = True
    finally:
        if created:
            asyncio.run(delete_topics(bootstrap, created))
        if succeeded:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            progress(f"kept {workdir} (worker logs, state)")

    restore_s = cold.ready_s - empty.ready_s
    per_million = restore_s / ids * 1_000_000
    today = datetime.date.today().isoformat()
    say(
        f"date {today}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"rocksdict {rocksdict_version()}, broker {bootstrap}, {partitions} partitions, "
        f"{ids:,} ids (timings are noisy: other benchmarks may share this machine)"
    )
    say(
        f"fill: {ids:,} ids written to the seen changelog in {fill.seconds:.1f} s "
        f"({ids / fill.seconds:,.0f} ids/s)"
    )
    say(
        "| start | until /ready | /metrics first answered | slowest /metrics before ready "
        "| worker RSS at ready (peak) |"
    )
    say("|---|---|---|---|---|")
    for name, start in (
        ("empty changelog (fixed start-up cost)", empty),
        (f"empty state dir, {ids:,} ids to restore", cold),
        ("restart on the kept state dir", warm),
    ):
        first = "-" if start.metrics_first_s is None else f"{start.metrics_first_s:.1f} s"
        slowest = f"{start.metrics_slowest_s * 1000:.0f} ms"
        say(
            f"| {name} | {start.ready_s:.1f} s | {first} | {slowest} | "
            f"{mib(start.rss)} ({mib(start.rss_peak)}) |"
        )
    say(f"restore: {restore_s:.1f} s for {ids:,} ids = {per_million:.1f} s per million ids")
    say(
        f"worker RSS after restoring {ids:,} ids: {mib(cold.rss)} (peak {mib(cold.rss_peak)}); "
        f"{mib(cold.rss - empty.rss)} more than with an empty changelog = "
        f"{(cold.rss - empty.rss) / ids:.0f} bytes per id"
    )
    say(
        f"RocksDB on disk after a clean stop ({stop_s:.1f} s from SIGTERM to exit): "
        f"{disk.databases} seen-*.db databases, {live:,} live ids (counted read-only)"
    )
    for line in disk_lines(disk, ids):
        say(line)
    say(
        f"while it ran, right after the restore: {running_disk.total:,} bytes on disk = "
        f"{running_disk.total / ids:.1f} per id (SST {running_disk.size.get('SST', 0):,}, "
        f"WAL {running_disk.size.get('WAL', 0):,}: the writes not flushed yet)"
    )
    verdict = "met" if disk.total / ids <= TARGET_BYTES_PER_ID else "NOT met"
    say(
        f"bytes per id on disk: {disk.total / ids:.1f} (all files), SST only "
        f"{disk.size.get('SST', 0) / ids:.1f}; target <= {TARGET_BYTES_PER_ID}: {verdict}"
    )
    if expiry is not None:
        for line in expiry_lines(expiry):
            say(line)
    if marks_seen is not None:
        for line in marks_lines(marks_seen, empty):
            say(line)
    return lines


RESTORED_LINE = re.compile(
    r"state of \d+ partitions restored: [1-9]\d* changelog records in ([\d.]+) s"
)
"""The emit stage's log line of a restore that read records (streams.stages.emit): its time."""


def side_by_side(
    bootstrap: str,
    config: Path,
    empty_config: Path,
    workdir: Path,
    before_tree: Path,
    rounds: int,
    ids: int,
    timeout_s: float,
) -> list[str]:
    """Restore time of `before_tree`'s worker and this tree's, alternating, each round a cold
    start on an empty state directory less an empty-changelog start of the same tree (the
    fixed start-up cost): ratios in one run, on a machine others share."""
    seconds: dict[str, list[float]] = {"before": [], "after": []}
    logged: dict[str, list[float]] = {"before": [], "after": []}
    for round_ in range(rounds):
        for label, tree in (("before", before_tree), ("after", None)):
            times = []
            log = workdir / f"{label}.log"
            for which, app_config in (("empty", empty_config), ("full", config)):
                state = workdir / f"{label}-{which}-{round_}"
                worker = Worker(bootstrap, app_config, state, log, tree)
                try:
                    times.append(worker.start(timeout_s).ready_s)
                finally:
                    worker.stop()
                shutil.rmtree(state, ignore_errors=True)
            seconds[label].append(times[1] - times[0])
            found = RESTORED_LINE.findall(log.read_text(errors="replace"))
            logged[label].append(float(found[-1]) if found else float("nan"))
            progress(
                f"round {round_ + 1} {label}: restore {times[1] - times[0]:.2f} s "
                f"(worker log: {logged[label][-1]:.2f} s)"
            )

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    before, after = (median(seconds[label]) for label in seconds)
    before_logged, after_logged = (median(logged[label]) for label in logged)
    return [
        f"restore of {ids:,} ids, side by side ({rounds} alternating rounds, median): "
        f"before ({before_tree}) {before:.2f} s, after (this tree) {after:.2f} s, "
        f"after/before {after / before:.2f}",
        "  rounds before: " + ", ".join(f"{value:.2f}" for value in seconds["before"]),
        "  rounds after:  " + ", ".join(f"{value:.2f}" for value in seconds["after"]),
        f"  the restore alone (the worker's log line, median): before {before_logged:.2f} s, "
        f"after {after_logged:.2f} s, after/before {after_logged / before_logged:.2f}",
        "  logged before: " + ", ".join(f"{value:.2f}" for value in logged["before"]),
        "  logged after:  " + ", ".join(f"{value:.2f}" for value in logged["after"]),
        f"  load average: {' '.join(f'{value:.2f}' for value in os.getloadavg())}",
    ]


def expiry_lines(expiry: Expiry) -> list[str]:
    ids = expiry.ids
    before, after = expiry.disk_before, expiry.disk
    lines = [
        f"TTL bound: {ids:,} ids with dedupe_ttl {expiry.ttl_s:g} s, swept every "
        f"{expiry.sweep_interval_s:g} s: written in {expiry.fill.seconds:.1f} s; a worker "
        f"restored them (ready after {expiry.start.ready_s:.1f} s) and stopped, then one "
        f"restarted on its state dir (ready after {expiry.restart.ready_s:.1f} s) swept them",
        f"before they expired, after a clean stop: {expiry.live_before:,} live ids, "
        f"{before.total:,} bytes on disk = {before.total / ids:.1f} per id "
        f"(SST only {before.size.get('SST', 0) / ids:.1f})",
        f"expired by the sweeper ({EXPIRED_METRIC}): {expiry.expired:,} of {ids:,}, the last "
        f"{expiry.done_at - expiry.fill.last_expiry:+.1f} s after the last id's expiry "
        f"({expiry.done_at - expiry.fill.first_expiry:+.1f} s after the first's)"
        + (" -- gave up waiting" if expiry.waited_out else "")
        + f"; the worker ran {max(5.0, 2 * expiry.sweep_interval_s):g} s more, then stopped",
        f"not swept: {ids - expiry.expired:,} (already expired when restored, so skipped; or "
        f"still live); live ids after a clean stop: {expiry.live:,} (counted read-only)",
        f"after they expired, after a clean stop ({expiry.stop_s:.1f} s from SIGTERM to exit): "
        f"{after.total:,} bytes on disk = "
        f"{after.total / ids:.1f} per id written (SST only "
        f"{after.size.get('SST', 0) / ids:.1f}): what RocksDB still holds until it compacts",
    ]
    lines += disk_lines(after, ids)
    return lines


def rocksdict_version() -> str:
    from importlib.metadata import version

    return version("rocksdict")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ids", type=int, default=1_000_000, help="dedupe ids (default 1e6)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--ttl", default="24h", help="dedupe TTL of the instance (default 24h)")
    parser.add_argument(
        "--expiry-ids",
        type=int,
        default=None,
        help="ids of the TTL phase (default: --ids; 0 skips the phase)",
    )
    parser.add_argument(
        "--expiry-ttl",
        default="60s",
        help="dedupe TTL of the TTL phase (default 60s; must exceed its fill and restore)",
    )
    parser.add_argument(
        "--sweep-interval",
        type=float,
        default=2.0,
        help="dedupe_sweep_interval_s of the TTL phase, seconds (default 2)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="per start, seconds")
    parser.add_argument(
        "--keys",
        type=int,
        default=0,
        help="live keys' records of the keys phase (default 0: skipped)",
    )
    parser.add_argument(
        "--before-tree",
        type=Path,
        default=None,
        help="only the restore, side by side with this source tree's worker (e.g. `git archive "
        "<commit> | tar -x -C DIR`): alternating cold starts on one changelog",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of --before-tree")
    args = parser.parse_args()
    # Stopped early: still delete the topics and stop the worker (the finally blocks).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run(
        bootstrap_servers(),
        args.ids,
        partitions=args.partitions,
        ttl=args.ttl,
        expiry_ids=args.expiry_ids,
        expiry_ttl=args.expiry_ttl,
        sweep_interval_s=args.sweep_interval,
        timeout_s=args.timeout,
        marks=args.keys,
        before_tree=args.before_tree,
        rounds=args.rounds,
    )


if __name__ == "__main__":
    main()
