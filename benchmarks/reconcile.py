"""Reconcile at bucket scale: time, peak RSS and Kafka bytes per knowledge source.

    python -m benchmarks.reconcile [--keys 1000000] [--drift 0.01] [--s3 moto|URL]
                                   [--baseline-commit REV] [--partitions 4]

A bucket of N objects on an S3-API server, the stream's knowledge of it in Kafka, and
`python -m connectors reconcile --dry-run` run once per knowledge source:

* `state` (the default since issue 25 item 2): the worker's keys changelog, filled with one
  record per key in the worker's format (streams.core.keystate: a `created` mark with an S3
  sequencer, one id, the ETag), as a worker that emitted one event per key leaves it;
* `output` (`--known-from output`): the output topic, filled with one canonical event per key
  (an S3 `created` with its notification in `raw`, as the worker emits it): the best case of
  that reader, whose cost grows with every event the topic still holds;
* `baseline`: the output-topic read of the code before this change (`--baseline-commit`,
  default `HEAD` when it predates `--known-from`, else the commit that introduced it:
  its tree is exported with `git archive` and run as it was), which held the listing, every
  output value and a dict of every key in memory.

Drift, both ways, each `--drift` of N (default 1%): keys the stream never heard of, keys with
another ETag, and known keys gone from the bucket (deleted drift); plus as many keys the stream
knows as deleted. Every run must find the same drift (checked).

Figures per run: wall time; peak RSS (VmHWM of the process, sampled every 50 ms until it
exits: a run's last 50 ms could escape it; not `ru_maxrss`, which for a child forked from this
large process counts the pages it shared before its exec); bytes read
from Kafka: the topic's log segments on the private broker (what a read from the beginning
fetches; records are not compressed, as the worker writes them) and, for `state`, the keys and
values the reader counted. Also the listing alone (boto3 in this process), the S3 server's
share of every run.

S3 server: `--s3 moto` (default) starts moto's server in this process and fills the bucket
through moto's backend directly (a PUT per object over HTTP would take most of the budget);
reconcile lists it over HTTP like any S3 endpoint. moto sorts the whole bucket for each page
of 1,000 keys, so listing N keys costs O(N^2 log N): 1,000,000 keys take hours there, which
is why the default run is smaller (say so when quoting it). `--s3 URL` uses a running server
(MinIO: `minio server DIR`, credentials in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY), filled
with PUTs at `--put-concurrency`.

Kafka: a private broker (dev/kafka/private.py) in a temporary directory, stopped and deleted
at the end; `KAFKA_BOOTSTRAP_SERVERS` is ignored. A measurement, not a test; other work on the
machine makes its timings noisy.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, PrivateBroker, private_broker_env

INSTANCE = "bench"
BUCKET = "reconcile-bench"
APP_ID = "reconcile-bench"
T0 = datetime(2026, 12, 1, tzinfo=UTC)
KNOWN_FROM_COMMIT_HINT = "--known-from"


def log(message: str) -> None:
    print(f"[reconcile bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def object_key(i: int) -> str:
    return f"data/{i // 1000:04d}/object-{i:08d}.bin"


def body(i: int) -> bytes:
    return f"object {i}\n".encode()


def etag(i: int) -> str:
    return hashlib.md5(body(i)).hexdigest()


class Layout:
    """Which keys are where: the bucket, and what the stream knows."""

    def __init__(self, keys: int, drift: float) -> None:
        self.keys = keys
        self.step = max(int(1 / drift), 4) if drift > 0 else 0
        self.extra = keys // self.step if self.step else 0

    def unknown(self, i: int) -> bool:  # listed, the stream never heard of it
        return bool(self.step) and i % self.step == 1

    def other_etag(self, i: int) -> bool:  # listed, the stream has another ETag
        return bool(self.step) and i % self.step == 2

    def known(self) -> Any:
        """(key, type, etag) of every key the stream knows."""
        for i in range(self.keys):
            if self.unknown(i):
                continue
            yield object_key(i), "created", "0" * 32 if self.other_etag(i) else etag(i)
        for j in range(self.extra):
            yield f"gone/object-{j:08d}.bin", "created", etag(-j - 1)  # deleted drift
            yield f"dead/object-{j:08d}.bin", "deleted", etag(-j - 1)  # known deleted: in sync

    def expected(self) -> tuple[int, int]:
        """(created, deleted) drift."""
        created = sum(1 for i in range(self.keys) if self.unknown(i) or self.other_etag(i))
        return created, self.extra


# --- S3 ------------------------------------------------------------------------------------


def moto_bucket(layout: Layout) -> tuple[str, Any]:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    from benchmarks.harness import free_port

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    backend.create_bucket(BUCKET, "us-east-1")
    started = time.monotonic()
    for i in range(layout.keys):
        backend.put_object(BUCKET, object_key(i), body(i))
        if i and i % 100_000 == 0:
            log(f"moto: {i} objects ({i / (time.monotonic() - started):.0f}/s)")
    return f"http://127.0.0.1:{port}", server


def put_bucket(endpoint: str, layout: Layout, concurrency: int) -> None:
    from connectors.reconcile.listings.s3 import s3_client

    client = s3_client(endpoint, os.environ.get("AWS_REGION", "us-east-1"))
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=BUCKET)

    def put(i: int) -> None:
        client.put_object(Bucket=BUCKET, Key=object_key(i), Body=body(i))

    fill(put, layout.keys, concurrency, "s3", every=50_000, chunksize=256)


def fill(
    put: Callable[[int], None],
    count: int,
    concurrency: int,
    label: str,
    every: int,
    chunksize: int,
) -> None:
    """`put(i)` for every object number, `concurrency` threads, a progress line every
    `every` objects."""
    started = time.monotonic()
    done = 0
    lock = threading.Lock()

    def counted(i: int) -> None:
        nonlocal done
        put(i)
        with lock:
            done += 1
            if done % every == 0:
                log(f"{label}: {done} objects ({done / (time.monotonic() - started):.0f}/s)")

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(counted, range(count), chunksize=chunksize))


def gofakes3_bucket(binary: str, layout: Layout, concurrency: int) -> tuple[str, Any]:
    """gofakes3 (memory backend) on a free port, filled with unsigned PUTs (it checks no
    signature), a keep-alive connection per thread."""
    import http.client

    from benchmarks.harness import free_port

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    port = free_port()
    server = subprocess.Popen(
        [binary, "-backend", "memory", "-host", f"127.0.0.1:{port}", "-initialbucket", BUCKET],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1)
    local = threading.local()

    def put(i: int) -> None:
        connection = getattr(local, "connection", None)
        if connection is None:
            connection = local.connection = http.client.HTTPConnection("127.0.0.1", port)
        data = body(i)
        connection.request(
            "PUT", f"/{BUCKET}/{object_key(i)}", data, {"Content-Length": str(len(data))}
        )
        response = connection.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"PUT {object_key(i)}: HTTP {response.status}")

    fill(put, layout.keys, concurrency, "gofakes3", every=100_000, chunksize=1000)
    return f"http://127.0.0.1:{port}", server


def listing_alone(endpoint: str) -> tuple[float, int]:
    from connectors.reconcile.listings.s3 import list_bucket, s3_client

    client = s3_client(endpoint, os.environ.get("AWS_REGION", "us-east-1"))
    started = time.monotonic()
    count = sum(1 for _ in list_bucket(client, BUCKET, ""))
    return time.monotonic() - started, count


# --- Kafka ---------------------------------------------------------------------------------


def create_topics(bootstrap: str, partitions: int, topics: list[str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(t, partitions, 1, config={"cleanup.policy": "compact"}) for t in topics]
    )
    for future in futures.values():
        future.result(60)


def produce(bootstrap: str, topic: str, records: Any) -> int:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 100_000,
            "enable.idempotence": True,
        }
    )
    count = 0
    for key, value in records:
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.1)
        count += 1
        if count % 200_000 == 0:
            producer.poll(0)
            log(f"{topic}: {count} records")
    if producer.flush(120) != 0:
        raise RuntimeError(f"{topic}: records not delivered")
    return count


def changelog_records(layout: Layout) -> Any:
    from streams.core.keystate import KeyState, encode
    from streams.core.ordering import Mark

    seconds = T0.timestamp()
    for n, (key, event_type, tag) in enumerate(layout.known()):
        sequencer = f"{n:016X}".ljust(64, "0")
        mark = Mark(
            "aws-sequencer",
            (sequencer,),
            seconds + n % 86400,
            f"s3:{hashlib.sha256(key.encode()).hexdigest()[:32]}",
            event_type,
            seconds + 30 * 86400 if event_type == "deleted" else None,
        )
        state = KeyState(mark=mark, ids=[[mark.event_id, seconds + 86400]], etag=tag)
        yield f"{INSTANCE}|s3|{BUCKET}/{key}".encode(), encode(state)
    # A partition's markers, as the worker writes them.
    yield b"\x00seen-ids-until", str(seconds).encode()


def output_records(layout: Layout) -> Any:
    seconds = T0.timestamp()
    for n, (key, event_type, tag) in enumerate(layout.known()):
        when = datetime.fromtimestamp(seconds + n % 86400, UTC).isoformat().replace("+00:00", "Z")
        sequencer = f"{n:016X}"
        raw = {
            "eventVersion": "2.1",
            "eventSource": "aws:s3",
            "awsRegion": "us-east-1",
            "eventTime": when,
            "eventName": "ObjectCreated:Put" if event_type == "created" else "ObjectRemoved:Delete",
            "s3": {
                "bucket": {"name": BUCKET, "arn": f"arn:aws:s3:::{BUCKET}"},
                "object": {"key": key, "size": 12, "eTag": tag, "sequencer": sequencer},
            },
        }
        event = {
            "id": f"s3:{hashlib.sha256(key.encode()).hexdigest()[:32]}",
            "type": event_type,
            "key": key,
            "bucket": BUCKET,
            "size": 12 if event_type == "created" else None,
            "etag": tag,
            "time": when,
            "sequencer": sequencer,
            "provider": "s3",
            "raw": raw,
        }
        yield key.encode(), json.dumps(event, separators=(",", ":")).encode()


def topic_bytes(broker_dir: Path, topic: str) -> int:
    """The topic's log segments on the private broker."""
    return sum(
        path.stat().st_size
        for path in broker_dir.rglob("*.log")
        if path.parent.name.rsplit("-", 1)[0] == topic
    )


