"""Debian's Prometheus Pushgateway (`prometheus-pushgateway`, installed by `make test-deps`)
for the tests of what reconcile pushes (connectors/reconcile/report.py).

`pushgateway` is a session fixture: one Pushgateway on a free port of 127.0.0.1, without
persistence (its groups live in memory), answering `/-/ready` before the first test uses it,
stopped after the session. `Pushgateway.samples()` reads its `/metrics` as a scrape would.
"""

from __future__ import annotations

import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.processes import serving
from support.worker import free_port

PUSHGATEWAY = "/usr/bin/prometheus-pushgateway"


@dataclass(frozen=True)
class Pushgateway:
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def samples(self, **labels: str) -> dict[str, float]:
        """`name{label="value",...}` -> value, for the pushed samples whose labels include
        `labels` (the Pushgateway's own push_time_seconds and process metrics too)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as answer:
            text = answer.read().decode()
        found = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if all(sample.labels.get(k) == v for k, v in labels.items()):
                    shown = ",".join(
                        f'{k}="{v}"'
                        for k, v in sorted(sample.labels.items())
                        if k not in ("job", "instance")
                    )
                    found[f"{sample.name}{{{shown}}}" if shown else sample.name] = sample.value
        return found

    def delete(self, job: str, instance: str) -> None:
        request = urllib.request.Request(
            f"{self.url}/metrics/job/{job}/instance/{instance}", method="DELETE"
        )
        urllib.request.urlopen(request, timeout=5).close()


@pytest.fixture(scope="session")
def pushgateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pushgateway]:
    executable = (
        PUSHGATEWAY if Path(PUSHGATEWAY).exists() else shutil.which("prometheus-pushgateway")
    )
    if executable is None:
        pytest.fail(
            "prometheus-pushgateway is missing: run `make test-deps` (as root it installs "
            "Debian's prometheus-pushgateway; otherwise `sudo apt-get install "
            "prometheus-pushgateway`)",
            pytrace=False,
        )
    workdir = tmp_path_factory.mktemp("pushgateway")
    gateway = Pushgateway(free_port(), workdir / "pushgateway.log")
    with gateway.log_path.open("wb") as log:
        process = subprocess.Popen(
            [executable, f"--web.listen-address=127.0.0.1:{gateway.port}"],
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    with serving(process, "prometheus-pushgateway", gateway.ready, gateway.tail, 20, 0.05):
        yield gateway
