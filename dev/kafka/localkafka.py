#!/usr/bin/env python3
"""A local, single-node Apache Kafka broker (KRaft combined mode) for development and tests.

The broker jars come from Maven Central through Maven (see pom.xml beside this file), resolved
once into a cache directory that later runs reuse. Standard library only: `make kafka` runs
this before any virtualenv exists.

    python3 dev/kafka/localkafka.py start    # start if not running, wait, print host:port last
    python3 dev/kafka/localkafka.py stop     # stop it (says so, exit 0, when none runs)
    python3 dev/kafka/localkafka.py status
    python3 dev/kafka/localkafka.py fetch    # only resolve the jars
    python3 dev/kafka/localkafka.py start --brokers 3   # a local three-broker cluster (below)
    python3 dev/kafka/localkafka.py env      # the client settings (client.env), for `eval`
    python3 dev/kafka/localkafka.py start --security sasl_ssl   # TLS + SCRAM-SHA-512 + ACLs
    python3 dev/kafka/localkafka.py start --security ssl        # mutual TLS + ACLs

Security (`--security` or LOCAL_KAFKA_SECURITY; `make kafka KAFKA_SECURITY=...`):
    plaintext  (default) a PLAINTEXT listener, no authorizer
    sasl_ssl   a SASL_SSL listener, SCRAM-SHA-512, ACLs on (StandardAuthorizer)
    ssl        an SSL listener requiring a client certificate (mutual TLS), ACLs on
A CA, the broker's certificate and an `admin` client certificate are generated once per state
directory (<dir>/tls/*.pem); the SCRAM user `admin` is created when the storage is formatted;
User:admin is a super user (so are User:broker, the broker itself, and User:ANONYMOUS, which
only the PLAINTEXT controller listener on 127.0.0.1 yields). Every start writes
<dir>/client.env: `set -a; . <dir>/client.env` points any command of the product at it.

A cluster (`--brokers N` or LOCAL_KAFKA_BROKERS; `make kafka KAFKA_BROKERS=3`): N nodes, each a
broker AND a KRaft controller (combined mode, N controllers: the quorum survives losing any one
node), clients on LOCAL_KAFKA_PORT (default 19092) .. + N - 1, controllers on the next N ports,
a 512m heap each, state in LOCAL_KAFKA_DIR (default ~/.cache/storage-events/kafka-cluster-<port>)
/node-<i>/; internal topics replicated N times, min.insync.replicas 2. `start` starts the nodes
that are not running (so it also brings back one that was killed) and prints the bootstrap of
all N last; `stop` and `status` take the same --brokers. Plaintext only.

Environment (all optional):
    LOCAL_KAFKA_DIR   state directory: libs cache, data, pid file, broker.log, client.env
                      (default ~/.cache/storage-events/kafka, or .../kafka-<port> when
                      LOCAL_KAFKA_PORT is not 9092: moving the port moves the broker, it never
                      rewrites one that runs). A directory whose broker runs on another port or
                      with other security is refused, naming that broker's pid and port.
    LOCAL_KAFKA_PORT  client port on 127.0.0.1 (default 9092); the controller uses port + 1
    LOCAL_KAFKA_HEAP  JVM heap (default 1g: the broker is one of several processes on a
                      2-core / 24 GiB machine)
    LOCAL_KAFKA_PROXIED  <port>:<advertised port>, plaintext only: a second client listener
                      on <port> that advertises <advertised port>, where a test's fault proxy
                      (tests/support/fault_proxy.py) forwards to it; clients bootstrapped on
                      the advertised port reach the broker only through the proxy, while the
                      broker's own traffic (transaction markers) stays on LOCAL_KAFKA_PORT
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import time
import types
import uuid
from dataclasses import dataclass
from pathlib import Path

if __package__:
    from . import tls
else:  # run as a script: `python3 dev/kafka/localkafka.py`
    import tls

HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
LOG4J_CONFIG = HERE / "log4j2.properties"
HOST = "127.0.0.1"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
DEFAULT_PORT = 9092
SECURITY_MODES = ("plaintext", "sasl_ssl", "ssl")
LISTENER = {"plaintext": "PLAINTEXT", "sasl_ssl": "SASL_SSL", "ssl": "SSL"}
SASL_MECHANISM = "SCRAM-SHA-512"
ADMIN_USER = "admin"
SUPER_USERS = f"User:{ADMIN_USER};User:{tls.BROKER_NAME};User:ANONYMOUS"


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
    security: str = "plaintext"

    @classmethod
    def from_env(cls, security: str | None = None) -> Layout:
        port_text = os.environ.get("LOCAL_KAFKA_PORT") or str(DEFAULT_PORT)
        if not port_text.isdigit() or not 1024 <= int(port_text) < 65535:
            raise LocalKafkaError(f"LOCAL_KAFKA_PORT must be a port number, got {port_text!r}")
        port = int(port_text)
        root = Path(os.environ.get("LOCAL_KAFKA_DIR") or default_root(port))
        security = (security or os.environ.get("LOCAL_KAFKA_SECURITY") or "plaintext").lower()
        if security not in SECURITY_MODES:
            raise LocalKafkaError(
                f"--security / LOCAL_KAFKA_SECURITY must be one of {', '.join(SECURITY_MODES)}, "
                f"got {security!r}"
            )
        heap = os.environ.get("LOCAL_KAFKA_HEAP", "1g")
        return cls(root=root, port=port, heap=heap, security=security)

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

    @property
    def tls_dir(self) -> Path:
        return self.root / "tls"

    @property
    def client_env(self) -> Path:
        return self.root / "client.env"

    @property
    def admin_password_file(self) -> Path:
        # Written before the storage is formatted with it: the password of the SCRAM user
        # `admin` in this directory's data, for as long as the data lives.
        return self.root / "admin.password"

    @property
    def scram_marker(self) -> Path:
        # Present when the data was formatted with the SCRAM user (older data was not).
        return self.data / ".scram-users"

    @property
    def listener(self) -> str:
        return LISTENER[self.security]

    @property
    def admin_properties(self) -> Path:
        return self.root / "admin.properties"


def default_root(port: int) -> Path:
    """The state directory of the broker on `port`: one per port, so that moving the port
    starts a broker of its own instead of rewriting the one that runs."""
    base = Path.home() / ".cache" / "storage-events"
    return base / "kafka" if port == DEFAULT_PORT else base / f"kafka-{port}"


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


def proxied_listener(layout: Layout) -> tuple[str, str, str]:
    """The LOCAL_KAFKA_PROXIED listener's entries for `listeners`, `advertised.listeners` and
    the protocol map (each with a leading comma), or three empty strings without it."""
    spec = os.environ.get("LOCAL_KAFKA_PROXIED", "")
    if not spec:
        return "", "", ""
    port, _, advertised = spec.partition(":")
    if not (port.isdigit() and advertised.isdigit()) or layout.security != "plaintext":
        raise LocalKafkaError(
            f"LOCAL_KAFKA_PROXIED must be <port>:<advertised port> on a plaintext broker, "
            f"got {spec!r} ({layout.security})"
        )
    return (
        f",PROXIED://{HOST}:{port}",
        f",PROXIED://{HOST}:{advertised}",
        ",PROXIED:PLAINTEXT",
    )


def write_properties(layout: Layout) -> None:
    controller_port = layout.port + 1
    name = layout.listener
    proxied, proxied_advertised, proxied_protocol = proxied_listener(layout)
    layout.properties.write_text(
        "\n".join(
            [
                "process.roles=broker,controller",
                "node.id=1",
                f"controller.quorum.voters=1@{HOST}:{controller_port}",
                f"listeners={name}://{HOST}:{layout.port}{proxied},"
                f"CONTROLLER://{HOST}:{controller_port}",
                f"advertised.listeners={name}://{HOST}:{layout.port}{proxied_advertised}",
                "controller.listener.names=CONTROLLER",
                f"listener.security.protocol.map=CONTROLLER:PLAINTEXT,{name}:{name}"
                f"{proxied_protocol}",
                f"inter.broker.listener.name={name}",
                *security_properties(layout),
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
                *KIP848_GROUP_BOUNDS,
                "auto.create.topics.enable=true",
                "log.retention.hours=168",
                "log.cleaner.backoff.ms=1000",
                "",
            ]
        )
    )


KIP848_GROUP_BOUNDS = (
    "group.consumer.min.session.timeout.ms=6000",
    "group.consumer.min.heartbeat.interval.ms=1000",
)
"""KIP-848 groups may set a session timeout down to the worker's least (6 s) and a 1 s
heartbeat (streams.engine.librdkafka.group_config); Kafka's floors are 45 s and 5 s."""


