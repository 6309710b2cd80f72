"""The webhook bridge against a bare aiohttp handler doing the same produce (`make bench`).

    python -m benchmarks.webhook [--seconds 10] [--concurrency 32] [--rate 1000]

On the real broker (KAFKA_BOOTSTRAP_SERVERS, else the local broker of `make kafka`), two HTTP
servers, each a subprocess of its own:

1. bare: an aiohttp handler that reads the body, produces it with the raw-topic headers and
   the bridge's producer settings (`connectors.publisher.producer_settings`: acks=all,
   idempotent), awaits the acknowledgement and answers 202; no authentication, no metrics,
   no access log;
2. bridge: `python -m connectors --config <file> webhook`, route `/hooks/minio` turned on by
   `[webhook.routes.minio] secret_env` (the MinIO target's bearer token, from the
   environment), everything else as configured by default.

The load generator is an aiohttp client in a third process, sending MinIO webhook deliveries
(`Authorization: Bearer <token>`, a ~1.1 KB S3-style event body) over a fixed number of
connections: after a 1 s warm-up, (a) closed loop: each connection sends its next request
when the previous one is answered: req/s, p50, p99; (b) open loop: a fixed offered rate
whatever the answers do, latency from each request's scheduled send time, so a stalled
server is not hidden by a stalled client (a request due while every connection is busy
waits, and that counts): achieved rate, p50, p99, max. Every run has a fresh raw topic
(4 partitions); after it the topic's end offsets must add up to the 202 answers (warm-up
included), and the line says so.

The broker, the server and the load generator share the machine's few cores, and so does
whatever else runs there: each run also prints the CPU the server and the load generator
spent per request, and how busy the machine's cores were (server, load generator, a local
broker, other processes), so that a run disturbed by other work shows as such.

The target: the bridge's p99 < 25 ms at 1,000 req/s with every publish acknowledged.
A measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from importlib.metadata import version
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, bootstrap_servers, free_port, kafka_args, kafka_settings
from streams.kafka_settings import KafkaSettings

PARTITIONS = 4
SOURCE = "minio"
TOKEN_ENV = "BENCH_MINIO_TOKEN"
TOKEN = "bench-minio-auth-token-6f1d2c9a"  # a throwaway token
BODIES = 256
WARMUP_S = 1.0
TARGET_RATE = 1000.0
TARGET_P99_MS = 25.0
# What a MinIO webhook target sends besides Host and Content-Length (Go's net/http client).
REQUEST_HEADERS = {
    "Authorization": f"Bearer {TOKEN}",
    "Content-Type": "application/json",
    "User-Agent": "Go-http-client/1.1",
    "Accept-Encoding": "gzip",
}


def minio_body(n: int) -> bytes:
    """A MinIO webhook delivery (`EventName`, `Key`, one S3-style record) for object n."""
    key = f"photos/2026/11/30/IMG_{n:05d}.jpg"
    record = {
        "eventVersion": "2.0",
        "eventSource": "minio:s3",
        "awsRegion": "",
        "eventTime": "2026-11-30T03:00:00.000Z",
        "eventName": "s3:ObjectCreated:Put",
        "userIdentity": {"principalId": "minioadmin"},
        "requestParameters": {
            "principalId": "minioadmin",
            "region": "",
            "sourceIPAddress": "10.0.0.7",
        },
        "responseElements": {
            "x-amz-id-2": "dd9025bab4ad464b049177c95eb6ebf374d3b3fd1af9251148b658df7ac2e3e8",
            "x-amz-request-id": f"1793B0C0AF{n:06X}",
            "x-minio-deployment-id": "1bc4c3a6-6c2f-4a47-9d64-5cbb4d0a1f5e",
            "x-minio-origin-endpoint": "http://10.0.0.5:9000",
        },
        "s3": {
            "s3SchemaVersion": "1.0",
            "configurationId": "Config",
            "bucket": {
                "name": "bench",
                "ownerIdentity": {"principalId": "minioadmin"},
                "arn": "arn:aws:s3:::bench",
            },
            "object": {
                "key": key.replace("/", "%2F"),
                "size": 2048 + n,
                "eTag": f"{n:032x}",
                "contentType": "image/jpeg",
                "userMetadata": {"content-type": "image/jpeg"},
                "sequencer": f"17A9A6E0A1{n:06X}",
            },
        },
        "source": {
            "host": "10.0.0.7",
            "port": "",
            "userAgent": "MinIO (linux; amd64) minio-go/v7.0.70",
        },
    }
    delivery = {"EventName": "s3:ObjectCreated:Put", "Key": f"bench/{key}", "Records": [record]}
    return json.dumps(delivery).encode()


# ------------------------------------------------------------------------------ processes


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (Linux /proc; 0.0 where there is none)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def broker_pid(bootstrap: str) -> int:
    """The pid of the local process listening on the (first) bootstrap port, 0 if none is
    found (a remote broker, or no permission to look): its CPU is then not told apart."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1", "[::1]") or not port.isdigit():
        return 0
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == int(port):
                inodes.add(f"socket:[{fields[9]}]")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                        return int(pid)
    return 0


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all cores (Linux /proc/stat)."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return 0.0, 0.0
    ticks = [int(field) for field in first[1:9]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - idle) / tick, sum(ticks) / tick


