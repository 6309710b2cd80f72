"""Least privilege on the secured broker (SASL_SSL, SCRAM-SHA-512, StandardAuthorizer).

Each component runs as its own SCRAM user holding only the ACLs `python -m streams acls`
prints for it, applied through the broker's admin tool exactly as printed: the webhook bridge
publishes a delivery, the worker takes it end to end, a `fileevents` consumer handles the
event (and dead-letters one its handler fails), and the bridge's principal is refused an
output topic (TopicAuthorizationFailed). Reconcile, which reads an output topic and publishes
like a bridge, runs with its own ACLs and not with a bridge's (S3 listing from moto).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import TopicAuthorizationFailedError, for_code
from aiokafka.protocol.metadata import MetadataRequest
from support.moto_server import aws_client, unique_name
from support.secured_broker import SecuredBroker
from support.worker import ROOT, Topology, Worker, free_port, wait_for

from fileevents import FileEvent, FileEvents, KafkaSettings, RetryPolicy

pytestmark = pytest.mark.kafka
pytest_plugins = ["support.moto_server"]

EXAMPLE = ROOT / "examples" / "s3-put.json"
CONSUMER_GROUP = "thumbnails"


def product_env(**settings: str) -> dict[str, str]:
    """The environment of a product command: the test's, without a config of its own."""
    inherited = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("KAFKA_", "STREAMS_", "WEBHOOK_"))
    }
    return inherited | settings