def security_properties(layout: Layout) -> list[str]:
    """The broker properties of `layout.security` (none for plaintext): TLS from the PEM files
    of `ensure_credentials`, SCRAM for SASL_SSL, mutual TLS for SSL, and the authorizer."""
    if layout.security == "plaintext":
        return []
    prefix = f"listener.name.{layout.listener.lower()}"
    lines = [
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={layout.tls_dir / (tls.BROKER_NAME + '.keystore.pem')}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={layout.tls_dir / 'ca.pem'}",
        "ssl.endpoint.identification.algorithm=https",
        # A client certificate's principal is its CN (User:admin), not the whole DN.
        "ssl.principal.mapping.rules=RULE:^CN=([^,]+).*$/$1/,DEFAULT",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        f"super.users={SUPER_USERS}",
        "allow.everyone.if.no.acl.found=false",
    ]
    if layout.security == "ssl":
        lines.append("ssl.client.auth=required")
    else:
        password = layout.admin_password_file.read_text().strip()
        mechanism = SASL_MECHANISM.lower()
        lines += [
            f"sasl.enabled.mechanisms={SASL_MECHANISM}",
            f"sasl.mechanism.inter.broker.protocol={SASL_MECHANISM}",
            f"{prefix}.{mechanism}.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{ADMIN_USER}" password="{password}";',
        ]
    return lines


