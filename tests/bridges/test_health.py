"""A webhook bridge whose port is taken says so at once, in one line naming the setting.

Before: the bind error came as a traceback in the log after about a minute. Now the bridge
exits 2 within seconds with `connectors: cannot listen on HOST:PORT (address already in use);
set WEBHOOK_PORT (webhook.port) to a free port`, and likewise for `WEBHOOK_ADMIN_PORT`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from support.worker import ROOT, free_port

pytestmark = pytest.mark.kafka


@pytest.fixture
def taken() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def run_webhook(bootstrap: str, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "connectors", "webhook"],
        cwd=ROOT,
        env={
            **{key: value for key, value in os.environ.items() if key != "STREAMS_CONFIG"},
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            **env,
        },
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, time.monotonic() - started


@pytest.mark.parametrize("kafka", ["up", "unreachable"])
def test_a_taken_public_port_is_one_line_naming_webhook_port(
    kafka_bootstrap: str, taken: int, kafka: str
) -> None:
    bootstrap = kafka_bootstrap if kafka == "up" else f"127.0.0.1:{free_port()}"
    done, elapsed = run_webhook(bootstrap, WEBHOOK_PORT=str(taken))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("connectors:")]
    assert errors == [
        f"connectors: cannot listen on 127.0.0.1:{taken} (address already in use); set "
        "WEBHOOK_PORT (webhook.port) to a free port"
    ], done.stderr
    assert elapsed < 15, elapsed


def test_a_taken_admin_port_is_one_line_naming_webhook_admin_port(
    kafka_bootstrap: str, taken: int
) -> None:
    done, elapsed = run_webhook(
        kafka_bootstrap, WEBHOOK_PORT=str(free_port()), WEBHOOK_ADMIN_PORT=str(taken)
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("connectors:")]
    assert errors == [
        f"connectors: cannot listen on 127.0.0.1:{taken} (address already in use); set "
        "WEBHOOK_ADMIN_PORT (webhook.admin_port) to a free port"
    ], done.stderr
    assert elapsed < 15, elapsed