def printed_acls(config: Path, principal: str, component: str, *extra: str) -> str:
    result = subprocess.run(
        [
            *(sys.executable, "-m", "streams", "acls", "--config", str(config)),
            *("--principal", principal, "--component", component, *extra),
        ],
        cwd=ROOT,
        env=product_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@dataclass
class Granted:
    """Topics created by the admin; one SCRAM user per component, with its ACLs only."""

    names: Topology
    config: Path
    worker: dict[str, str]
    bridge: dict[str, str]
    consumer: dict[str, str]

    @property
    def output(self) -> str:
        return self.names.output("default")

    @property
    def consumer_dead_letter(self) -> str:
        return f"{self.output}.dead-letter"


@pytest.fixture(scope="module")
def granted(secured_kafka: SecuredBroker, tmp_path_factory: pytest.TempPathFactory) -> Granted:
    names = Topology()
    config = tmp_path_factory.mktemp("acls") / "streams.toml"
    config.write_text(names.config())
    # The admin creates the topics, as the KafkaTopic resources do in k8s/topics.
    created = subprocess.run(
        [sys.executable, "-m", "streams", "create-topics", "--config", str(config)],
        cwd=ROOT,
        env=product_env(**secured_kafka.client_env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert created.returncode == 0, created.stderr
    suffix = names.suffix
    users = {
        component: secured_kafka.user(f"{component}-{suffix}")
        for component in ("worker", "bridge", "consumer")
    }
    granted = Granted(names, config, users["worker"], users["bridge"], users["consumer"])
    asyncio.run(create_topic(secured_kafka.client_env, granted.consumer_dead_letter))
    for component, extra in (
        ("worker", ()),
        ("bridge", ()),
        ("consumer", ("--instance", "default", "--group", CONSUMER_GROUP)),
    ):
        principal = f"User:{users[component]['KAFKA_SASL_USERNAME']}"
        secured_kafka.admin(printed_acls(config, principal, component, *extra))
    return granted


async def create_topic(admin_env: dict[str, str], topic: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(**KafkaSettings.from_environ(admin_env).aiokafka_args())
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 2, 1)])
    finally:
        await admin.close()


@pytest.fixture
def webhook(granted: Granted, tmp_path: Path) -> Iterator[str]:
    """The webhook bridge as the bridge's principal; its base URL."""
    port = free_port()
    log_path = tmp_path / "webhook.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "connectors", "webhook"],
            cwd=ROOT,
            env=product_env(
                **granted.bridge,
                STREAMS_CONFIG=str(granted.config),
                WEBHOOK_PORT=str(port),
                WEBHOOK_RAW_TOPIC=granted.names.raw,
                WEBHOOK_INSECURE_SOURCES="s3",
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"webhook exited {process.returncode}:\n{log_path.read_text()}")
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    try:
        wait_for(healthy, 60, "the webhook bridge's /healthz")
        yield base
    finally:
        process.terminate()
        process.wait(30)


def post(base: str, body: bytes) -> int:
    request = urllib.request.Request(f"{base}/hooks/s3", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return int(response.status)


async def consume_until(
    events: FileEvents,
    handled: list[FileEvent],
    dead_letters: list[bytes],
    admin_env: dict[str, str],
    topic: str,
) -> None:
    """Run `events` until one event was handled and one dead-lettered (read as the admin)."""
    running = asyncio.create_task(events.run())
    reader = AIOKafkaConsumer(
        topic,
        **KafkaSettings.from_environ(admin_env).aiokafka_args(),
        group_id=None,
        auto_offset_reset="earliest",
    )
    await reader.start()
    try:
        deadline = asyncio.get_running_loop().time() + 90
        while not (handled and dead_letters):
            if running.done():
                running.result()  # raises what stopped it
                raise AssertionError("the consumer stopped")
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"handled {len(handled)}, dead-lettered {len(dead_letters)}")
            batches = await reader.getmany(timeout_ms=500)
            dead_letters += [m.value or b"" for batch in batches.values() for m in batch]
    finally:
        await reader.stop()
        events.stop()
        await asyncio.wait_for(running, 60)


def test_each_component_works_with_only_its_acls(
    secured_kafka: SecuredBroker, granted: Granted, webhook: str, tmp_path: Path
) -> None:
    worker = Worker(
        secured_kafka.bootstrap,
        granted.config.read_text(),
        tmp_path / "worker",
        env={**granted.worker, "KAFKA_BOOTSTRAP_SERVERS": secured_kafka.bootstrap},
    )
    worker.start(timeout_s=120)
    try:
        body = EXAMPLE.read_text()
        assert post(webhook, body.encode()) in (200, 202)
        failing = body.replace("red+flower", "broken+flower").replace(
            "0055AED6DCD90281E5", "0055AED6DCD90281F7"
        )
        assert post(webhook, failing.encode()) in (200, 202)
        worker.wait_metric("storage_events_emitted_total", 2, instance="default")
    finally:
        assert worker.stop() == 0, worker.tail()

    handled: list[FileEvent] = []
    events = FileEvents(
        kafka=KafkaSettings.from_environ(granted.consumer),
        topic=granted.output,
        group_id=CONSUMER_GROUP,
        retry=RetryPolicy(attempts=1),
        dead_letter_topic=granted.consumer_dead_letter,
        handle_signals=False,
    )

    @events.on("created")
    async def make_thumbnail(event: FileEvent) -> None:
        if event.key.startswith("photos/broken"):
            raise RuntimeError("cannot make a thumbnail of this one")
        handled.append(event)

    dead_letters: list[bytes] = []
    asyncio.run(
        consume_until(
            events, handled, dead_letters, secured_kafka.client_env, granted.consumer_dead_letter
        )
    )
    assert [event.key for event in handled] == ["photos/red flower.jpg"]
    assert len(dead_letters) == 1 and b"broken" in dead_letters[0]


async def metadata_as(settings: dict[str, str], topic: str) -> None:
    """Ask for `topic`'s partitions as a reader does first (Metadata, which needs Describe,
    implied by Read); raise the broker's answer for it, if an error."""
    client = AIOKafkaClient(**KafkaSettings.from_environ(settings).aiokafka_args())
    await client.bootstrap()
    try:
        response = await client.send(
            client.get_random_node(), MetadataRequest([topic], allow_auto_topic_creation=False)
        )
    finally:
        await client.close()
    (error_code, name, *_), *_ = response.topics
    assert name == topic
    if error_code:
        raise for_code(error_code)(topic)


def test_a_bridge_principal_cannot_read_an_output_topic(granted: Granted) -> None:
    asyncio.run(metadata_as(granted.consumer, granted.output))  # the consumer may
    with pytest.raises(TopicAuthorizationFailedError):
        asyncio.run(metadata_as(granted.bridge, granted.output))


def test_a_bridge_principal_cannot_write_another_topic(granted: Granted) -> None:
    async def write(topic: str) -> None:
        producer = AIOKafkaProducer(
            **KafkaSettings.from_environ(granted.bridge).aiokafka_args(), enable_idempotence=True
        )
        await producer.start()
        try:
            await asyncio.wait_for(producer.send_and_wait(topic, b"x"), 30)
        finally:
            await producer.stop()

    asyncio.run(write(granted.names.raw))  # its own raw topic: allowed
    with pytest.raises(TopicAuthorizationFailedError):
        asyncio.run(write(granted.output))


def test_reconcile_works_with_its_acls_and_not_with_a_bridges(
    secured_kafka: SecuredBroker, granted: Granted, moto_server: str
) -> None:
    bucket = unique_name("acl-reconcile")
    s3 = aws_client(moto_server, "s3")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="missed.txt", Body=b"never notified")
    user = secured_kafka.user(f"reconcile-{granted.names.suffix}")
    principal = f"User:{user['KAFKA_SASL_USERNAME']}"
    secured_kafka.admin(
        printed_acls(granted.config, principal, "reconcile", "--instance", "default")
    )

    def reconcile(settings: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                *(sys.executable, "-m", "connectors", "--config", str(granted.config)),
                *("reconcile", "--instance", "default", "--bucket", bucket),
                *("--endpoint-url", moto_server, "--read-timeout", "30", *extra),
            ],
            cwd=ROOT,
            env=product_env(**settings),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    # A bridge may not read what reconcile compares the listing with: the worker's keys
    # changelog (the default), nor the output topic (`--known-from output`). Each is named as
    # the permission problem it is, not as a missing topic.
    keys_changelog = f"{granted.names.app_id}-keys-changelog"
    as_bridge = reconcile(granted.bridge)
    assert as_bridge.returncode == 1, as_bridge.stdout + as_bridge.stderr
    assert keys_changelog in as_bridge.stderr
    assert "this principal lacks Describe/Read on it" in as_bridge.stderr
    assert "does not exist" not in as_bridge.stderr
    as_bridge = reconcile(granted.bridge, "--known-from", "output")
    assert as_bridge.returncode == 1, as_bridge.stdout + as_bridge.stderr
    assert f"not authorized to read output topic {granted.output}" in as_bridge.stderr
    assert "does not exist" not in as_bridge.stderr
    as_reconcile = reconcile(user)
    assert as_reconcile.returncode == 0, as_reconcile.stderr
    assert "created missed.txt (not-in-stream)" in as_reconcile.stdout
    assert as_reconcile.stdout.strip().splitlines()[-1].endswith(" published=1")