def ensure_credentials(layout: Layout) -> None:
    """The admin password, and for TLS the CA, the broker's and the admin's certificates:
    created once per state directory, kept across restarts (clients keep trusting the CA)."""
    layout.root.mkdir(parents=True, exist_ok=True)
    if not layout.admin_password_file.exists():
        layout.admin_password_file.touch(mode=0o600)
        layout.admin_password_file.write_text(secrets.token_hex(16) + "\n")
    if layout.security == "plaintext":
        return
    try:
        authority = tls.ca(layout.tls_dir)
        tls.issue(layout.tls_dir, tls.BROKER_NAME, authority)
        tls.issue(layout.tls_dir, ADMIN_USER, authority)
    except tls.TlsError as exc:
        raise LocalKafkaError(str(exc)) from None


def client_settings(layout: Layout) -> dict[str, str]:
    """The KAFKA_* variables a client of the product needs for this broker (as the admin)."""
    settings = {
        "KAFKA_BOOTSTRAP_SERVERS": layout.bootstrap,
        "KAFKA_SECURITY_PROTOCOL": layout.listener,
    }
    if layout.security != "plaintext":
        settings["KAFKA_SSL_CA_LOCATION"] = str(layout.tls_dir / "ca.pem")
    if layout.security == "sasl_ssl":
        settings |= {
            "KAFKA_SASL_MECHANISM": SASL_MECHANISM,
            "KAFKA_SASL_USERNAME": ADMIN_USER,
            "KAFKA_SASL_PASSWORD": layout.admin_password_file.read_text().strip(),
        }
    if layout.security == "ssl":
        settings |= {
            "KAFKA_SSL_CERT_LOCATION": str(layout.tls_dir / f"{ADMIN_USER}.pem"),
            "KAFKA_SSL_KEY_LOCATION": str(layout.tls_dir / f"{ADMIN_USER}.key"),
        }
    return settings


