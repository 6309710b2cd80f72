"""`make kafka` / `make kafka-stop`: the project's own broker script, on a private state dir."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.local_broker import LOCAL_KAFKA, free_port_pair

pytestmark = pytest.mark.kafka


def run(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(LOCAL_KAFKA), command],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_start_twice_runs_one_broker_and_stop_twice_says_so(tmp_path: Path) -> None:
    port = free_port_pair()
    env = {
        **os.environ,
        "LOCAL_KAFKA_DIR": str(tmp_path / "kafka"),
        "LOCAL_KAFKA_PORT": str(port),
        "LOCAL_KAFKA_HEAP": "512m",
    }
    try:
        first = run("start", env)
        assert first.returncode == 0, first.stderr
        assert first.stdout.strip().splitlines()[-1] == f"127.0.0.1:{port}"
        pid = (tmp_path / "kafka" / "broker.pid").read_text().strip()

        second = run("start", env)
        assert second.returncode == 0, second.stderr
        assert second.stdout.strip().splitlines()[-1] == f"127.0.0.1:{port}"
        assert "already running" in second.stderr
        assert (tmp_path / "kafka" / "broker.pid").read_text().strip() == pid
        assert (tmp_path / "kafka" / "broker.log").stat().st_size > 0
    finally:
        stopped = run("stop", env)
    assert stopped.returncode == 0
    assert "stopped" in stopped.stdout
    again = run("stop", env)
    assert again.returncode == 0
    assert again.stdout.strip() == f"no local Kafka broker is running ({tmp_path / 'kafka'})"


def test_a_port_in_use_is_one_line_saying_what_to_do(tmp_path: Path) -> None:
    port = free_port_pair()
    env = {**os.environ, "LOCAL_KAFKA_DIR": str(tmp_path / "kafka"), "LOCAL_KAFKA_PORT": str(port)}
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        result = run("start", env)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert f"port {port}" in lines[0] and "LOCAL_KAFKA_PORT" in lines[0]


def test_a_missing_java_is_one_line_saying_what_to_do(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "LOCAL_KAFKA_DIR": str(tmp_path / "kafka"),
        "LOCAL_KAFKA_PORT": str(free_port_pair()),
        "PATH": str(tmp_path / "empty-bin"),
        "LOCAL_KAFKA_LIBS": str(tmp_path / "libs"),
    }
    result = run("start", env)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "`mvn` not found" in lines[0] or "`java` not found" in lines[0]