# --- runs ----------------------------------------------------------------------------------


def config(directory: Path, partitions: int) -> Path:
    path = directory / "streams.toml"
    path.write_text(
        "[stream]\n"
        f'app_id = "{APP_ID}"\n'
        'raw_topics = ["reconcile-bench.raw"]\n'
        f"partitions = {partitions}\n"
        "[[instances]]\n"
        f'name = "{INSTANCE}"\n'
        f'bucket = "{BUCKET}"\n'
        'sources = ["s3"]\n'
        f'topic = "{INSTANCE}.events"\n'
    )
    return path


PROFILE: list[str] = []
"""`--profile DIR`: each run under cProfile, its stats in DIR/<name>.prof."""


def run(
    name: str, cwd: Path, config_path: Path, endpoint: str, env: dict[str, str], *extra: str
) -> dict[str, Any]:
    profile = ["-m", "cProfile", "-o", f"{PROFILE[0]}/{name}.prof"] if PROFILE else []
    command = [
        sys.executable,
        *profile,
        "-m",
        "connectors",
        "--config",
        str(config_path),
        "reconcile",
        "--instance",
        INSTANCE,
        "--endpoint-url",
        endpoint,
        "--dry-run",
        "--progress-interval",
        "15",
        "--read-timeout",
        "600",
        *extra,
    ]
    log(f"{name}: {' '.join(command[2 + len(profile) :])} (cwd {cwd})")
    started = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(
            command, cwd=cwd, env={**env, "PYTHONPATH": str(cwd)}, stdout=out, stderr=err
        )
        peak_kib = 0
        status_path = Path(f"/proc/{process.pid}/status")
        while process.poll() is None:
            peak_kib = max(peak_kib, vm_hwm_kib(status_path))
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    progress = [line for line in stderr.splitlines() if "reconcile progress:" in line]
    for line in progress:
        log(f"{name}: {line}")
    if process.returncode != 0:
        raise RuntimeError(f"{name} failed ({process.returncode}): {stderr[-2000:]}")
    summary = stdout.strip().splitlines()[-1]
    figures = dict(part.split("=", 1) for part in summary.split() if "=" in part)
    return {
        "name": name,
        "seconds": elapsed,
        "peak_rss_mib": peak_kib / 1024,
        "summary": summary,
        "phases": phase_ends(progress),
        "created": int(figures["created"]),
        "deleted": int(figures["deleted"]),
    }


