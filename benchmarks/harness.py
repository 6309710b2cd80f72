"""What the benchmarks share: the broker to use, private brokers, worker processes, metrics.

Benchmarks are scripts that print figures, not tests; they import nothing from `tests/`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from dev.kafka.private import LOCAL_KAFKA, PrivateBroker
from streams.kafka_settings import KafkaSettings

__all__ = ["PrivateBroker"]

ROOT = Path(__file__).resolve().parent.parent
FAUST = Path(sys.executable).with_name("faust")


def bootstrap_servers() -> str:
    given = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if given:
        return given
    started = subprocess.run(
        [sys.executable, str(LOCAL_KAFKA), "start"],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    return started.stdout.strip().splitlines()[-1]


def kafka_settings(bootstrap: str) -> KafkaSettings:
    """The connection to `bootstrap`, with TLS and SASL from the `KAFKA_*` environment
    variables the worker the benchmark starts reads too (streams.kafka_settings)."""
    return KafkaSettings.from_environ(bootstrap_servers=bootstrap)


def kafka_args(bootstrap: str) -> dict[str, Any]:
    """aiokafka keyword arguments for `bootstrap` (`kafka_settings`)."""
    return kafka_settings(bootstrap).aiokafka_args()


def private_broker_env(bootstrap: str, **extra: str) -> dict[str, str]:
    """This process's environment for a worker on a private (plaintext) broker: every other
    `KAFKA_*` connection setting dropped, so a shell that sourced a secured broker's
    `client.env` does not point the run's worker at TLS or SASL its broker does not have."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("KAFKA_")}
    return {**env, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, **extra}


def finish_on_sigterm() -> None:
    """SIGTERM (a `timeout`, a test's kill of the run) ends the run as Ctrl-C would, through
    its `finally` blocks: the worker and the private brokers it started are stopped, not left
    running with their directories."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class WorkerProcess:
    """`faust -A streams worker` as a subprocess."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [str(FAUST), "-A", "streams", "worker", "-l", "info"],
                # `python -m` (the stage child) puts its working directory first on sys.path:
                # another checkout's worker (BENCH_WORKER_TREE) runs from that checkout.
                cwd=self.env.get("BENCH_WORKER_TREE") or ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def ready(self) -> bool:
        url = f"http://127.0.0.1:{self.env['STREAMS_WEB_PORT']}/ready"
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def why_not_ready(self, log_lines: int = 40) -> str:
        """What `/ready` answers now (or why it does not), and the log's last lines: what a
        run that gave up waiting prints, since its directory may be gone when it is read."""
        url = f"http://127.0.0.1:{self.env['STREAMS_WEB_PORT']}/ready"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                answer = f"{response.status} {response.read().decode(errors='replace')}"
        except urllib.error.HTTPError as exc:
            answer = f"{exc.code} {exc.read().decode(errors='replace')}"
        except OSError as exc:
            answer = f"no answer ({exc})"
        try:
            tail = self.log.read_text(errors="replace").splitlines()[-log_lines:]
        except OSError:
            tail = ["(no log)"]
        return f"/ready: {answer}\nthe last {len(tail)} lines of {self.log}:\n" + "\n".join(
            line[:300] for line in tail
        )

    def wait_ready(self, timeout_s: float = 180, allow_exit: bool = False) -> None:
        """Wait for `/ready`; a worker that exits first is an error, unless `allow_exit` (a
        failpoint may kill it before it is ready: a crash, not a hang)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                if allow_exit:
                    return
                raise SystemExit(
                    f"the worker exited with {self.process.returncode}; see {self.log}"
                )
            if self.ready():
                return
            time.sleep(0.05)
        raise SystemExit(f"worker not ready after {timeout_s:.0f} s\n{self.why_not_ready()}")

    def kill(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise SystemExit(f"the worker died by itself ({self.process.returncode}); {self.log}")
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def metric(port: int | str, name: str) -> float:
    """The sum of a worker's samples of `name` (all labels) from its `/metrics`."""
    return metric_sums(port, name)[name]


def metric_sums(port: int | str, *names: str) -> dict[str, float]:
    """Per name, the sum of its samples (all labels), from one read of `/metrics` (a page
    costs the worker a few ms: a benchmark polling it reads it once per poll)."""
    sums = dict.fromkeys(names, 0.0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return sums
    for line in text.splitlines():
        name = line.partition("{")[0].partition(" ")[0]
        if name in sums:
            sums[name] += float(line.rpartition(" ")[2])
    return sums


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants, now (Linux /proc: each thread's children)."""
    found = [pid]
    for parent in found:
        for task in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                found.extend(int(child) for child in task.read_text().split())
            except OSError:  # the thread or process ended meanwhile
                continue
    return found
