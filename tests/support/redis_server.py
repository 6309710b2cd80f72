"""Debian's `redis-server` (installed by `make test-deps`) for the tests.

`redis_server` is a session fixture: one `redis-server` on a free port of 127.0.0.1, with no
persistence (`--save '' --appendonly no`), working in a temporary folder, started once,
answering PING before the first test uses it, stopped after the session. Tests import the
fixture: `from support.redis_server import redis_server`.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.processes import serving
from support.worker import free_port

REDIS_SERVER = "/usr/bin/redis-server"


@dataclass(frozen=True)
class RedisServer:
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    executable = REDIS_SERVER if Path(REDIS_SERVER).exists() else shutil.which("redis-server")
    if executable is None:
        pytest.fail(
            "redis-server is missing: run `make test-deps` (as root it installs Debian's "
            "redis-server; otherwise `sudo apt-get install redis-server`)",
            pytrace=False,
        )
    workdir = tmp_path_factory.mktemp("redis")
    port = free_port()
    server = RedisServer(port, workdir / "redis.log")
    process = subprocess.Popen(
        [
            executable,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
            "--logfile",
            str(server.log_path),
            "--daemonize",
            "no",
        ],
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    with serving(process, "redis-server", lambda: _pong(port), server.tail, 20, 0.05):
        yield server
