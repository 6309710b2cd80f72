"""`python -m benchmarks.consumer`: fileevents at the speed of its handlers (issue 34).

One run, one broker, one topic of canonical events (written as the stream writes them:
`FileEvent.model_dump_json`, keyed by object key, CloudEvents headers), 8 partitions, many
keys, each key's events numbered in order. Each round is its own process and its own
consumer group, reading the whole topic:

* `floor`: a bare confluent-kafka loop and `json.loads` per record (no commits);
* `none`, `memory`, `redis`: `FileEvents` with a no-op async `"*"` handler, without a dedupe
  store, with `MemoryDedupeStore`, with `RedisDedupeStore` on a redis-server of its own;
* `sleep`: a handler that awaits 10 ms, at `--concurrency` (checks per-key order: never two
  events of one key at once, each key's events in their order);
* `restart` (with Redis, and without a store): a consumer killed with SIGKILL mid-run, then
  started again in the same group until every event is handled; counts what ran twice and
  what was in flight at the kill.

Events/s and CPU are measured from the first event done to the last (the group's join is
left out); CPU is the consumer process's, every thread, per event.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streams.core.event import FileEvent

ROUNDS = ("floor", "none", "memory", "redis", "sleep", "restart-redis", "restart-none")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pid_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the topic ---------------------------------------------------------------------------


def bench_events(count: int, keys: int) -> Iterator[FileEvent]:
    """`count` canonical events over `keys` keys, in the order `fill` writes them: key i's
    n-th event has sequencer n."""
    from streams.core.event import FileEvent

    per_key = [0] * keys
    for index in range(count):
        k = (index * 7919) % keys  # interleaved, every key about count/keys times
        seq = per_key[k]
        per_key[k] += 1
        key = f"tenant-{k % 97:02d}/photos/{k:06d}.jpg"
        yield FileEvent(
            id=f"s3:{key}:{seq}",
            type="created",
            key=key,
            bucket="uploads",
            size=1000 + index,
            etag='"9b2cf535f27731c974343645a3985328"',
            version_id=None,
            time=datetime(2026, 12, 1, tzinfo=UTC) + timedelta(milliseconds=index),
            sequencer=f"{seq:016d}",
            provider="s3",
            raw={
                "eventName": "ObjectCreated:Put",
                "awsRegion": "us-east-1",
                "s3": {"bucket": {"name": "uploads"}, "object": {"key": key, "size": 1000}},
            },
        )


def fill(bootstrap: str, topic: str, count: int, keys: int, partitions: int) -> None:
    """`count` canonical events over `keys` keys (`bench_events`), keyed by object key."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result()
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 20,
        }
    )
    for event in bench_events(count, keys):
        key = event.key
        headers = [
            ("ce_specversion", b"1.0"),
            ("ce_id", event.id.encode()),
            ("ce_type", b"storage.object.created"),
            ("ce_source", b"/storage-events/bench/s3"),
            ("ce_subject", key.encode()),
            ("content-type", b"application/json"),
        ]
        while True:
            try:
                producer.produce(
                    topic, event.model_dump_json().encode(), key.encode(), headers=headers
                )
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(60):
        raise RuntimeError("the events were not all written")


# -- the consumers (each a process of its own) --------------------------------------------


def run_floor(bootstrap: str, topic: str, count: int) -> dict[str, Any]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"floor-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    seen = 0
    first = cpu0 = 0.0
    try:
        while seen < count:
            for message in consumer.consume(num_messages=1000, timeout=0.2):
                if message.error() is not None:
                    raise RuntimeError(str(message.error()))
                if not seen:
                    first, cpu0 = time.perf_counter(), cpu_seconds()
                json.loads(message.value())
                seen += 1
        elapsed, cpu = time.perf_counter() - first, cpu_seconds() - cpu0
    finally:
        consumer.close()
    return {"events": seen, "seconds": elapsed, "cpu": cpu}


