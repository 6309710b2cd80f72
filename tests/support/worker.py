"""Run `faust -A streams worker` as a real subprocess with a test configuration."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streams.config import Settings

ROOT = Path(__file__).resolve().parents[2]
FAUST = Path(sys.executable).with_name("faust")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Topology:
    """Unique names for one test, so tests never see each other's records or state."""

    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:10])

    @property
    def app_id(self) -> str:
        return f"test-{self.suffix}"

    @property
    def raw(self) -> str:
        return f"raw-{self.suffix}"

    @property
    def dead_letter(self) -> str:
        return f"dead-letter-{self.suffix}"

    def output(self, instance: str) -> str:
        return f"events-{self.suffix}-{instance}"

    def stale(self, instance: str) -> str:
        return f"stale-{self.suffix}-{instance}"

    def config(self, instances: list[dict[str, Any]] | None = None, extra: str = "") -> str:
        """A TOML config with these names; `instances` default to one `default` instance."""
        lines = [
            "[stream]",
            f'app_id = "{self.app_id}"',
            f'raw_topics = ["{self.raw}"]',
            f'repartition_topic = "{self.app_id}.by-key"',
            f'dead_letter_topic = "{self.dead_letter}"',
            "partitions = 2",
            extra,
        ]
        for instance in instances or [{"name": "default"}]:
            name = instance["name"]
            lines.append("[[instances]]")
            for key, value in {
                "topic": self.output(name),
                "stale_topic": self.stale(name),
                **instance,
            }.items():
                lines.append(f"{key} = {_toml(value)}")
        return "\n".join(lines) + "\n"

    def settings(self, instances: list[dict[str, Any]] | None = None) -> Settings:
        """The Settings a worker started with `config(instances)` runs with."""
        return Settings.model_validate(tomllib.loads(self.config(instances)))


def _toml(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(value)


def wait_for(
    condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.2
) -> Any:
    """Poll `condition` until it returns something truthy; fail naming `what`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


class Worker:
    """One worker process; its log is kept for the assertion messages."""

    def __init__(
        self, bootstrap: str, config_text: str, workdir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "streams.toml"
        self.config_path.write_text(config_text)
        self.log_path = workdir / "worker.log"
        self.web_port = free_port()
        self.env = {
            **os.environ,
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "STREAMS_CONFIG": str(self.config_path),
            "STREAMS_DATA_DIR": str(workdir / "data"),
            "STREAMS_WEB_PORT": str(self.web_port),
            **(env or {}),
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(
        self, wait_ready: bool = True, timeout_s: float = 90.0, level: str | None = "info"
    ) -> Worker:
        """`faust -A streams worker -l <level>` (level None: Faust's default, WARN)."""
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [str(FAUST), "-A", "streams", "worker", *(("-l", level) if level else ())],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        if wait_ready:
            try:
                self.wait_ready(timeout_s)
            except BaseException:
                self.kill()  # never leave a half-started worker behind a failed test
                raise
        return self

    def _get(self, path: str) -> tuple[int, str] | None:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.web_port}{path}", timeout=2
            ) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError:
            return None

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        def ready() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"worker exited with {self.process.returncode}:\n{self.tail()}")
            answer = self._get("/ready")
            return answer is not None and answer[0] == 200

        try:
            wait_for(ready, timeout_s, "the worker to be ready")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.tail()}") from None

    def metrics(self) -> dict[str, float]:
        """Prometheus samples as `name{labels}` -> value."""
        answer = self._get("/metrics")
        if answer is None or answer[0] != 200:
            return {}
        samples: dict[str, float] = {}
        for line in answer[1].splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    def metric(self, name: str, **labels: str) -> float:
        """The sum of every sample of `name` whose labels include `labels`."""
        total = 0.0
        for sample, value in self.metrics().items():
            sample_name, _, label_text = sample.partition("{")
            if sample_name != name:
                continue
            found = dict(re.findall(r'(\w+)="([^"]*)"', label_text))
            if all(found.get(key) == wanted for key, wanted in labels.items()):
                total += value
        return total

    def wait_metric(
        self, name: str, at_least: float, timeout_s: float = 60.0, **labels: str
    ) -> float:
        def reached() -> tuple[float] | None:
            value = self.metric(name, **labels)
            return (value,) if value >= at_least else None

        try:
            return float(wait_for(reached, timeout_s, f"{name}{labels} >= {at_least}")[0])
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; worker log:\n{self.tail()}") from None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def stop(self, timeout_s: float = 40.0) -> int:
        """SIGTERM; the exit code. The worker ends within its grace period (30 s,
        streams.progress.STOP_GRACE_S): one that takes longer is killed (-9), failing the
        callers' `== 0`."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
