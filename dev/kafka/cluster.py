"""A local KRaft cluster of N nodes, each broker and controller (`localkafka.py start --brokers
N`, `make kafka KAFKA_BROKERS=3`): split from localkafka.py, whose single broker's helpers it
uses. Standard library only, like localkafka.py.
"""

from __future__ import annotations

import base64
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

if __package__:
    from .localkafka import (
        HOST,
        KIP848_GROUP_BOUNDS,
        STOP_TIMEOUT_S,
        Layout,
        LocalKafkaError,
        answers_kafka,
        fetch,
        java_command,
        kafka_version,
        port_in_use,
        running_pid,
        tail,
    )
else:  # imported by `python3 dev/kafka/localkafka.py`, which registered itself as localkafka
    from localkafka import (  # type: ignore[no-redef]
        HOST,
        KIP848_GROUP_BOUNDS,
        STOP_TIMEOUT_S,
        Layout,
        LocalKafkaError,
        answers_kafka,
        fetch,
        java_command,
        kafka_version,
        port_in_use,
        running_pid,
        tail,
    )

DEFAULT_CLUSTER_PORT = 19092
CLUSTER_START_TIMEOUT_S = 240.0
CLUSTER_HEAP = "512m"


@dataclass(frozen=True)
class Cluster:
    """A local KRaft cluster of `brokers` nodes, each broker AND controller (combined mode):
    three controllers, so the quorum survives one node lost, whichever it is (with a single
    controller, killing its node would stop every leader election). Node i (1-based) serves
    clients on `port + i - 1` and its controller on `port + brokers + i - 1`; its data, log,
    pid file and properties live in `root/node-<i>/`."""

    root: Path
    port: int
    brokers: int
    heap: str

    @classmethod
    def from_env(cls, brokers: int) -> Cluster:
        port_text = os.environ.get("LOCAL_KAFKA_PORT") or str(DEFAULT_CLUSTER_PORT)
        if port_text == "9092":  # the single broker's default, exported by its client.env
            port_text = str(DEFAULT_CLUSTER_PORT)
        if not port_text.isdigit() or not 1024 <= int(port_text) < 65535 - 2 * brokers:
            raise LocalKafkaError(f"LOCAL_KAFKA_PORT must be a port number, got {port_text!r}")
        port = int(port_text)
        base = Path.home() / ".cache" / "storage-events"
        root = Path(os.environ.get("LOCAL_KAFKA_DIR") or base / f"kafka-cluster-{port}")
        heap = os.environ.get("LOCAL_KAFKA_HEAP") or CLUSTER_HEAP
        return cls(root=root, port=port, brokers=brokers, heap=heap)

    @property
    def ids(self) -> range:
        return range(1, self.brokers + 1)

    def node(self, node_id: int) -> Layout:
        """Node `node_id`'s own layout (its client port; its directory under the root)."""
        return Layout(
            root=self.root / f"node-{node_id}", port=self.port + node_id - 1, heap=self.heap
        )

    def controller_port(self, node_id: int) -> int:
        return self.port + self.brokers + node_id - 1

    @property
    def ports(self) -> list[int]:
        return [self.port + offset for offset in range(2 * self.brokers)]

    @property
    def bootstrap(self) -> str:
        return ",".join(self.node(node_id).bootstrap for node_id in self.ids)

    @property
    def client_env(self) -> Path:
        return self.root / "client.env"

    @property
    def cluster_id_file(self) -> Path:
        return self.root / "cluster.id"

    def describe(self) -> str:
        first_controller = self.port + self.brokers
        return (
            f"{self.brokers} brokers, {self.brokers} KRaft controllers (combined mode: each "
            f"node is broker and controller), clients on {self.port}-{first_controller - 1}, "
            f"controllers on {first_controller}-{first_controller + self.brokers - 1}"
        )