def vm_hwm_kib(status: Path) -> int:
    """The process's peak RSS so far (VmHWM: of its image since exec, unlike `ru_maxrss`,
    which counts the benchmark's own pages a forked child shared before its exec)."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def phase_ends(progress: list[str]) -> dict[str, float]:
    """The elapsed seconds at the last progress line of each phase (a long run prints one as
    each phase ends)."""
    ends: dict[str, float] = {}
    for line in progress:
        words = line.split()
        phase = words[2]
        for word in words:
            if word.startswith("elapsed="):
                ends[phase] = float(word.removeprefix("elapsed=").removesuffix("s"))
    return ends


def baseline_tree(commit: str, directory: Path) -> Path:
    tree = directory / "baseline"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "archive", commit], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--drift", type=float, default=0.01)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--s3",
        default="moto",
        help="moto; gofakes3:PATH (that binary, memory backend); or a running server's URL",
    )
    parser.add_argument("--put-concurrency", type=int, default=4)
    parser.add_argument(
        "--listing-alone", action="store_true", help="also time a bare listing (boto3)"
    )
    parser.add_argument(
        "--baseline-commit",
        default="32bb465",
        help="the code before the keys-changelog reader (default: the merge it started from)",
    )
    parser.add_argument("--skip", action="append", default=[], help="state, output, baseline")
    parser.add_argument("--profile", metavar="DIR", help="run each reconcile under cProfile")
    args = parser.parse_args()
    if args.profile:
        PROFILE.append(str(Path(args.profile).resolve()))

    layout = Layout(args.keys, args.drift)
    expected = layout.expected()
    with tempfile.TemporaryDirectory(prefix="reconcile-bench-") as scratch:
        directory = Path(scratch)
        broker = PrivateBroker(directory / "kafka", heap="768m")
        (directory / "kafka").mkdir()
        bootstrap = broker.start(fresh=True)
        server = None
        try:
            log(f"broker {bootstrap}; filling the bucket with {args.keys} objects ({args.s3})")
            started = time.monotonic()
            if args.s3 == "moto":
                endpoint, server = moto_bucket(layout)
            elif args.s3.startswith("gofakes3:"):
                binary = args.s3.removeprefix("gofakes3:")
                endpoint, server = gofakes3_bucket(binary, layout, args.put_concurrency)
            else:
                endpoint = args.s3
                put_bucket(endpoint, layout, args.put_concurrency)
            log(f"bucket filled in {time.monotonic() - started:.0f} s")
            changelog = f"{APP_ID}-keys-changelog"
            output = f"{INSTANCE}.events"
            create_topics(bootstrap, args.partitions, [changelog, output])
            known = produce(bootstrap, changelog, changelog_records(layout))
            produce(bootstrap, output, output_records(layout))
            time.sleep(2)  # segments flushed to the page cache: sizes settle
            sizes = {
                "state": topic_bytes(directory / "kafka", changelog),
                "output": topic_bytes(directory / "kafka", output),
            }
            listing_s = None
            if args.listing_alone:
                listing_s, listed = listing_alone(endpoint)
                log(f"listing alone: {listed} keys in {listing_s:.1f} s")

            config_path = config(directory, args.partitions)
            env = private_broker_env(bootstrap)
            results = []
            if "state" not in args.skip:
                results.append(run("state", ROOT, config_path, endpoint, env))
            if "output" not in args.skip:
                results.append(
                    run("output", ROOT, config_path, endpoint, env, "--known-from", "output")
                )
            if "baseline" not in args.skip:
                tree = baseline_tree(args.baseline_commit, directory)
                results.append(run("baseline", tree, config_path, endpoint, env))
        finally:
            if isinstance(server, subprocess.Popen):
                server.terminate()
                server.wait(30)
            elif server is not None:
                server.stop()
            broker.stop()

    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"reconcile bench: keys={args.keys} drift={args.drift} (created {expected[0]}, deleted "
        f"{expected[1]}) s3={args.s3} partitions={args.partitions} "
        f"changelog_records={known} "
        + (f"listing_alone={listing_s:.1f}s " if listing_s is not None else "")
        + f"(bench process peak RSS {own:.0f} MiB)"
    )
    for result in results:
        source = "output" if result["name"] == "baseline" else result["name"]
        ok = (result["created"], result["deleted"]) == expected
        print(
            f"  {result['name']:<8} time={result['seconds']:.1f}s "
            f"peak_rss={result['peak_rss_mib']:.0f}MiB kafka_bytes={sizes[source]} "
            f"({sizes[source] / 2**20:.0f} MiB) drift={'as expected' if ok else 'WRONG'}: "
            f"{result['summary']}"
        )
        if result["phases"]:
            ends = ", ".join(f"{phase} until {at:.0f}s" for phase, at in result["phases"].items())
            print(f"           phases: {ends}")


if __name__ == "__main__":
    main()