def serve_bare(bootstrap: str, topic: str, port: int) -> None:
    """The baseline: read, produce with the raw-topic headers, await the ack, answer 202."""
    from aiohttp import web
    from aiokafka import AIOKafkaProducer

    from connectors.publisher import SECRET_HEADERS, producer_settings

    timeout_s = 10.0
    producers: list[AIOKafkaProducer] = []

    async def hook(request: web.Request) -> web.Response:
        body = await request.read()
        headers = [
            ("source", request.match_info["source"].encode()),
            ("transport", b"webhook"),
            ("delivery-id", uuid.uuid4().hex.encode()),
            ("received-at", f"{time.time():.6f}".encode()),
        ]
        for name, value in request.headers.items():
            lower = name.lower()
            if lower not in SECRET_HEADERS:
                headers.append((f"header.{lower}", value.encode("utf-8", errors="replace")))
        future = await producers[0].send(topic, body, headers=headers)
        await future
        return web.json_response({"accepted": True}, status=202)

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "kafka": True})

    async def lifecycle(app: web.Application) -> Any:
        producer = AIOKafkaProducer(**producer_settings(kafka_settings(bootstrap), timeout_s))
        await producer.start()
        producers.append(producer)
        yield
        await producer.stop()

    app = web.Application(client_max_size=1024 * 1024 + 1)
    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/hooks/{source}", hook)
    app.router.add_get("/healthz", healthz)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


class Server:
    """The bare handler or the bridge as a subprocess, on a fresh raw topic."""

    def __init__(self, kind: str, bootstrap: str, workdir: Path) -> None:
        self.kind, self.bootstrap = kind, bootstrap
        self.topic = f"bench-webhook-{kind}-{uuid.uuid4().hex[:8]}"
        self.port = free_port()
        self.log = workdir / f"{kind}-{self.topic}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("WEBHOOK_", "STREAMS_"))}
        env["KAFKA_BOOTSTRAP_SERVERS"] = bootstrap
        if kind == "bridge":
            config = workdir / f"{self.topic}.toml"
            config.write_text(
                f'[webhook]\nhost = "127.0.0.1"\nport = {self.port}\n'
                f'raw_topic = "{self.topic}"\n'
                f'[webhook.routes.{SOURCE}]\nsecret_env = "{TOKEN_ENV}"\n'
            )
            env[TOKEN_ENV] = TOKEN
            args = [sys.executable, "-m", "connectors", "--config", str(config), "webhook"]
        else:
            args = [sys.executable, "-m", "benchmarks.webhook", "--serve-bare"]
            args += [f"{bootstrap},{self.topic},{self.port}"]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                raise SystemExit(f"{self.kind} exited with {code}:\n{self.tail()}")
            try:
                url = f"http://127.0.0.1:{self.port}/healthz"
                with urllib.request.urlopen(url, timeout=1) as response:
                    if json.loads(response.read()).get("kafka"):
                        return
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        raise SystemExit(f"{self.kind} not ready after {timeout_s:.0f} s:\n{self.tail()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])


async def create_topic(bootstrap: str, topic: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    from streams.engine.topics import RAW_MAX_MESSAGE_BYTES

    admin = AIOKafkaAdminClient(**kafka_args(bootstrap))
    await admin.start()
    try:
        config = {"max.message.bytes": str(RAW_MAX_MESSAGE_BYTES)}
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1, topic_configs=config)])
    finally:
        await admin.close()