def write_client_env(layout: Layout) -> None:
    """<dir>/client.env, shell syntax: `set -a; . <dir>/client.env` exports the settings."""
    lines = [
        f"# the local Kafka broker in {layout.root} ({layout.security}); "
        "use: set -a; . <this file>; set +a"
    ]
    lines += [f"{name}={shlex.quote(value)}" for name, value in client_settings(layout).items()]
    # Where the broker is: `localkafka.py admin`, `make kafka-stop`, `make tail` in a shell that
    # sourced this file follow the broker it names, wherever LOCAL_KAFKA_PORT moved it.
    lines += [f"LOCAL_KAFKA_PORT={layout.port}", f"LOCAL_KAFKA_DIR={shlex.quote(str(layout.root))}"]
    layout.client_env.touch(mode=0o600)
    layout.client_env.write_text("\n".join(lines) + "\n")


def write_admin_properties(layout: Layout) -> None:
    """<dir>/admin.properties: the same admin connection for Java tools (`kafka-acls.sh
    --command-config`, `localkafka.py admin`)."""
    lines = [f"bootstrap.servers={layout.bootstrap}", f"security.protocol={layout.listener}"]
    if layout.security != "plaintext":
        lines += ["ssl.truststore.type=PEM", f"ssl.truststore.location={layout.tls_dir / 'ca.pem'}"]
    if layout.security == "ssl":
        keystore = layout.tls_dir / f"{ADMIN_USER}.keystore.pem"
        lines += ["ssl.keystore.type=PEM", f"ssl.keystore.location={keystore}"]
    if layout.security == "sasl_ssl":
        password = layout.admin_password_file.read_text().strip()
        lines += [
            f"sasl.mechanism={SASL_MECHANISM}",
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{ADMIN_USER}" password="{password}";',
        ]
    layout.admin_properties.touch(mode=0o600)
    layout.admin_properties.write_text("\n".join(lines) + "\n")


def admin(layout: Layout, commands: str) -> str:
    """Apply `commands` (kafka-acls.sh lines as `python -m streams acls` prints them, and
    `scram USER PASSWORD` lines) as the admin, with LocalAdmin.java; what it did."""
    if running_pid(layout) is None or not layout.admin_properties.exists():
        raise LocalKafkaError(f"no local Kafka broker is running ({layout.root}); start it first")
    words_per_line = []
    for line in commands.splitlines():
        # One command per line, in shell words (as the printed commands are quoted).
        if line.strip() and not line.lstrip().startswith("#"):
            words_per_line.append("\t".join(shlex.split(line)))
    command = java_command(layout, str(HERE / "LocalAdmin.java"), str(layout.admin_properties))
    heap = command.index(f"-Xms{layout.heap}")
    command[heap : heap + 2] = ["-Xms64m", "-Xmx256m"]  # a client, not a broker
    logging = command.index(f"-Dlog4j2.configurationFile={LOG4J_CONFIG}")
    command[logging] = f"-Dlog4j2.configurationFile={HERE / 'log4j2-tools.properties'}"
    result = subprocess.run(
        command, input="\n".join(words_per_line) + "\n", capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        detail = [line for line in result.stderr.splitlines() if "Exception" in line]
        raise LocalKafkaError(f"admin failed: {(detail or result.stderr.splitlines() or ['?'])[0]}")
    return result.stdout.strip()


def client_tls(layout: Layout) -> ssl.SSLContext | None:
    """What a probe of this broker's listener speaks TLS with (None: plaintext)."""
    if layout.security == "plaintext":
        return None
    context = ssl.create_default_context(cafile=str(layout.tls_dir / "ca.pem"))
    if layout.security == "ssl":
        context.load_cert_chain(
            layout.tls_dir / f"{ADMIN_USER}.pem", layout.tls_dir / f"{ADMIN_USER}.key"
        )
    return context


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
    """Format the data directory once, with the SCRAM user `admin` whatever the security (so
    a directory formatted for plaintext can later serve SASL_SSL)."""
    if (layout.data / "meta.properties").exists():
        if layout.security == "sasl_ssl" and not layout.scram_marker.exists():
            raise LocalKafkaError(
                f"{layout.data} was formatted without the SCRAM user {ADMIN_USER!r} "
                "(by an older localkafka); start with --fresh to re-create its data"
            )
        return
    password = layout.admin_password_file.read_text().strip()
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
            "--add-scram",
            f"{SASL_MECHANISM}=[name={ADMIN_USER},password={password}]",
        ),
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise LocalKafkaError(f"formatting {layout.data} failed: {detail[-1] if detail else '?'}")
    layout.scram_marker.write_text(f"{SASL_MECHANISM} {ADMIN_USER}\n")


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