def write_node_properties(cluster: Cluster, node_id: int) -> None:
    """One node's server.properties: a static quorum of every node's controller, internal
    topics replicated to every broker, 2 in sync (a production cluster's settings)."""
    node = cluster.node(node_id)
    voters = ",".join(f"{other}@{HOST}:{cluster.controller_port(other)}" for other in cluster.ids)
    replicas = cluster.brokers
    in_sync = min(2, replicas)
    node.properties.write_text(
        "\n".join(
            [
                "process.roles=broker,controller",
                f"node.id={node_id}",
                f"controller.quorum.voters={voters}",
                f"listeners=PLAINTEXT://{HOST}:{node.port},"
                f"CONTROLLER://{HOST}:{cluster.controller_port(node_id)}",
                f"advertised.listeners=PLAINTEXT://{HOST}:{node.port}",
                "controller.listener.names=CONTROLLER",
                "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                "inter.broker.listener.name=PLAINTEXT",
                f"log.dirs={node.data}",
                "num.partitions=4",
                f"default.replication.factor={replicas}",
                # The broker-wide default (the stream sets its own topics' explicitly): what
                # Faust's leader topic and the consumer offsets topic get.
                f"min.insync.replicas={in_sync}",
                f"offsets.topic.replication.factor={replicas}",
                f"transaction.state.log.replication.factor={replicas}",
                f"transaction.state.log.min.isr={in_sync}",
                f"share.coordinator.state.topic.replication.factor={replicas}",
                f"share.coordinator.state.topic.min.isr={in_sync}",
                "unclean.leader.election.enable=false",
                "group.initial.rebalance.delay.ms=0",
                *KIP848_GROUP_BOUNDS,
                "auto.create.topics.enable=true",
                "log.retention.hours=168",
                "log.cleaner.backoff.ms=1000",
                # Few threads per node: three JVMs share two cores with everything else.
                "num.network.threads=2",
                "num.io.threads=4",
                "background.threads=4",
                "",
            ]
        )
    )


