"""The project's own Kafka broker script, for tests that start a broker of their own."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCAL_KAFKA = ROOT / "dev" / "kafka" / "localkafka.py"


def kafka_version() -> str:
    return subprocess.run(
        [sys.executable, str(LOCAL_KAFKA), "version"], capture_output=True, text=True, check=True
    ).stdout.strip()


def free_port_pair() -> int:
    """A port p such that p and p + 1 (the controller) are both free on 127.0.0.1.

    Taken below the kernel's ephemeral range, so that no outgoing connection grabs it
    between this check and the broker binding it.
    """
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        try:
            with socket.socket() as first, socket.socket() as second:
                first.bind(("127.0.0.1", port))
                second.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError("no free pair of ports on 127.0.0.1")


class PrivateBroker:
    """A broker of one test's own (its own directory and ports), to stop and start at will."""

    def __init__(self, directory: Path, heap: str = "512m") -> None:
        self.port = free_port_pair()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "LOCAL_KAFKA_DIR": str(directory),
            "LOCAL_KAFKA_PORT": str(self.port),
            "LOCAL_KAFKA_HEAP": heap,
        }

    def run(self, command: str) -> None:
        """`localkafka.py <command>` for this broker; fails the test if it fails."""
        result = subprocess.run(
            [sys.executable, str(LOCAL_KAFKA), command],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert result.returncode == 0, result.stderr
