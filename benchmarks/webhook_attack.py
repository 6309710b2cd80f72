"""The webhook bridge's memory under stalled bodies: issue 13 item 7's attack, measured.

`python -m benchmarks.webhook_attack [--connections 300]` runs `python -m connectors webhook`
as a subprocess (b2 route: its HMAC covers the body, so a request with a well-formed signature
header must be read before it can be refused), twice: with the shipped limits, and with the
limits lifted as far as the configuration allows (what the bridge did before they existed).
Each time it opens N connections that announce 1 MiB, send 1 MiB minus one byte and stall,
and prints the bridge's resident memory (VmRSS) before, at its peak, and after the attackers
were answered and closed, with how they were answered and how long a signed delivery sent
during the attack took. Figures for the notes, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, bootstrap_servers, free_port

SECRET = "bench-b2-secret"
MiB = 1024 * 1024


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def start_bridge(bootstrap: str, port: int, limits: str, workdir: Path) -> subprocess.Popen[bytes]:
    config = workdir / f"bridge-{port}.toml"
    config.write_text(
        f'[webhook]\nhost = "127.0.0.1"\nport = {port}\nraw_topic = "bench.webhook.attack"\n'
        f'{limits}\n[webhook.routes.b2]\nsecret_env = "BENCH_B2"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WEBHOOK_", "STREAMS_"))}
    env |= {"KAFKA_BOOTSTRAP_SERVERS": bootstrap, "BENCH_B2": SECRET}
    log = (workdir / f"bridge-{port}.log").open("ab")
    args = [sys.executable, "-m", "connectors", "--config", str(config), "webhook"]
    process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as answer:
                if json.loads(answer.read()).get("kafka"):
                    return process
        except (OSError, ValueError):
            time.sleep(0.2)
    process.kill()
    raise SystemExit(f"the bridge did not start; see {workdir}")


async def stalled(port: int, results: Counter[str]) -> None:
    head = (
        "POST /hooks/b2 HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n"
        f"X-Bz-Event-Notification-Signature: v1={'0' * 64}\r\n\r\n"
    ).encode()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head + b"x" * (MiB - 1))
        await writer.drain()
        answer = await reader.read(-1)
        results[answer.split(b"\r\n", 1)[0].decode(errors="replace") or "closed"] += 1
        writer.close()
    except OSError as exc:
        results[type(exc).__name__] += 1


async def signed_delivery(port: int) -> tuple[int, float]:
    body = b'{"events":[]}'
    signature = "v1=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    request = (
        "POST /hooks/b2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Content-Length: {len(body)}\r\nX-Bz-Event-Notification-Signature: {signature}\r\n\r\n"
    ).encode() + body
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    line = await reader.readline()
    writer.close()
    return int(line.split()[1]), time.monotonic() - started


async def attack(pid: int, port: int, connections: int, hold_s: float) -> dict[str, Any]:
    before = rss_mb(pid)
    results: Counter[str] = Counter()
    attackers = [asyncio.ensure_future(stalled(port, results)) for _ in range(connections)]
    peak = before
    started = time.monotonic()
    legit: tuple[int, float] | None = None
    while not all(task.done() for task in attackers) and time.monotonic() - started < hold_s:
        peak = max(peak, rss_mb(pid))
        if legit is None and time.monotonic() - started > 2:
            legit = await signed_delivery(port)
        await asyncio.sleep(0.2)
    for task in attackers:
        task.cancel()
    await asyncio.gather(*attackers, return_exceptions=True)
    await asyncio.sleep(2)
    return {
        "before": before,
        "peak": peak,
        "after": rss_mb(pid),
        "answers": dict(results),
        "legit": legit,
        "seconds": time.monotonic() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--hold", type=float, default=60.0, help="longest wait per wave, s")
    parser.add_argument("--waves", type=int, default=2, help="attacks one after the other")
    args = parser.parse_args()
    bootstrap = bootstrap_servers()
    runs = {
        "shipped limits": "",
        "limits lifted": (
            "max_bodies_bytes = 10737418240\nbody_timeout_s = 3600\nidle_timeout_s = 3600\n"
            "max_connections = 100000\n"
        ),
    }
    with tempfile.TemporaryDirectory(prefix="webhook-attack-") as tmp:
        for name, limits in runs.items():
            port = free_port()
            process = start_bridge(bootstrap, port, limits, Path(tmp))
            try:
                for wave in range(1, args.waves + 1):
                    figures = asyncio.run(attack(process.pid, port, args.connections, args.hold))
                    legit = figures["legit"]
                    print(
                        f"{name}, wave {wave}: {args.connections} stalled 1 MiB bodies; bridge "
                        f"RSS {figures['before']:.0f} MB before, {figures['peak']:.0f} MB peak, "
                        f"{figures['after']:.0f} MB after ({figures['seconds']:.0f} s); "
                        f"answers {figures['answers']}; a signed delivery during the attack: "
                        + (f"{legit[0]} in {legit[1] * 1000:.0f} ms" if legit else "not sent"),
                        flush=True,
                    )
            finally:
                process.terminate()
                process.wait(60)


if __name__ == "__main__":
    main()