async def delete_topic(bootstrap: str, topic: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**kafka_args(bootstrap))
    await admin.start()
    try:
        await admin.delete_topics([topic])
    finally:
        await admin.close()


async def records_on(kafka: KafkaSettings | str, topic: str) -> int:
    """How many records the topic (made by `create_topic`: PARTITIONS partitions) holds: its
    end offsets' sum. `kafka`: the connection, or a bootstrap address (`kafka_args`)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    args = kafka.aiokafka_args() if isinstance(kafka, KafkaSettings) else kafka_args(kafka)
    consumer = AIOKafkaConsumer(**args, group_id=None)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(PARTITIONS)])
        return sum(ends.values())
    finally:
        await consumer.stop()


# ------------------------------------------------------------------------- load generator


async def generate(
    url: str,
    mode: str,
    concurrency: int,
    rate: float,
    seconds: float,
    server_pid: int,
    broker: int,
) -> dict[str, Any]:
    """Warm up, then one closed- or open-loop phase; the figures as a dict."""
    import aiohttp

    bodies = [minio_body(n) for n in range(BODIES)]
    statuses: Counter[str] = Counter()
    latencies: list[float] = []
    clock = time.perf_counter
    # Both loops keep `concurrency` connections (like wrk2): in the open loop a request due
    # while all are busy waits for one, and that wait counts in its latency.
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(
        connector=connector,
        headers=REQUEST_HEADERS,
        skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent"),
        timeout=aiohttp.ClientTimeout(total=30),
    ) as session:
        post = session.post

        async def send(n: int, since: float, record: bool) -> None:
            try:
                async with post(url, data=bodies[n % BODIES]) as response:
                    await response.read()
                    status = str(response.status)
            except (aiohttp.ClientError, TimeoutError) as exc:
                status = type(exc).__name__
            if record:
                latencies.append(clock() - since)
            statuses[status] += 1

        async def closed(length: float, record: bool) -> None:
            deadline = clock() + length

            async def connection(first: int) -> None:
                n = first
                while (now := clock()) < deadline:
                    await send(n, now, record)
                    n += concurrency

            await asyncio.gather(*(connection(i) for i in range(concurrency)))

        async def open_(length: float, record: bool) -> None:
            total = int(rate * length)
            start = clock() + 0.005
            tasks = set()
            for n in range(total):
                due = start + n / rate
                delay = due - clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(send(n, due, record))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.gather(*tasks)

        phase = closed if mode == "closed" else open_
        await phase(WARMUP_S, False)
        warmup = dict(statuses)
        statuses.clear()
        server_cpu, own_cpu, started = cpu_seconds(server_pid), time.process_time(), clock()
        broker_cpu, (busy, total) = cpu_seconds(broker), machine_busy()
        await phase(seconds, True)
        elapsed = clock() - started
        server_cpu = cpu_seconds(server_pid) - server_cpu
        own_cpu = time.process_time() - own_cpu
        broker_cpu = cpu_seconds(broker) - broker_cpu
        busy_after, total_after = machine_busy()
    cores = os.cpu_count() or 1
    latencies.sort()
    count = len(latencies)
    return {
        "warmup": warmup,
        "statuses": dict(statuses),
        "elapsed": elapsed,
        "count": count,
        "p50": latencies[count // 2] if count else 0.0,
        "p99": latencies[min(count - 1, int(count * 0.99))] if count else 0.0,
        "max": latencies[-1] if count else 0.0,
        "server_cpu": server_cpu,
        "load_cpu": own_cpu,
        "broker_cpu": broker_cpu if broker else None,
        # busy cores of the whole machine over the phase (its ticks count every core)
        "machine_busy": (busy_after - busy) / max(total_after - total, 1e-9) * cores,
    }


def load(
    url: str,
    mode: str,
    concurrency: int,
    rate: float,
    seconds: float,
    server_pid: int,
    broker: int,
) -> dict[str, Any]:
    """The load generator in a process of its own (it must not share the server's loop)."""
    spec = json.dumps([url, mode, concurrency, rate, seconds, server_pid, broker])
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.webhook", "--generate", spec],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        check=True,
        timeout=seconds + 120,
    )
    figures: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures


# ---------------------------------------------------------------------------------- runs


def measure(
    kind: str,
    bootstrap: str,
    workdir: Path,
    mode: str,
    concurrency: int,
    rate: float,
    seconds: float,
) -> tuple[str, dict[str, Any]]:
    server = Server(kind, bootstrap, workdir)
    asyncio.run(create_topic(bootstrap, server.topic))
    try:
        server.wait_ready()
        url = f"http://127.0.0.1:{server.port}/hooks/{SOURCE}"
        broker = broker_pid(bootstrap)
        figures = load(url, mode, concurrency, rate, seconds, server.process.pid, broker)
    finally:
        server.stop()
    held = asyncio.run(records_on(bootstrap, server.topic))
    asyncio.run(delete_topic(bootstrap, server.topic))
    accepted = figures["statuses"].get("202", 0)
    answered_202 = accepted + figures["warmup"].get("202", 0)
    others = Counter({k: v for k, v in figures["statuses"].items() if k != "202"})
    others.update({k: v for k, v in figures["warmup"].items() if k != "202"})
    count, elapsed = figures["count"], figures["elapsed"]
    per_request = 1000 / max(count, 1)
    cores = {"server": figures["server_cpu"], "load generator": figures["load_cpu"]}
    if figures["broker_cpu"] is not None:
        cores["broker"] = figures["broker_cpu"]
    cores = {name: cpu / elapsed for name, cpu in cores.items()}
    rest = max(figures["machine_busy"] - sum(cores.values()), 0.0)
    cores["other processes" if "broker" in cores else "broker and other processes"] = rest
    speed = f"{count / elapsed:>6,.0f} req/s" + (" achieved" if mode == "open" else "")
    line = (
        f"  {kind:<6} {speed}  p50 {figures['p50'] * 1000:5.1f} ms  "
        f"p99 {figures['p99'] * 1000:5.1f} ms  max {figures['max'] * 1000:6.1f} ms\n"
        f"         {accepted:,} x 202"
        + (f", other answers {dict(others)}" if others else "")
        + f"; topic holds {held:,} records, 202 answers incl. warm-up {answered_202:,}: "
        + ("ok" if held == answered_202 else "MISMATCH")
        + f"\n         CPU per request: server {figures['server_cpu'] * per_request:.3f} ms, "
        f"load generator {figures['load_cpu'] * per_request:.3f} ms; busy cores "
        f"{figures['machine_busy']:.2f} of {os.cpu_count()} ("
        + ", ".join(f"{name} {used:.2f}" for name, used in cores.items())
        + ")"
    )
    figures["all_acknowledged"] = not others and held == answered_202
    figures["other_cores"] = rest
    return line, figures