def answers_kafka(port: int, context: ssl.SSLContext | None = None) -> bool:
    """True when the port speaks the Kafka protocol (an ApiVersions v0 round trip), over TLS
    with `context` (ApiVersions is answered before SASL authentication)."""
    client_id = b"localkafka"
    header = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id
    try:
        with contextlib.ExitStack() as stack:
            sock = stack.enter_context(socket.create_connection((HOST, port), timeout=2))
            if context is not None:
                sock = stack.enter_context(context.wrap_socket(sock, server_hostname=HOST))
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


def running_listener(layout: Layout) -> tuple[str, int] | None:
    """The security (a `SECURITY_MODES` name) and port the directory's broker was started
    with, from its server.properties; None when there is none to read."""
    try:
        text = layout.properties.read_text()
    except FileNotFoundError:
        return None
    match = re.search(r"^advertised\.listeners=(\w+)://[^:,]+:(\d+)", text, re.MULTILINE)
    if not match:
        return None
    names = {listener: mode for mode, listener in LISTENER.items()}
    return names.get(match.group(1), match.group(1).lower()), int(match.group(2))


def refuse_if_running_otherwise(layout: Layout, pid: int) -> None:
    """A directory in use by a running broker is never rewritten for another port or other
    security: that broker keeps running as it is, and this says so in one line."""
    found = running_listener(layout)
    if found is None or found == (layout.security, layout.port):
        return
    security, port = found
    raise LocalKafkaError(
        f"{layout.root} is in use by the broker running (pid {pid}) on port {port} "
        f"({security}); stop it first (localkafka.py stop with LOCAL_KAFKA_DIR={layout.root}) "
        "or choose another LOCAL_KAFKA_DIR"
    )


def with_running_security(layout: Layout) -> Layout:
    """`layout` with the security of the broker already running in it on its port: a start
    that names no security (`make run`, a second `make kafka`) joins that broker as it is."""
    found = running_listener(layout) if running_pid(layout) is not None else None
    if found is None or found[1] != layout.port or found[0] not in SECURITY_MODES:
        return layout
    return dataclasses.replace(layout, security=found[0])


