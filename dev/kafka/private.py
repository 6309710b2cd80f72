"""A broker of one's own (a test's, a benchmark's): its own directory and ports, started,
stopped and restarted at will with `localkafka.py`. Shared by `tests/` and `benchmarks/`."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
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
    """One broker in `directory`, on a free pair of ports, with a heap of `heap`.

    `proxied`: a second listener on `proxied_port` that advertises `proxy_port`, for a fault
    proxy listening there (tests/support/fault_proxy.py): a client bootstrapped on
    `proxy_bootstrap` reaches the broker only through the proxy; `bootstrap` stays direct."""

    def __init__(
        self, directory: Path, heap: str = "512m", timeout_s: float = 240, proxied: bool = False
    ) -> None:
        self.directory = directory
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
        self.env.pop("LOCAL_KAFKA_PROXIED", None)
        self.proxied_port = self.proxy_port = 0
        if proxied:
            while self.proxied_port in (0, self.port, self.port + 1):
                self.proxied_port = free_port_run(2)
            self.proxy_port = self.proxied_port + 1
            self.env["LOCAL_KAFKA_PROXIED"] = f"{self.proxied_port}:{self.proxy_port}"
        self.proxy_bootstrap = f"127.0.0.1:{self.proxy_port}"

    def run(self, *command: str, given: str | None = None) -> str:
        """`localkafka.py <command>` for this broker (`given` on its standard input, as `admin`
        reads its commands); its output. Raises if it fails."""
        result = subprocess.run(
            [sys.executable, str(LOCAL_KAFKA), *command],
            input=given,
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

    def pid(self) -> int | None:
        """Its JVM's process id while it runs (benchmarks read its CPU time)."""
        try:
            pid = int((self.directory / "broker.pid").read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if _alive(pid) else None

    def kill(self) -> None:
        """SIGKILL it, as a crash would end it (no controlled shutdown), and wait until it is
        gone."""
        pid = self.pid()
        if pid is None:
            raise RuntimeError(f"the broker in {self.directory} is not running")
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        (self.directory / "broker.pid").unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie left for a parent to reap has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def free_port_run(count: int) -> int:
    """A port p such that p .. p + count - 1 are all free on 127.0.0.1 (a cluster's client
    and controller ports), below the ephemeral range like `free_port_pair`."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000 - count)
        sockets = [socket.socket() for _ in range(count)]
        try:
            for offset, sock in enumerate(sockets):
                sock.bind(("127.0.0.1", port + offset))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        return port
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1")


class PrivateCluster:
    """A local cluster of `brokers` KRaft nodes (`localkafka.py --brokers N`) in `directory`,
    on free consecutive ports; single nodes can be SIGKILLed and brought back."""

    def __init__(
        self, directory: Path, brokers: int = 3, heap: str = "512m", timeout_s: float = 300
    ) -> None:
        self.directory = directory
        self.brokers = brokers
        self.port = free_port_run(2 * brokers)
        self.bootstrap = ",".join(f"127.0.0.1:{port}" for port in self.client_ports)
        self.timeout_s = timeout_s
        self.env = {
            **os.environ,
            "LOCAL_KAFKA_DIR": str(directory),
            "LOCAL_KAFKA_PORT": str(self.port),
            "LOCAL_KAFKA_HEAP": heap,
            "LOCAL_KAFKA_BROKERS": str(brokers),
        }
        self.env.pop("LOCAL_KAFKA_SECURITY", None)

    @property
    def client_ports(self) -> list[int]:
        return [self.port + offset for offset in range(self.brokers)]

    @property
    def node_ids(self) -> range:
        return range(1, self.brokers + 1)

    def log(self, node_id: int) -> Path:
        return self.directory / f"node-{node_id}" / "broker.log"

    def run(self, *command: str) -> subprocess.CompletedProcess[str]:
        """`localkafka.py <command> --brokers N` for this cluster. Raises if it fails."""
        result = subprocess.run(
            [sys.executable, str(LOCAL_KAFKA), *command, "--brokers", str(self.brokers)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=self.timeout_s,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"localkafka.py {' '.join(command)} failed: {result.stderr.strip()}")
        return result

    def start(self, fresh: bool = False) -> str:
        """Start every node that is not running; the bootstrap address it prints last."""
        return self.run("start", *(["--fresh"] if fresh else [])).stdout.strip().splitlines()[-1]

    def stop(self) -> None:
        self.run("stop")

    def pid(self, node_id: int) -> int | None:
        try:
            pid = int((self.directory / f"node-{node_id}" / "broker.pid").read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if _alive(pid) else None

    def kill(self, node_id: int) -> None:
        """SIGKILL one node (no controlled shutdown, as a crash or a lost machine), and wait
        until it is gone; `start()` brings it back."""
        pid = self.pid(node_id)
        if pid is None:
            raise RuntimeError(f"node {node_id} is not running")
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        (self.directory / f"node-{node_id}" / "broker.pid").unlink(missing_ok=True)
