"""What an unauthenticated, gzip-encoded request costs the webhook bridge (issue 23 #6).

`python -m benchmarks.webhook_encoded [--requests 200] [--root DIR]` runs
`python -m connectors webhook` (from this checkout, or from `--root`, e.g. an older one
unpacked with `git archive`) as a subprocess with the `/hooks/s3` route on, and posts
`--requests` unsigned SNS-shaped bodies one after the other, each a gzip of 1 MiB that names
`Signature` and the allowed `TopicArn` (so the byte search before parsing lets it through)
and is mostly small JSON objects (the costliest to parse),
then the same count of identity-encoded 1 MiB bodies for comparison. It prints the answers
and the bridge's CPU time per request (user + system, from /proc, less what it used idle over
as long). No Kafka is needed: every request is refused before anything is published (the
bootstrap names a closed port). Figures for the notes, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

from benchmarks.harness import ROOT, free_port

TOPIC_ARN = "arn:aws:sns:eu-west-1:123456789012:uploads"
MiB = 1024 * 1024
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def attack_body() -> bytes:
    """Unsigned, SNS-shaped, 1 MiB: what the byte search admits to the JSON parser."""
    message = {
        "Type": "Notification",
        "TopicArn": TOPIC_ARN,
        "Signature": "forged",
        "SignatureVersion": "1",
        "SigningCertURL": "https://sns.eu-west-1.amazonaws.com/x.pem",
    }
    head = json.dumps(message).encode()[:-1] + b', "Padding": ['
    # Small objects: each one a call of the parser's duplicate-key hook (the costly shape).
    count = (MiB - len(head) - 2) // len(b'{"a":0},')
    return head + b'{"a":0},' * (count - 1) + b'{"a":0}]}'


def start_bridge(root: Path, port: int, workdir: Path) -> subprocess.Popen[bytes]:
    config = workdir / f"bridge-{port}.toml"
    config.write_text(
        f'[webhook]\nhost = "127.0.0.1"\nport = {port}\nraw_topic = "bench.webhook.encoded"\n'
        f'[webhook.routes.s3]\ntopic_arns = ["{TOPIC_ARN}"]\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WEBHOOK_", "STREAMS_"))}
    env |= {"KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}", "PYTHONPATH": str(root)}
    log = (workdir / f"bridge-{port}.log").open("ab")
    args = [sys.executable, "-m", "connectors", "--config", str(config), "webhook"]
    process = subprocess.Popen(args, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit(f"the bridge did not start; see {workdir}")


async def post(port: int, body: bytes, encoding: str | None) -> str:
    head = "POST /hooks/s3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    head += f"Content-Length: {len(body)}\r\nContent-Type: text/plain; charset=UTF-8\r\n"
    if encoding is not None:
        head += f"Content-Encoding: {encoding}\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head.encode() + b"\r\n" + body)
    await writer.drain()
    line = await reader.readline()
    await reader.read(-1)
    writer.close()
    return line.decode(errors="replace").strip() or "closed"


async def run(
    pid: int, port: int, body: bytes, encoding: str | None, n: int
) -> tuple[Counter[str], float, float]:
    answers: Counter[str] = Counter()
    cpu_before, started = cpu_s(pid), time.monotonic()
    for _ in range(n):
        answers[await post(port, body, encoding)] += 1
    return answers, cpu_s(pid) - cpu_before, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to run")
    args = parser.parse_args()
    plain = attack_body()
    encoded = gzip.compress(plain, compresslevel=9)
    with tempfile.TemporaryDirectory(prefix="webhook-encoded-") as tmp:
        port = free_port()
        process = start_bridge(args.root.resolve(), port, Path(tmp))
        try:
            time.sleep(2)  # let start-up's own work end before the idle reading
            idle_before, idle_started = cpu_s(process.pid), time.monotonic()
            time.sleep(5)
            idle_rate = (cpu_s(process.pid) - idle_before) / (time.monotonic() - idle_started)
            for name, body, encoding in (
                ("gzip", encoded, "gzip"),
                ("identity", plain, None),
            ):
                answers, cpu, wall = asyncio.run(
                    run(process.pid, port, body, encoding, args.requests)
                )
                per_request_ms = (cpu - idle_rate * wall) / args.requests * 1000
                print(
                    f"{args.root.resolve()}: {args.requests} unsigned /hooks/s3 requests, "
                    f"{name} ({len(body):,} bytes on the wire, {len(plain):,} decoded): "
                    f"answers {dict(answers)}; bridge CPU {per_request_ms:.2f} ms per request "
                    f"(idle {idle_rate * 1000:.1f} ms/s subtracted)",
                    flush=True,
                )
        finally:
            process.terminate()
            process.wait(60)


if __name__ == "__main__":
    main()