def run_fileevents(args: argparse.Namespace) -> dict[str, Any]:
    import redis.asyncio as redis

    from fileevents import FileEvents, MemoryDedupeStore, RedisDedupeStore, dedupe_id

    prefix = f"{args.group}:"

    async def main() -> dict[str, Any]:
        client = redis.Redis.from_url(args.redis) if args.redis else None
        store: Any = None
        if args.store == "memory":
            store = MemoryDedupeStore()
        elif args.store == "redis":
            assert client is not None
            store = RedisDedupeStore(client, prefix=prefix)
        events = FileEvents(
            bootstrap_servers=args.bootstrap,
            topic=args.topic,
            group_id=args.group,
            dedupe=store,
            dedupe_legacy_window=timedelta(0),  # a fresh deployment: no ids before scopes
            max_concurrency=args.concurrency,
        )
        violations = [0, 0]  # two of one key at once, a key's events out of order
        running: set[str] = set()
        last: dict[str, int] = {}
        log = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND) if args.log else None

        if args.handler == "noop":

            @events.on("*")
            async def noop(event: FileEvent) -> None:
                return None

        elif args.handler == "sleep":

            @events.on("*")
            async def sleep(event: FileEvent) -> None:
                key, seq = event.key, int(event.sequencer or "-1")
                if key in running:
                    violations[0] += 1
                if last.get(key, -1) >= seq:
                    violations[1] += 1
                running.add(key)
                last[key] = seq
                await asyncio.sleep(0.01)
                running.discard(key)

        else:  # "log": what ran, for the restart check (the line is the event's effect)

            @events.on("*")
            async def logged(event: FileEvent) -> None:
                assert log is not None
                os.write(log, f"S {event.id}\n".encode())
                await asyncio.sleep(0.001)
                os.write(log, f"E {event.id} {prefix}{dedupe_id(args.group, event)}\n".encode())

        task = asyncio.create_task(events.run())
        first = cpu0 = 0.0
        done = 0
        while not task.done():
            done = events.outcomes.total()
            if done and not first:
                first, cpu0 = time.perf_counter(), cpu_seconds()
            if args.count and done >= args.count:
                break
            await asyncio.sleep(0.005)
        elapsed, cpu = time.perf_counter() - first, cpu_seconds() - cpu0
        events.stop()
        await task
        if client is not None:
            await client.aclose()
        return {
            "events": done,
            "seconds": elapsed,
            "cpu": cpu,
            "outcomes": dict(events.outcomes),
            "concurrent_same_key": violations[0],
            "out_of_order": violations[1],
        }

    return asyncio.run(main())


def consumer_command(args: argparse.Namespace, **given: Any) -> list[str]:
    command = [sys.executable, "-m", "benchmarks.consumer", "--role", "consume"]
    merged = {
        "bootstrap": args.bootstrap,
        "topic": args.topic,
        "count": args.count,
        "concurrency": args.concurrency,
        **given,
    }
    for name, value in merged.items():
        if value is not None:
            command += [f"--{name}", str(value)]
    return command


def measured(command: list[str], package: Path | None = None) -> dict[str, Any]:
    """Run one round's process; `package`: the directory fileevents is imported from, ahead
    of the installed one (a baseline's)."""
    env = cwd = None
    if package is not None:  # run from elsewhere: `-m` puts the working directory first
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package), str(ROOT)])}
        cwd = tempfile.gettempdir()
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env, cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- redis-server --------------------------------------------------------------------------


