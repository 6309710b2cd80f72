#!/usr/bin/env python3
"""A local, single-node Apache Kafka broker (KRaft combined mode) for development and tests.

The broker jars come from Maven Central through Maven (see pom.xml beside this file), resolved
once into a cache directory that later runs reuse. Standard library only: `make kafka` runs
this before any virtualenv exists.

    python3 dev/kafka/localkafka.py start    # start if not running, wait, print host:port last
    python3 dev/kafka/localkafka.py stop     # stop it (says so, exit 0, when none runs)
    python3 dev/kafka/localkafka.py status
    python3 dev/kafka/localkafka.py fetch    # only resolve the jars

Environment (all optional):
    LOCAL_KAFKA_DIR   state directory: libs cache, data, pid file, broker.log
                      (default ~/.cache/storage-events/kafka)
    LOCAL_KAFKA_PORT  client port on 127.0.0.1 (default 9092); the controller uses port + 1
    LOCAL_KAFKA_HEAP  JVM heap (default 1g: the broker is one of several processes on a
                      2-core / 24 GiB machine)
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
LOG4J_CONFIG = HERE / "log4j2.properties"
HOST = "127.0.0.1"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0


class LocalKafkaError(Exception):
    """A problem the user can fix; printed as one line."""


def kafka_version() -> str:
    match = re.search(r"<kafka.version>([^<]+)</kafka.version>", POM.read_text())
    if not match:
        raise LocalKafkaError(f"no <kafka.version> in {POM}")
    return match.group(1)


@dataclass(frozen=True)
class Layout:
    """Where one local broker keeps everything; nothing of it lives in the repository."""

    root: Path
    port: int
    heap: str

    @classmethod
    def from_env(cls) -> Layout:
        root = Path(
            os.environ.get("LOCAL_KAFKA_DIR") or Path.home() / ".cache" / "storage-events" / "kafka"
        )
        port_text = os.environ.get("LOCAL_KAFKA_PORT", "9092")
        if not port_text.isdigit() or not 1024 <= int(port_text) < 65535:
            raise LocalKafkaError(f"LOCAL_KAFKA_PORT must be a port number, got {port_text!r}")
        return cls(root=root, port=int(port_text), heap=os.environ.get("LOCAL_KAFKA_HEAP", "1g"))

    @property
    def libs(self) -> Path:
        # Shared by every state directory: the jars depend on the version only.
        cache = Path(
            os.environ.get("LOCAL_KAFKA_LIBS") or Path.home() / ".cache" / "storage-events"
        )
        return cache / f"kafka-libs-{kafka_version()}"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "broker.log"

    @property
    def pid_file(self) -> Path:
        return self.root / "broker.pid"

    @property
    def properties(self) -> Path:
        return self.root / "server.properties"

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"


def require_tool(name: str, hint: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise LocalKafkaError(f"`{name}` not found on PATH: {hint}")
    return path


def fetch(layout: Layout) -> Path:
    """Resolve the broker jars with Maven once; later calls reuse the cache."""
    done = layout.libs / ".complete"
    if done.exists():
        return layout.libs
    mvn = require_tool("mvn", "install Maven (Debian: apt-get install maven)")
    require_tool("java", "install a Java 17+ runtime (Debian: apt-get install openjdk-17-jre)")
    staging = layout.libs.with_name(layout.libs.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    mvn_log = layout.libs.with_name(layout.libs.name + ".mvn.log")
    print(
        f"resolving Apache Kafka {kafka_version()} from Maven Central (log: {mvn_log}) ...",
        file=sys.stderr,
    )
    with mvn_log.open("w") as out:
        result = subprocess.run(
            [
                mvn,
                "-B",
                "-q",
                "-f",
                str(POM),
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={staging}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if result.returncode != 0 or not any(staging.glob("kafka_2.13-*.jar")):
        raise LocalKafkaError(
            f"could not download the Kafka broker with Maven (see {mvn_log}); "
            "check that Maven Central is reachable, then run `make kafka` again"
        )
    shutil.rmtree(layout.libs, ignore_errors=True)
    staging.rename(layout.libs)
    done.touch()
    return layout.libs


def write_properties(layout: Layout) -> None:
    controller_port = layout.port + 1
    layout.properties.write_text(
        "\n".join(
            [
                "process.roles=broker,controller",
                "node.id=1",
                f"controller.quorum.voters=1@{HOST}:{controller_port}",
                f"listeners=PLAINTEXT://{HOST}:{layout.port},CONTROLLER://{HOST}:{controller_port}",
                f"advertised.listeners=PLAINTEXT://{HOST}:{layout.port}",
                "controller.listener.names=CONTROLLER",
                "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                "inter.broker.listener.name=PLAINTEXT",
                f"log.dirs={layout.data}",
                "num.partitions=4",
                # One node: every internal topic can only have one replica.
                "offsets.topic.replication.factor=1",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1",
                "share.coordinator.state.topic.replication.factor=1",
                "share.coordinator.state.topic.min.isr=1",
                # Consumers in tests join at once instead of waiting 3 s for more members.
                "group.initial.rebalance.delay.ms=0",
                "auto.create.topics.enable=true",
                "log.retention.hours=168",
                "log.cleaner.backoff.ms=1000",
                "",
            ]
        )
    )


def java_command(layout: Layout, main_class: str, *args: str) -> list[str]:
    java = require_tool(
        "java", "install a Java 17+ runtime (Debian: apt-get install openjdk-17-jre)"
    )
    return [
        java,
        f"-Xms{layout.heap}",
        f"-Xmx{layout.heap}",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
        "-cp",
        f"{layout.libs}/*",
        main_class,
        *args,
    ]


def format_storage(layout: Layout) -> None:
    if (layout.data / "meta.properties").exists():
        return
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    result = subprocess.run(
        java_command(
            layout,
            "kafka.tools.StorageTool",
            "format",
            f"--cluster-id={cluster_id}",
            "--config",
            str(layout.properties),
            "--ignore-formatted",
        ),
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise LocalKafkaError(f"formatting {layout.data} failed: {detail[-1] if detail else '?'}")


def running_pid(layout: Layout) -> int | None:
    """The pid of this layout's broker if it is alive, else None (a stale pid file is removed)."""
    try:
        pid = int(layout.pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    try:
        os.kill(pid, 0)
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (ProcessLookupError, PermissionError, FileNotFoundError):
        layout.pid_file.unlink(missing_ok=True)
        return None
    # An empty command line is a process still being spawned (we may have just started it).
    if cmdline and b"kafka.Kafka" not in cmdline:
        layout.pid_file.unlink(missing_ok=True)
        return None
    return pid


def port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((HOST, port)) == 0


def answers_kafka(port: int) -> bool:
    """True when the port speaks the Kafka protocol (an ApiVersions v0 round trip)."""
    client_id = b"localkafka"
    header = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id
    try:
        with socket.create_connection((HOST, port), timeout=2) as sock:
            sock.sendall(struct.pack(">i", len(header)) + header)
            size_bytes = sock.recv(4)
            if len(size_bytes) < 4:
                return False
            payload = sock.recv(struct.unpack(">i", size_bytes)[0])
            correlation_id, error_code = struct.unpack(">ih", payload[:6])
            return correlation_id == 1 and error_code == 0
    except OSError:
        return False


def tail(path: Path, lines: int = 5) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def start(layout: Layout, fresh: bool = False) -> str:
    pid = running_pid(layout)
    if pid is not None and answers_kafka(layout.port):
        print(
            f"Apache Kafka {kafka_version()} already running (pid {pid}), log: {layout.log}",
            file=sys.stderr,
        )
        return layout.bootstrap
    if pid is None and (port_in_use(layout.port) or port_in_use(layout.port + 1)):
        raise LocalKafkaError(
            f"port {layout.port} or {layout.port + 1} on {HOST} is used by another process; "
            "stop it or choose another port with LOCAL_KAFKA_PORT=<port>"
        )
    fetch(layout)
    layout.root.mkdir(parents=True, exist_ok=True)
    if fresh and pid is None:
        shutil.rmtree(layout.data, ignore_errors=True)
    write_properties(layout)
    format_storage(layout)
    process: subprocess.Popen[bytes] | None = None
    if pid is None:
        with layout.log.open("ab") as log:
            process = subprocess.Popen(
                java_command(layout, "kafka.Kafka", str(layout.properties)),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in the caller's terminal is not for the broker
            )
        layout.pid_file.write_text(str(process.pid))
        pid = process.pid
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        exited = process.poll() is not None if process is not None else running_pid(layout) is None
        if exited:
            layout.pid_file.unlink(missing_ok=True)
            raise LocalKafkaError(
                f"the broker exited during start-up; see {layout.log}:\n{tail(layout.log)}"
            )
        if answers_kafka(layout.port):
            print(
                f"Apache Kafka {kafka_version()} running (pid {pid}), log: {layout.log}",
                file=sys.stderr,
            )
            return layout.bootstrap
        time.sleep(0.2)
    raise LocalKafkaError(
        f"the broker did not accept connections within {START_TIMEOUT_S:.0f} s; see {layout.log}"
    )


def stop(layout: Layout) -> bool:
    """Stop the broker; False when none was running."""
    pid = running_pid(layout)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and running_pid(layout) is not None:
        time.sleep(0.2)
    if running_pid(layout) is not None:
        os.kill(pid, signal.SIGKILL)
    layout.pid_file.unlink(missing_ok=True)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["start", "stop", "status", "fetch", "version"])
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="with start: delete the broker's data first (tests use this)",
    )
    args = parser.parse_args(argv)
    try:
        layout = Layout.from_env()
        if args.command == "version":
            print(kafka_version())
        elif args.command == "fetch":
            print(fetch(layout))
        elif args.command == "start":
            print(start(layout, fresh=args.fresh))
        elif args.command == "stop":
            if stop(layout):
                print(f"stopped the local Kafka broker ({layout.bootstrap})")
            else:
                print(f"no local Kafka broker is running ({layout.root})")
        else:
            pid = running_pid(layout)
            print(f"running (pid {pid}) at {layout.bootstrap}" if pid else "not running")
            return 0 if pid else 1
    except LocalKafkaError as exc:
        print(f"localkafka: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
