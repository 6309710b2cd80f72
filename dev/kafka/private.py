"""A broker of one's own (a test's, a benchmark's): its own directory and ports, started,
stopped and restarted at will with `localkafka.py`. Shared by `tests/` and `benchmarks/`."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from pathlib import Path

LOCAL_KAFKA = Path(__file__).resolve().with_name("localkafka.py")


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
    """One broker in `directory`, on a free pair of ports, with a heap of `heap`."""

    def __init__(self, directory: Path, heap: str = "512m", timeout_s: float = 240) -> None:
        self.port = free_port_pair()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log = directory / "broker.log"
        self.timeout_s = timeout_s
        self.env = {
            **os.environ,
            "LOCAL_KAFKA_DIR": str(directory),
            "LOCAL_KAFKA_PORT": str(self.port),
            "LOCAL_KAFKA_HEAP": heap,
        }

    def run(self, *command: str) -> str:
        """`localkafka.py <command>` for this broker; its output. Raises if it fails."""
        result = subprocess.run(
            [sys.executable, str(LOCAL_KAFKA), *command],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=self.timeout_s,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"localkafka.py {' '.join(command)} failed: {result.stderr.strip()}")
        return result.stdout.strip()

    def start(self, fresh: bool = False) -> str:
        """Start it (`fresh`: with an empty data directory); its bootstrap address."""
        return self.run("start", *(["--fresh"] if fresh else [])).splitlines()[-1]

    def stop(self) -> None:
        self.run("stop")