class RedisServer:
    def __init__(self) -> None:
        executable = shutil.which("redis-server") or "/usr/bin/redis-server"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.dir = tempfile.mkdtemp(prefix="bench-redis-")
        self.process = subprocess.Popen(
            [executable, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--daemonize", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not answer")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def exists(self, keys: list[str]) -> list[bool]:
        import redis

        client = redis.Redis(port=self.port)
        pipeline = client.pipeline(transaction=False)
        for key in keys:
            pipeline.exists(key)
        return [bool(found) for found in pipeline.execute()]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


# -- the restart check ---------------------------------------------------------------------


def restart_check(args: argparse.Namespace, redis_server: RedisServer | None) -> dict[str, Any]:
    """Kill -9 a consumer once about half the events are handled, start it again, run until
    every event has run; count what ran twice, and what was in flight at the kill."""
    group = f"restart-{uuid.uuid4().hex[:8]}"
    log = Path(tempfile.mkdtemp(prefix="bench-restart-")) / "runs.log"
    store = "redis" if redis_server else "none"
    command = consumer_command(
        args,
        group=group,
        store=store,
        handler="log",
        log=log,
        count=0,
        redis=redis_server.url if redis_server else None,
    )
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def lines() -> list[str]:
        return log.read_text().splitlines() if log.exists() else []

    deadline = time.monotonic() + 300
    while sum(line.startswith("E ") for line in lines()) < args.count // 2:
        if time.monotonic() > deadline or first.poll() is not None:
            first.kill()
            raise RuntimeError("the first consumer did not get half way")
        time.sleep(0.05)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    before = lines()
    started = {line.split()[1] for line in before if line.startswith("S ")}
    ended = [line.split()[1:3] for line in before if line.startswith("E ")]
    ended_set = {event_id for event_id, _ in ended}
    in_flight = started - ended_set  # started, not finished: killed mid-handler
    unrecorded: set[str] = set()
    if redis_server is not None:  # finished, but not yet in the store at the kill
        found = redis_server.exists([key for _, key in ended])
        unrecorded = {event_id for (event_id, _), hit in zip(ended, found, strict=True) if not hit}
    second = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while True:
        ran = {line.split()[1] for line in lines() if line.startswith("E ")}
        if len(ran) >= args.count:
            break
        if time.monotonic() > deadline or second.poll() is not None:
            second.kill()
            raise RuntimeError(f"the restarted consumer handled {len(ran)} of {args.count}")
        time.sleep(0.1)
    time.sleep(1.5)  # a commit interval, for a last few duplicates to show
    second.send_signal(signal.SIGTERM)
    second.wait(60)
    after = [line.split()[1] for line in lines()[len(before) :] if line.startswith("E ")]
    twice = ended_set & set(after)
    return {
        "events": args.count,
        "handled_at_least_once": len(ended_set | set(after)),
        "before_kill": len(ended_set),
        "ran_twice": len(twice),
        "in_flight_at_kill": len(in_flight) + len(unrecorded),
        "ran_twice_not_in_flight": len(twice - in_flight - unrecorded)
        if redis_server is not None
        else None,
    }


# -- the run -------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def baseline_package(ref: str, into: Path) -> Path:
    """The directory to put on PYTHONPATH for fileevents as of git `ref`: its own
    distribution's `src/` (fileevents/src/fileevents), or, before the package split, the
    root of that ref's fileevents/ and streams/ (that version imported the stream's model)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "fileevents", "streams"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    if (into / "fileevents" / "src" / "fileevents" / "__init__.py").exists():
        return into / "fileevents" / "src"
    return into


def table(results: dict[str, dict[str, Any]]) -> str:
    floor = results.get("floor")
    names = {
        "floor": "bare confluent-kafka loop + `json.loads` (the floor)",
        "none": "`fileevents`, no dedupe store, no-op handler",
        "memory": "`fileevents`, `MemoryDedupeStore`, no-op handler",
        "redis": "`fileevents`, `RedisDedupeStore`, no-op handler",
        "sleep": "`fileevents`, a 10 ms handler",
    }
    for name in list(names):
        for key in results:
            if key.startswith(f"{name}@"):
                names[key] = f"{names[name]}, as of {key.split('@', 1)[1]}"
    order = sorted(names, key=lambda key: (list(names).index(key.split("@")[0]), "@" not in key))
    rows = ["| consumer | events/s | x floor | CPU µs per event |", "|---|---|---|---|"]
    for name in order:
        label = names[name]
        result = results.get(name)
        if result is None:
            continue
        if not result["events"]:  # stopped before its first event (e.g. SIGTERM)
            rows.append(f"| {label} | no event handled | - | - |")
            continue
        rate = result["events"] / result["seconds"]
        ratio = f"{rate / (floor['events'] / floor['seconds']):.2f}x" if floor else "-"
        cpu = result["cpu"] / result["events"] * 1e6
        extra = ""
        if name.startswith("redis") and "redis_cpu" in result:
            extra = f", plus {result['redis_cpu'] / result['events'] * 1e6:.0f} in Redis"
        rows.append(f"| {label} | {rate:,.0f} | {ratio} | {cpu:.1f}{extra} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", default="bench", choices=["bench", "consume", "floor"])
    parser.add_argument("--bootstrap")
    parser.add_argument("--topic")
    parser.add_argument("--group")
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=12_494)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--store", default="none", choices=["none", "memory", "redis"])
    parser.add_argument("--handler", default="noop", choices=["noop", "sleep", "log"])
    parser.add_argument("--redis")
    parser.add_argument("--log")
    parser.add_argument("--rounds", default=",".join(ROUNDS), help=f"of {','.join(ROUNDS)}")
    parser.add_argument(
        "--baseline",
        metavar="GIT_REF",
        help="also run the none/memory/redis rounds with fileevents as of GIT_REF (its "
        "package from `git archive`, first on PYTHONPATH), each right before the working "
        "tree's: before and after side by side in one run",
    )
    args = parser.parse_args()

    if args.role == "floor":
        print(json.dumps(run_floor(args.bootstrap, args.topic, args.count)))
        return
    if args.role == "consume":
        print(json.dumps(run_fileevents(args)))
        return

    from benchmarks.harness import bootstrap_servers, finish_on_sigterm

    finish_on_sigterm()
    args.bootstrap = args.bootstrap or bootstrap_servers()
    args.topic = args.topic or f"bench.consumer.{uuid.uuid4().hex[:8]}"
    rounds = [name for name in args.rounds.split(",") if name]
    started = time.perf_counter()
    print(
        f"writing {args.count:,} events over {args.keys:,} keys and {args.partitions} "
        f"partitions to {args.topic} at {args.bootstrap}",
        flush=True,
    )
    fill(args.bootstrap, args.topic, args.count, args.keys, args.partitions)
    baseline: Path | None = None
    if args.baseline:
        baseline = baseline_package(args.baseline, Path(tempfile.mkdtemp(prefix="fileevents-")))
        print(f"baseline: fileevents as of {args.baseline}, from {baseline}", flush=True)
    redis_server = RedisServer() if {"redis", "restart-redis"} & set(rounds) else None
    results: dict[str, dict[str, Any]] = {}
    try:
        for name in rounds:
            group = f"bench-{name}-{uuid.uuid4().hex[:8]}"
            if name == "floor":
                command = [sys.executable, "-m", "benchmarks.consumer", "--role", "floor",
                           "--bootstrap", args.bootstrap, "--topic", args.topic,
                           "--count", str(args.count)]  # fmt: skip
                results[name] = measured(command)
            elif name in ("none", "memory", "redis"):
                variants: list[tuple[str, Path | None]] = [(name, None)]
                if baseline is not None:
                    variants.insert(0, (f"{name}@{args.baseline}", baseline))
                for variant, (label, package) in enumerate(variants):
                    redis_before = pid_cpu_seconds(redis_server.process.pid) if redis_server else 0
                    results[label] = measured(
                        consumer_command(
                            args,
                            group=f"{group}-{variant}",  # a group per variant: each reads all
                            store=name,
                            handler="noop",
                            redis=redis_server.url if name == "redis" and redis_server else None,
                        ),
                        package,
                    )
                    if name == "redis" and redis_server:
                        used = pid_cpu_seconds(redis_server.process.pid) - redis_before
                        results[label]["redis_cpu"] = used
                    if package is not None:
                        print(f"{label}: {json.dumps(results[label])}", flush=True)
            elif name == "sleep":
                results[name] = measured(
                    consumer_command(args, group=group, store="none", handler="sleep")
                )
            elif name == "restart-redis":
                results[name] = restart_check(args, redis_server)
            elif name == "restart-none":
                results[name] = restart_check(args, None)
            print(f"{name}: {json.dumps(results[name])}", flush=True)
    finally:
        if redis_server is not None:
            redis_server.stop()
    print()
    print(table(results))
    sleep = results.get("sleep")
    if sleep:
        print(
            f"\n10 ms handler, max_concurrency {args.concurrency}: "
            f"{sleep['events'] / sleep['seconds']:,.0f} events/s; two events of one key at "
            f"once: {sleep['concurrent_same_key']}, a key's events out of order: "
            f"{sleep['out_of_order']}"
        )
    for name in ("restart-redis", "restart-none"):
        check = results.get(name)
        if check:
            print(f"{name}: {json.dumps(check)}")
    print(f"\n{time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
