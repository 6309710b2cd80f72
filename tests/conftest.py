"""Test-session fixtures: a real Apache Kafka broker, chosen in this order:

1. `KAFKA_BOOTSTRAP_SERVERS`, when set: an external broker, used as is;
2. testcontainers' Kafka module, when a Docker engine answers;
3. the project's own local broker (dev/kafka/localkafka.py), started fresh for the session on
   a free port, in ~/.cache/storage-events/test-kafka/<port>/ (STORAGE_EVENTS_TEST_KAFKA_DIR
   moves it), and stopped afterwards. Its directory (with `broker.log`) is deleted when every
   test passed and kept, its path printed last, when one failed (until the next session).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.local_broker import LOCAL_KAFKA, free_port_pair, kafka_version
from support.secured_broker import mtls_kafka, secured_kafka  # noqa: F401  (fixtures)

TEST_BROKER_DIR = Path(
    os.environ.get("STORAGE_EVENTS_TEST_KAFKA_DIR")
    or Path.home() / ".cache" / "storage-events" / "test-kafka"
)
BROKER_DIR = pytest.StashKey[Path]()
"""The local broker's directory this session started, for pytest_sessionfinish."""
OWNER_FILE = "owner.pid"

_broker_description: list[str] = []


def docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


def broker_choice() -> str:
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        return "external"
    if docker_answers():
        return "testcontainers"
    return "local"


def reap_abandoned_brokers() -> None:
    """Stop the brokers of test sessions that died without stopping theirs.

    Each session's broker has its own directory (one per port) naming the pytest process
    that owns it, so concurrent sessions never touch each other's broker.
    """
    if not TEST_BROKER_DIR.is_dir():
        return
    for broker_dir in TEST_BROKER_DIR.iterdir():
        if not (broker_dir.is_dir() and broker_dir.name.isdigit()):
            continue
        owner = broker_dir / OWNER_FILE
        try:
            os.kill(int(owner.read_text()), 0)
            continue  # its session still runs
        except (FileNotFoundError, ValueError, ProcessLookupError):
            pass
        except PermissionError:
            continue
        env = {
            **os.environ,
            "LOCAL_KAFKA_DIR": str(broker_dir),
            "LOCAL_KAFKA_PORT": broker_dir.name if broker_dir.name.isdigit() else "9092",
        }
        subprocess.run(
            [sys.executable, str(LOCAL_KAFKA), "stop"], env=env, check=False, capture_output=True
        )
        shutil.rmtree(broker_dir, ignore_errors=True)


def pytest_report_header(config: pytest.Config) -> list[str]:
    from streams.core import compiled

    core = f"streams.core: {compiled.STATE} (streams/core/compiled.py)"
    return [kafka_header(), core]


def kafka_header() -> str:
    choice = broker_choice()
    if choice == "external":
        given = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
        return f"kafka: external broker KAFKA_BOOTSTRAP_SERVERS={given}"
    if choice == "testcontainers":
        return "kafka: testcontainers Kafka module (a Docker engine answered)"
    return (
        f"kafka: Apache Kafka {kafka_version()} (KRaft), started by the test session "
        f"from Maven Central jars (dev/kafka/localkafka.py)"
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The session's local broker was stopped by its fixture: delete its directory if every
    test passed, else keep it and say where its log is (the summary prints this last)."""
    broker_dir = session.config.stash.get(BROKER_DIR, None)
    if broker_dir is None:
        return
    if exitstatus == pytest.ExitCode.OK:
        shutil.rmtree(broker_dir, ignore_errors=True)
        _broker_description.append("its directory and broker log were deleted: every test passed")
        return
    (broker_dir / OWNER_FILE).unlink(missing_ok=True)  # the next session may reap it
    _broker_description.append(
        f"broker log kept (tests failed), until the next test session: {broker_dir / 'broker.log'}"
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _broker_description:
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> Iterator[str]:
    """The bootstrap address of a real Kafka broker for the whole session."""
    choice = broker_choice()
    if choice == "external":
        bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
        _broker_description.append(f"integration tests ran against the external broker {bootstrap}")
        yield bootstrap
        return
    if choice == "testcontainers":
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as container:
            bootstrap = container.get_bootstrap_server()
            _broker_description.append(
                f"integration tests ran against a testcontainers Kafka at {bootstrap}"
            )
            yield bootstrap
        return
    reap_abandoned_brokers()
    port = free_port_pair()
    broker_dir = TEST_BROKER_DIR / str(port)
    broker_dir.mkdir(parents=True, exist_ok=True)
    (broker_dir / OWNER_FILE).write_text(str(os.getpid()))
    env = {**os.environ, "LOCAL_KAFKA_DIR": str(broker_dir), "LOCAL_KAFKA_PORT": str(port)}
    started = subprocess.run(
        [sys.executable, str(LOCAL_KAFKA), "start", "--fresh"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if started.returncode != 0:
        pytest.exit(
            f"could not start the local Kafka broker: {started.stderr.strip()}", returncode=3
        )
    bootstrap = started.stdout.strip().splitlines()[-1]
    _broker_description.append(
        f"integration tests ran against Apache Kafka {kafka_version()} (KRaft) at {bootstrap}, "
        f"started by the test session in {broker_dir}"
    )
    request.config.stash[BROKER_DIR] = broker_dir
    try:
        yield bootstrap
    finally:
        subprocess.run(
            [sys.executable, str(LOCAL_KAFKA), "stop"], env=env, check=False, capture_output=True
        )
