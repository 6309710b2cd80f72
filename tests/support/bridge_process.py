"""A pull bridge (`python -m connectors <bridge>`) running as a subprocess in a test."""

from __future__ import annotations

import re
import signal
import subprocess
import urllib.request
from pathlib import Path

from support.worker import wait_for


class BridgeProcess:
    """Its log, its Prometheus metrics, and a SIGTERM stop that must be obeyed.

    Subclasses start `self.process`, writing to `self.log_path`, serving metrics on
    `self.metrics_port`.
    """

    process: subprocess.Popen[bytes]
    log_path: Path
    metrics_port: int

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str) -> float:
        """The sum of `name`'s samples, whatever their labels (one bridge serves one queue)."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2
            ) as response:
                text = response.read().decode()
        except OSError:
            return 0.0
        found = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
        return sum(float(value) for value in found)

    def wait_metric(self, name: str, at_least: float, timeout_s: float = 30) -> None:
        def reached() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"bridge exited {self.process.returncode}:\n{self.log()}")
            return self.metric(name) >= at_least

        try:
            wait_for(reached, timeout_s, f"{name} >= {at_least}")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\nbridge log:\n{self.log()}") from None

    def stop(self, timeout_s: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise AssertionError(f"bridge ignored SIGTERM:\n{self.log()}") from None
        return self.process.returncode