def run(
    bootstrap: str,
    seconds: float = 10.0,
    concurrency: int = 32,
    rate: float = TARGET_RATE,
) -> list[str]:
    """Run every measurement; print each line as it comes and return them all."""
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.extend(text.splitlines())

    from connectors.publisher import producer_settings

    producer = producer_settings(kafka_settings(bootstrap), 10.0)
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    say(
        f"# webhook bridge vs bare aiohttp handler, {now}, {platform.node()}: "
        f"{os.cpu_count()} cores ({platform.machine()}, load average "
        f"{os.getloadavg()[0]:.2f} at start) shared by broker, server and load generator\n"
        f"# broker {bootstrap}; Python {platform.python_version()}, aiohttp "
        f"{version('aiohttp')}, aiokafka {version('aiokafka')}; producer acks="
        f"{producer['acks']}, idempotent, linger_ms={producer['linger_ms']} (producer_settings)\n"
        f"# POST /hooks/{SOURCE}, a {len(minio_body(0)):,} B MinIO event: the bridge checks "
        f"the MinIO bearer token ([webhook.routes.{SOURCE}] secret_env = {TOKEN_ENV}) and "
        f"logs each request (aiohttp access log); the bare handler checks and logs nothing\n"
        f"# each run: a fresh topic ({PARTITIONS} partitions), {WARMUP_S:.0f} s warm-up, "
        f"then the measured phase"
    )
    results: dict[tuple[str, str], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-webhook-") as tmp:
        workdir = Path(tmp)
        say(f"closed loop, {concurrency} connections, {seconds:.0f} s:")
        for kind in ("bare", "bridge"):
            line, results[kind, "closed"] = measure(
                kind, bootstrap, workdir, "closed", concurrency, rate, seconds
            )
            say(line)
        say(
            f"open loop, {rate:,.0f} req/s offered over {concurrency} connections, "
            f"{seconds:.0f} s (latency from each request's scheduled send time):"
        )
        for kind in ("bare", "bridge"):
            line, results[kind, "open"] = measure(
                kind, bootstrap, workdir, "open", concurrency, rate, seconds
            )
            say(line)
    bare, bridge = results["bare", "closed"], results["bridge", "closed"]
    ratio = (bridge["count"] / bridge["elapsed"]) / max(bare["count"] / bare["elapsed"], 1e-9)
    cpu = (bridge["server_cpu"] / max(bridge["count"], 1)) / max(
        bare["server_cpu"] / max(bare["count"], 1), 1e-9
    )
    say(
        f"bridge / bare at {concurrency} connections: req/s {ratio:.2f}, "
        f"server CPU per request {cpu:.2f}"
    )
    target = results["bridge", "open"]
    if rate == TARGET_RATE:
        p99 = target["p99"] * 1000
        met = p99 < TARGET_P99_MS and target["all_acknowledged"]
        say(
            f"target bridge p99 < {TARGET_P99_MS:.0f} ms at {TARGET_RATE:,.0f} req/s, every "
            f"publish acknowledged: {'met' if met else 'MISSED'} (p99 {p99:.1f} ms, "
            + ("all 202 and on the topic" if target["all_acknowledged"] else "NOT all 202")
            + f"; other processes used {target['other_cores']:.2f} cores meanwhile)"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each run")
    parser.add_argument("--concurrency", type=int, default=32, help="connections (both loops)")
    parser.add_argument("--rate", type=float, default=TARGET_RATE, help="open-loop req/s")
    parser.add_argument("--serve-bare", help=argparse.SUPPRESS)
    parser.add_argument("--generate", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bare:
        bootstrap, topic, port = args.serve_bare.rsplit(",", 2)
        serve_bare(bootstrap, topic, int(port))
        return 0
    if args.generate:
        figures = asyncio.run(generate(*json.loads(args.generate)))
        print(json.dumps(figures))
        return 0
    run(bootstrap_servers(), args.seconds, args.concurrency, args.rate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
