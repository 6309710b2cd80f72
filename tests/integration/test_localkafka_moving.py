"""Moving the local broker (issue 16, item 3): `LOCAL_KAFKA_PORT` alone moves the broker and
what follows it (`make tail`), and a state directory in use by a running broker is never
rewritten.

Each test runs localkafka.py with HOME in a temporary directory, so that its *default* state
directories (~/.cache/storage-events/kafka-<port>) are the test's own; the jars come from the
usual cache (LOCAL_KAFKA_LIBS).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.local_broker import LOCAL_KAFKA, free_port_pair

pytestmark = pytest.mark.kafka

ROOT = LOCAL_KAFKA.parents[2]
LIBS = Path(os.environ.get("LOCAL_KAFKA_LIBS") or Path.home() / ".cache" / "storage-events")


def broker_env(home: Path, port: int, **extra: str) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("KAFKA_BOOTSTRAP_SERVERS", "LOCAL_KAFKA_DIR", "LOCAL_KAFKA_SECURITY")
    }
    return env | {
        "HOME": str(home),
        "LOCAL_KAFKA_LIBS": str(LIBS),
        "LOCAL_KAFKA_PORT": str(port),
        "LOCAL_KAFKA_HEAP": "512m",
        **extra,
    }


def localkafka(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(LOCAL_KAFKA), command],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def other_port(*taken: int) -> int:
    """A free port pair that overlaps none of `taken`'s pairs."""
    while True:
        port = free_port_pair()
        if all(abs(port - other) > 1 for other in taken):
            return port


@dataclass
class Running:
    home: Path
    port: int
    directory: Path
    pid: int
    properties: str


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """A broker started with LOCAL_KAFKA_PORT alone, in its default state directory."""
    home = tmp_path_factory.mktemp("home")
    port = free_port_pair()
    env = broker_env(home, port)
    started = localkafka("start", env)
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip().splitlines()[-1] == f"127.0.0.1:{port}"
    directory = home / ".cache" / "storage-events" / f"kafka-{port}"
    try:
        yield Running(
            home,
            port,
            directory,
            int((directory / "broker.pid").read_text()),
            (directory / "server.properties").read_text(),
        )
    finally:
        localkafka("stop", env)


def test_the_port_alone_moves_the_broker_and_make_tail_with_it(running: Running) -> None:
    port = other_port(running.port)
    env = broker_env(running.home, port)
    try:
        moved = localkafka("start", env)
        assert moved.returncode == 0, moved.stderr
        assert moved.stdout.strip().splitlines()[-1] == f"127.0.0.1:{port}"
        moved_dir = running.home / ".cache" / "storage-events" / f"kafka-{port}"
        assert (
            f"listeners=PLAINTEXT://127.0.0.1:{port}"
            in (moved_dir / "server.properties").read_text()
        )
        # The broker already running elsewhere is as it was, and still runs.
        assert (running.directory / "server.properties").read_text() == running.properties
        status = localkafka("status", broker_env(running.home, running.port))
        assert status.returncode == 0
        assert f"127.0.0.1:{running.port}" in status.stdout

        # `make tail` with the same one setting reads from the moved broker.
        tail = subprocess.Popen(
            ["make", "--no-print-directory", "-o", ".venv/.installed", "tail"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert tail.stderr is not None
            header = tail.stderr.readline()
        finally:
            tail.terminate()
            tail.wait(30)
        assert header.startswith("# tailing ")
        assert re.search(rf" on 127\.0\.0\.1:{port}\b", header), header
    finally:
        localkafka("stop", env)


def test_a_directory_in_use_by_a_running_broker_is_refused_and_left_alone(
    running: Running,
) -> None:
    port = other_port(running.port)
    env = broker_env(running.home, port, LOCAL_KAFKA_DIR=str(running.directory))
    began = time.monotonic()
    refused = localkafka("start", env)
    elapsed = time.monotonic() - began
    assert refused.returncode == 1
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert f"(pid {running.pid})" in lines[0] and f"port {running.port}" in lines[0]
    assert str(running.directory) in lines[0]
    assert elapsed < 30  # it says so at once, not after the 90 s start-up timeout
    assert (running.directory / "server.properties").read_text() == running.properties
    assert (running.directory / "broker.pid").read_text().strip() == str(running.pid)

    # Other security on the same port and directory: refused the same way.
    other_security = broker_env(
        running.home,
        running.port,
        LOCAL_KAFKA_DIR=str(running.directory),
        LOCAL_KAFKA_SECURITY="sasl_ssl",
    )
    refused = localkafka("start", other_security)
    assert refused.returncode == 1
    assert "(plaintext)" in refused.stderr and f"port {running.port}" in refused.stderr
    assert (running.directory / "server.properties").read_text() == running.properties