def start(layout: Layout, fresh: bool = False) -> str:
    pid = running_pid(layout)
    if pid is not None:
        refuse_if_running_otherwise(layout, pid)
        if answers_kafka(layout.port, client_tls(layout)):
            write_client_env(layout)
            print(
                f"Apache Kafka {kafka_version()} already running (pid {pid}), log: {layout.log}",
                file=sys.stderr,
            )
            print(
                f"its client settings, for this shell: {source_line(layout.client_env)}",
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
    process: subprocess.Popen[bytes] | None = None
    if pid is None:
        # Only a directory without a running broker is (re)written; one whose broker is
        # still starting is waited for below.
        if fresh:
            shutil.rmtree(layout.data, ignore_errors=True)
        ensure_credentials(layout)
        write_properties(layout)
        format_storage(layout)
        write_client_env(layout)
        write_admin_properties(layout)
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
        if answers_kafka(layout.port, client_tls(layout)):
            print(
                f"Apache Kafka {kafka_version()} running ({layout.security}, pid {pid}), "
                f"log: {layout.log}",
                file=sys.stderr,
            )
            print(
                f"its client settings, for this shell: {source_line(layout.client_env)}",
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


def cluster_module() -> types.ModuleType:
    """dev/kafka/cluster.py, which uses this module's helpers (as a script, this module
    registers itself as `localkafka` first, so both share one LocalKafkaError)."""
    if __package__:
        from . import cluster
    else:
        sys.modules.setdefault("localkafka", sys.modules[__name__])
        import cluster  # type: ignore[no-redef]
    return cluster


def source_line(client_env: Path) -> str:
    """The shell line that exports a client.env's settings into the current shell."""
    return f"set -a; . {shlex.quote(str(client_env))}; set +a"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "command",
        choices=["start", "stop", "status", "fetch", "version", "env", "client-cert", "admin"],
        help="env: print the client settings (client.env); client-cert NAME: a client "
        "certificate for the principal User:NAME, signed by the broker's CA; admin: apply "
        "kafka-acls.sh lines (python -m streams acls) and `scram USER PASSWORD` lines from stdin",
    )
    parser.add_argument("name", nargs="?", help="with client-cert: the certificate's CN")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="with start: delete the broker's data first (tests use this)",
    )
    parser.add_argument(
        "--security",
        choices=SECURITY_MODES,
        help="with start: the client listener's security (default $LOCAL_KAFKA_SECURITY or "
        "plaintext)",
    )
    parser.add_argument(
        "--brokers",
        type=int,
        default=None,
        help="with start/stop/status: a local cluster of N brokers (default $LOCAL_KAFKA_BROKERS "
        "or 1: the single broker)",
    )
    args = parser.parse_args(argv)
    try:
        cluster = cluster_module()
        brokers = cluster.cluster_size(args.brokers)
        if brokers > 1 and args.command in ("start", "stop", "status", "env"):
            if (args.security or os.environ.get("LOCAL_KAFKA_SECURITY") or "plaintext") != (
                "plaintext"
            ):
                raise LocalKafkaError("--security is for the single broker; a cluster is plaintext")
            return cluster.cluster_main(args.command, brokers, args.fresh)
        layout = Layout.from_env(args.security)
        if args.command == "version":
            print(kafka_version())
        elif args.command == "env":
            if layout.client_env.exists():
                print(layout.client_env.read_text(), end="")
            else:
                for name, value in client_settings(layout).items():
                    print(f"{name}={shlex.quote(value)}")
        elif args.command == "admin":
            print(admin(layout, sys.stdin.read()))
        elif args.command == "client-cert":
            if not args.name or not re.fullmatch(r"[A-Za-z0-9._-]+", args.name):
                raise LocalKafkaError("client-cert takes a NAME of letters, digits, '.', '_', '-'")
            try:
                authority = tls.ca(layout.tls_dir)
                pair = tls.issue(layout.tls_dir, args.name, authority)
            except tls.TlsError as exc:
                raise LocalKafkaError(str(exc)) from None
            print(f"KAFKA_SSL_CERT_LOCATION={shlex.quote(str(pair.cert))}")
            print(f"KAFKA_SSL_KEY_LOCATION={shlex.quote(str(pair.key))}")
        elif args.command == "fetch":
            print(fetch(layout))
        elif args.command == "start":
            if not (args.security or os.environ.get("LOCAL_KAFKA_SECURITY")):
                layout = with_running_security(layout)
            print(start(layout, fresh=args.fresh))
        elif args.command == "stop":
            if stop(layout):
                print(f"stopped the local Kafka broker ({layout.bootstrap})")
            else:
                return cluster.say_none_running(
                    f"no local Kafka broker is running ({layout.root})", "broker"
                )
        else:
            pid = running_pid(layout)
            found = running_listener(layout) if pid else None
            if pid and found:
                print(f"running (pid {pid}) at {HOST}:{found[1]} ({found[0]})")
            else:
                print(f"running (pid {pid}) at {layout.bootstrap}" if pid else "not running")
            return 0 if pid else 1
    except LocalKafkaError as exc:
        print(f"localkafka: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