def format_node(cluster: Cluster, node_id: int, cluster_id: str) -> None:
    """Format one node's data once, with the cluster's id (every node must share it)."""
    node = cluster.node(node_id)
    if (node.data / "meta.properties").exists():
        return
    result = subprocess.run(
        java_command(
            node,
            "kafka.tools.StorageTool",
            "format",
            f"--cluster-id={cluster_id}",
            "--config",
            str(node.properties),
            "--ignore-formatted",
        ),
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise LocalKafkaError(f"formatting {node.data} failed: {detail[-1] if detail else '?'}")


def spawn_node(node: Layout) -> int:
    """Start one node's JVM in the background; its pid (also in its pid file)."""
    with node.log.open("ab") as log:
        process = subprocess.Popen(
            java_command(node, "kafka.Kafka", str(node.properties)),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in the caller's terminal is not for the broker
        )
    node.pid_file.write_text(str(process.pid))
    return process.pid


def start_cluster(cluster: Cluster, fresh: bool = False) -> str:
    """Start every node that does not run (all at once: a node serves clients only once a
    quorum of controllers is up), wait until each answers; the bootstrap of all three."""
    running = {node_id: running_pid(cluster.node(node_id)) for node_id in cluster.ids}
    down = [node_id for node_id, pid in running.items() if pid is None]
    if not down and all(answers_kafka(cluster.node(node_id).port) for node_id in cluster.ids):
        print(
            f"Apache Kafka {kafka_version()} cluster already running ({cluster.describe()}; "
            f"pids {', '.join(str(running[node_id]) for node_id in cluster.ids)}), "
            f"logs: {cluster.root}/node-*/broker.log",
            file=sys.stderr,
        )
        say_client_env(cluster)
        return cluster.bootstrap
    for node_id in down:
        busy = [
            port
            for port in (cluster.node(node_id).port, cluster.controller_port(node_id))
            if port_in_use(port)
        ]
        if busy:
            raise LocalKafkaError(
                f"port {busy[0]} on {HOST} (node {node_id} of the cluster) is used by another "
                "process; stop it or choose other ports with LOCAL_KAFKA_PORT=<first port>"
            )
    fetch(cluster.node(1))
    cluster.root.mkdir(parents=True, exist_ok=True)
    if fresh and len(down) == cluster.brokers:
        for node_id in cluster.ids:
            shutil.rmtree(cluster.node(node_id).data, ignore_errors=True)
        cluster.cluster_id_file.unlink(missing_ok=True)
    if not cluster.cluster_id_file.exists():
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        cluster.cluster_id_file.write_text(cluster_id + "\n")
    cluster_id = cluster.cluster_id_file.read_text().strip()
    for node_id in cluster.ids:
        cluster.node(node_id).root.mkdir(parents=True, exist_ok=True)
        write_node_properties(cluster, node_id)
        format_node(cluster, node_id, cluster_id)
    for node_id in down:
        running[node_id] = spawn_node(cluster.node(node_id))
    deadline = time.monotonic() + CLUSTER_START_TIMEOUT_S
    waiting = set(cluster.ids)
    while waiting and time.monotonic() < deadline:
        for node_id in sorted(waiting):
            node = cluster.node(node_id)
            if running_pid(node) is None:
                node.pid_file.unlink(missing_ok=True)
                raise LocalKafkaError(
                    f"node {node_id} exited during start-up; see {node.log}:\n{tail(node.log)}"
                )
            if answers_kafka(node.port):
                waiting.discard(node_id)
        time.sleep(0.2)
    if waiting:
        raise LocalKafkaError(
            f"node(s) {', '.join(map(str, sorted(waiting)))} did not accept connections within "
            f"{CLUSTER_START_TIMEOUT_S:.0f} s; see {cluster.root}/node-*/broker.log"
        )
    print(
        f"Apache Kafka {kafka_version()} cluster running ({cluster.describe()}; pids "
        f"{', '.join(str(running[node_id]) for node_id in cluster.ids)}), "
        f"logs: {cluster.root}/node-*/broker.log",
        file=sys.stderr,
    )
    say_client_env(cluster)
    return cluster.bootstrap


def stop_cluster(cluster: Cluster) -> bool:
    """Stop every node (all at once, so none waits for the others' controlled shutdown
    alone); False when none was running."""
    pids = {
        node_id: pid
        for node_id in cluster.ids
        if (pid := running_pid(cluster.node(node_id))) is not None
    }
    for pid in pids.values():
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and any(
        running_pid(cluster.node(node_id)) is not None for node_id in pids
    ):
        time.sleep(0.2)
    for node_id, pid in pids.items():
        if running_pid(cluster.node(node_id)) is not None:
            os.kill(pid, signal.SIGKILL)
        cluster.node(node_id).pid_file.unlink(missing_ok=True)
    return bool(pids)


def cluster_status(cluster: Cluster) -> tuple[str, bool]:
    """One line per node; True when every node runs."""
    lines = []
    for node_id in cluster.ids:
        node = cluster.node(node_id)
        pid = running_pid(node)
        lines.append(
            f"node {node_id}: "
            + (f"running (pid {pid}) at {node.bootstrap}" if pid else "not running")
        )
    return "\n".join(lines), all("not running" not in line for line in lines)


def cluster_size(given: int | None) -> int:
    """`--brokers`, else LOCAL_KAFKA_BROKERS, else 1; checked."""
    text = str(given) if given is not None else os.environ.get("LOCAL_KAFKA_BROKERS") or "1"
    if not text.isdigit() or not 1 <= int(text) <= 9:
        raise LocalKafkaError(f"--brokers / LOCAL_KAFKA_BROKERS must be 1 to 9, got {text!r}")
    return int(text)


def client_settings(cluster: Cluster) -> dict[str, str]:
    """What a command of the product needs for this cluster: its bootstrap, the replication a
    production cluster's topics get, and where it is (LOCAL_KAFKA_*, so that `make kafka-stop`
    and `make tail` in a shell that sourced them follow it)."""
    return {
        "KAFKA_BOOTSTRAP_SERVERS": cluster.bootstrap,
        "KAFKA_SECURITY_PROTOCOL": "PLAINTEXT",
        "STREAMS_REPLICATION_FACTOR": str(min(3, cluster.brokers)),
        "STREAMS_MIN_INSYNC_REPLICAS": str(min(2, cluster.brokers)),
        "LOCAL_KAFKA_PORT": str(cluster.port),
        "LOCAL_KAFKA_BROKERS": str(cluster.brokers),
        "LOCAL_KAFKA_DIR": str(cluster.root),
    }


def say_client_env(cluster: Cluster) -> None:
    """Write <root>/client.env and say, on stderr, the line that sources it."""
    lines = [f"# the local Kafka cluster in {cluster.root}; use: set -a; . <this file>; set +a"]
    lines += [f"{name}={shlex.quote(value)}" for name, value in client_settings(cluster).items()]
    cluster.client_env.write_text("\n".join(lines) + "\n")
    quoted = shlex.quote(str(cluster.client_env))
    print(f"its client settings, for this shell: set -a; . {quoted}; set +a", file=sys.stderr)


def running_brokers(base: Path | None = None) -> list[tuple[str, str, str]]:
    """Every local broker and cluster running from its default place under `base` (what it
    is: "cluster" or "broker", what it is, the command that stops it), for a stop that found
    none where it looked."""
    base = base or Path.home() / ".cache" / "storage-events"
    found: list[tuple[str, str, str]] = []
    for root in sorted(base.glob("kafka*")):
        if root.name.startswith("kafka-cluster-") and root.name[14:].isdigit():
            port = int(root.name[14:])
            nodes = sorted(root.glob("node-*/broker.pid"))
            alive = [
                pid_file
                for pid_file in nodes
                if running_pid(Layout(root=pid_file.parent, port=port, heap=CLUSTER_HEAP))
            ]
            if alive:
                found.append(
                    (
                        "cluster",
                        f"the {len(nodes)}-node cluster in {root} (clients from port {port})",
                        f"LOCAL_KAFKA_PORT={port} make kafka-stop KAFKA_BROKERS={len(nodes)}",
                    )
                )
        elif root.name == "kafka" or (root.name.startswith("kafka-") and root.name[6:].isdigit()):
            port = int(root.name[6:]) if root.name != "kafka" else 9092
            if running_pid(Layout(root=root, port=port, heap="1g")):
                where = "" if port == 9092 else f"LOCAL_KAFKA_PORT={port} "
                found.append(
                    ("broker", f"the broker in {root} (port {port})", f"{where}make kafka-stop")
                )
    return found


def say_none_running(nothing: str, kind: str) -> int:
    """A stop that found nothing where it looked: says so; when a local `kind` ("broker",
    "cluster") runs from another default place (LOCAL_KAFKA_PORT moved it), names it and the
    command that stops it (exit 1), else exit 0. A stop given its LOCAL_KAFKA_DIR looked where
    it was told: exit 0."""
    others = [] if os.environ.get("LOCAL_KAFKA_DIR") else running_brokers()
    others = [(what, command) for found, what, command in others if found == kind]
    if not others:
        print(nothing)
        return 0
    named = "; ".join(f"{what}: `{command}`" for what, command in others)
    print(f"localkafka: {nothing}; running instead: {named}", file=sys.stderr)
    return 1


def cluster_main(command: str, brokers: int, fresh: bool) -> int:
    """`start`/`stop`/`status`/`env` of a local cluster (`--brokers N`, N > 1)."""
    cluster = Cluster.from_env(brokers)
    if command == "start":
        print(start_cluster(cluster, fresh=fresh))
    elif command == "env":
        for name, value in client_settings(cluster).items():
            print(f"{name}={shlex.quote(value)}")
    elif command == "stop":
        if stop_cluster(cluster):
            print(f"stopped the local Kafka cluster ({cluster.bootstrap})")
        else:
            return say_none_running(
                f"no local Kafka cluster is running ({cluster.root})", "cluster"
            )
    else:
        text, all_running = cluster_status(cluster)
        print(text)
        return 0 if all_running else 1
    return 0
