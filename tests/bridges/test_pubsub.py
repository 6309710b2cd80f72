"""The Pub/Sub pull bridge: acknowledge only what Kafka holds, leave what it does not.

The bridge is the pull bridges' shared loop (`connectors.pull.PullBridge`, whose
ack-after-publish rule `tests/bridges/test_sqs.py` checks call by call) over Pub/Sub's unary
Pull. Here it runs as `python -m connectors pubsub` against a real Pub/Sub server
(`support.pubsub_emulator`: the Google Cloud CLI's emulator where installed, else Google's Go
fake `pstest`, which `make test-deps` builds from dev/pubsub-fake) and the session's Kafka
broker: pull and acknowledge, redelivery of what Kafka refused, ack deadlines extended
(ModifyAckDeadline) while a write is slow, and a message too large for the raw topic
dead-lettered. A topic with `min.insync.replicas=2` on the one-broker cluster is Kafka
refusing every write (NOT_ENOUGH_REPLICAS, retried until the publish timeout); setting it
back to 1 is Kafka taking writes again. Unusable credentials are checked without a server.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from support.bridge_process import BridgeProcess
from support.kafka_io import Read, create_topic, read_topic
from support.local_broker import PrivateBroker
from support.payloads import gcs_attributes, gcs_resource
from support.pubsub_emulator import NO_METADATA, emulator  # noqa: F401 (the fixture)
from support.worker import ROOT, Topology, Worker, free_port, wait_for

from streams.engine.topics import MAX_MESSAGE_BYTES, RAW_MAX_MESSAGE_BYTES

pytestmark = pytest.mark.kafka


async def set_max_message_bytes(bootstrap: str, name: str, limit: int) -> None:
    """Set topic `name`'s record limit (a small one: Kafka refuses every write to it)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.alter_configs(
            [
                ConfigResource(
                    ConfigResourceType.TOPIC, name, configs={"max.message.bytes": str(limit)}
                )
            ]
        )
    finally:
        await admin.close()


def gcs_message(name: str, generation: str, event_type: str) -> tuple[bytes, dict[str, str]]:
    resource = gcs_resource(name, generation)
    return json.dumps(resource).encode(), gcs_attributes(resource, event_type)


def test_unusable_credentials_are_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "PUBSUB_EMULATOR_HOST"}
    env.update(NO_METADATA, GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / "missing.json"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "connectors",
            "pubsub",
            "--subscription",
            "projects/p/subscriptions/s",
        ],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "no usable Google credentials" in lines[0]


# --- end to end, against the Pub/Sub emulator -------------------------------------------


class PubSub:
    """Topics and subscriptions on the emulator, made with the library itself."""

    def __init__(self, host: str, monkeypatch: pytest.MonkeyPatch) -> None:
        from google.cloud import pubsub_v1

        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", host)
        self.host = host
        self.project = "storage-events-test"
        self.publisher = pubsub_v1.PublisherClient()
        self.subscriber = pubsub_v1.SubscriberClient()

    def subscription(self, ack_deadline_s: int = 10) -> tuple[str, str]:
        """A new topic and a subscription to it (10 s: the service's least ack deadline)."""
        tag = uuid.uuid4().hex[:8]
        topic = self.publisher.topic_path(self.project, f"gcs-{tag}")
        subscription = self.subscriber.subscription_path(self.project, f"bridge-{tag}")
        self.publisher.create_topic(name=topic)
        self.subscriber.create_subscription(
            name=subscription, topic=topic, ack_deadline_seconds=ack_deadline_s
        )
        return topic, subscription

    def publish(self, topic: str, data: bytes, attributes: dict[str, str]) -> str:
        return str(self.publisher.publish(topic, data, **attributes).result(30))

    def close(self) -> None:
        self.publisher.stop()
        self.subscriber.close()


@pytest.fixture
def pubsub(
    emulator: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[PubSub]:
    client = PubSub(emulator, monkeypatch)
    try:
        yield client
    finally:
        client.close()


class Bridge(BridgeProcess):
    """One `python -m connectors pubsub` process against the emulator."""

    def __init__(
        self,
        bootstrap: str,
        host: str,
        workdir: Path,
        *args: str,
        config: Path | None = None,
    ) -> None:
        self.metrics_port = free_port()
        env = bridge_env(bootstrap, host)
        if config is not None:
            env["STREAMS_CONFIG"] = str(config)
        self.log_path = workdir / f"pubsub-bridge-{uuid.uuid4().hex[:6]}.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "connectors",
                    "pubsub",
                    *args,
                    "--metrics-port",
                    str(self.metrics_port),
                ],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )


def bridge_env(bootstrap: str, host: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "STREAMS_CONFIG"}
    env.update(NO_METADATA, KAFKA_BOOTSTRAP_SERVERS=bootstrap, PUBSUB_EMULATOR_HOST=host)
    return env


@pytest.fixture(scope="module")
def stream(
    kafka_bootstrap: str,
    emulator: str,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Topology, Worker]]:
    names = Topology()
    worker = Worker(
        kafka_bootstrap, names.config(), tmp_path_factory.mktemp("pubsub-stream")
    ).start()
    try:
        yield names, worker
    finally:
        assert worker.stop() == 0, worker.tail()


def output_events(bootstrap: str, names: Topology, key: str) -> list[dict[str, Any]]:
    found = [read.json() for read in asyncio.run(read_topic(bootstrap, names.output("default")))]
    return [event for event in found if event["key"] == key]


def test_gcs_notifications_reach_the_output_topic_and_are_acked(
    kafka_bootstrap: str,
    pubsub: PubSub,
    stream: tuple[Topology, Worker],
    tmp_path: Path,
) -> None:
    names, worker = stream
    topic, subscription = pubsub.subscription()
    name = f"{uuid.uuid4().hex[:8]}/photo 1+1.png"
    bridge = Bridge(
        kafka_bootstrap, pubsub.host, tmp_path, "--subscription", subscription, "--topic", names.raw
    )
    sent: dict[str, tuple[bytes, dict[str, str]]] = {}
    try:
        for count, event_type in enumerate(("OBJECT_FINALIZE", "OBJECT_DELETE"), start=1):
            data, attributes = gcs_message(name, "1700000000000001", event_type)
            sent[pubsub.publish(topic, data, attributes)] = (data, attributes)
            try:
                events = wait_for(
                    lambda n=count: (
                        (found := output_events(kafka_bootstrap, names, name))
                        and len(found) >= n
                        and found
                    ),
                    60,
                    f"{count} event(s) for {name!r} on the output topic",
                    interval_s=0.3,
                )
            except TimeoutError as exc:
                raise AssertionError(f"{exc}\n{bridge.log()}\n{worker.tail()}") from None
        bridge.wait_metric("bridge_pull_deleted_total", 2)
        assert bridge.metric("bridge_pull_publish_failures_total") == 0
    finally:
        assert bridge.stop() == 0, bridge.log()

    assert [event["type"] for event in events] == ["created", "deleted"]
    records = [
        read
        for read in asyncio.run(read_topic(kafka_bootstrap, names.raw))
        if read.headers["delivery-id"].decode() in sent
    ]
    assert len(records) == 2
    for record in records:
        data, attributes = sent[record.headers["delivery-id"].decode()]
        assert record.value == data
        assert record.headers["source"] == b"gcs"
        assert record.headers["transport"] == b"pubsub-pull"
        assert {
            key.removeprefix("attribute."): value.decode()
            for key, value in record.headers.items()
            if key.startswith("attribute.")
        } == attributes


def raw_records(bootstrap: str, topic: str) -> list[Read]:
    return asyncio.run(read_topic(bootstrap, topic))


def test_a_message_kafka_refuses_is_left_delivered_again_and_acked_once_written(
    kafka_bootstrap: str, pubsub: PubSub, tmp_path: Path
) -> None:
    refusing = f"pubsub-refusing-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(kafka_bootstrap, refusing, config={"max.message.bytes": "64"}))
    topic, subscription = pubsub.subscription(ack_deadline_s=10)
    message_id = pubsub.publish(topic, *gcs_message("kept/x.png", "1", "OBJECT_FINALIZE"))

    bridge = Bridge(
        kafka_bootstrap,
        pubsub.host,
        tmp_path,
        "--subscription",
        subscription,
        "--topic",
        refusing,
        "--publish-timeout",
        "2",
        "--wait-time",
        "1",
    )
    try:
        # Refused, left, delivered again by Pub/Sub after the ack deadline, refused again:
        # handled twice, acknowledged never, nothing in Kafka.
        bridge.wait_metric("bridge_pull_publish_failures_total", 2, timeout_s=60)
        assert bridge.metric("bridge_pull_received_total") >= 2
        assert bridge.metric("bridge_pull_deleted_total") == 0
        assert raw_records(kafka_bootstrap, refusing) == []
        # Kafka takes writes again: the next delivery is written, then acknowledged.
        asyncio.run(set_max_message_bytes(kafka_bootstrap, refusing, 1024 * 1024))
        bridge.wait_metric("bridge_pull_deleted_total", 1, timeout_s=60)
    finally:
        assert bridge.stop() == 0, bridge.log()
    assert bridge.log().count(f"message {message_id}") >= 2
    records = raw_records(kafka_bootstrap, refusing)
    assert [record.headers["delivery-id"] for record in records] == [message_id.encode()]


def test_a_write_pending_while_kafka_is_away_keeps_its_ack_deadline_and_is_delivered_once(
    pubsub: PubSub, tmp_path: Path
) -> None:
    broker = PrivateBroker(tmp_path / "kafka")
    bootstrap = broker.start(fresh=True)
    slow = "raw-slow"
    topic, subscription = pubsub.subscription(ack_deadline_s=10)
    bridge = Bridge(
        bootstrap,
        pubsub.host,
        tmp_path,
        "--subscription",
        subscription,
        "--topic",
        slow,
        "--publish-timeout",
        "90",
        "--wait-time",
        "1",
    )
    try:
        first = pubsub.publish(topic, *gcs_message("slow/1.png", "1", "OBJECT_FINALIZE"))
        bridge.wait_metric("bridge_pull_deleted_total", 1, timeout_s=60)
        broker.stop()
        second = pubsub.publish(topic, *gcs_message("slow/2.png", "1", "OBJECT_FINALIZE"))
        bridge.wait_metric("bridge_pull_received_total", 2)
        # The producer retries the write while the broker is away; the ack deadline is
        # extended every 5 s. Three extensions are 15 s in hand, past the 10 s deadline, while
        # the bridge kept pulling: without them Pub/Sub would have delivered it again by now.
        bridge.wait_metric("bridge_pull_extended_total", 3, timeout_s=40)
        assert bridge.metric("bridge_pull_received_total") == 2
        assert bridge.metric("bridge_pull_deleted_total") == 1
        broker.start()
        bridge.wait_metric("bridge_pull_deleted_total", 2, timeout_s=90)
        assert bridge.metric("bridge_pull_received_total") == 2
        assert bridge.metric("bridge_pull_publish_failures_total") == 0
        records = raw_records(bootstrap, slow)
    finally:
        try:
            assert bridge.stop() == 0, bridge.log()
        finally:
            broker.stop()
    assert [record.headers["delivery-id"] for record in records] == [
        first.encode(),
        second.encode(),
    ]


def test_a_message_too_large_for_the_raw_topic_is_dead_lettered_whole_and_acked(
    kafka_bootstrap: str, pubsub: PubSub, tmp_path: Path
) -> None:
    names = Topology()
    config = tmp_path / "streams.toml"
    config.write_text(names.config())
    limits = {"raw": names.raw, "dead-letter": names.dead_letter}
    for role, name in limits.items():
        limit = {"max.message.bytes": str(MAX_MESSAGE_BYTES[role])}
        asyncio.run(create_topic(kafka_bootstrap, name, config=limit))
    topic, subscription = pubsub.subscription()
    # Pub/Sub takes messages up to 10 MB; the raw topic records up to 4 MiB.
    big = os.urandom(9 * 1000 * 1000)
    assert len(big) > RAW_MAX_MESSAGE_BYTES
    big_attributes = {"eventType": "OBJECT_FINALIZE", "objectId": "big/video.mp4"}
    big_id = pubsub.publish(topic, big, big_attributes)
    small, small_attributes = gcs_message("small/x.png", "1", "OBJECT_FINALIZE")
    small_id = pubsub.publish(topic, small, small_attributes)

    bridge = Bridge(
        kafka_bootstrap,
        pubsub.host,
        tmp_path,
        "--subscription",
        subscription,
        "--wait-time",
        "1",
        config=config,
    )
    try:
        bridge.wait_metric("bridge_pull_deleted_total", 2, timeout_s=60)
        assert bridge.metric("bridge_pull_dead_lettered_total") == 1
        assert bridge.metric("bridge_pull_publish_failures_total") == 0
        assert bridge.metric("bridge_pull_received_total") == 2
    finally:
        assert bridge.stop() == 0, bridge.log()

    raw = raw_records(kafka_bootstrap, names.raw)
    assert [record.headers["delivery-id"] for record in raw] == [small_id.encode()]
    assert raw[0].value == small
    (letter,) = raw_records(kafka_bootstrap, names.dead_letter)
    assert letter.value == big
    assert letter.headers["delivery-id"] == big_id.encode()
    assert letter.headers["source"] == b"gcs"
    assert letter.headers["transport"] == b"pubsub-pull"
    assert {
        key.removeprefix("attribute."): value.decode()
        for key, value in letter.headers.items()
        if key.startswith("attribute.")
    } == big_attributes
    assert letter.headers["error.stage"] == b"bridge"
    assert letter.headers["error.topic"] == names.raw.encode()
    assert b"too large for the raw topic" in letter.headers["error"]
    assert str(len(big)).encode() in letter.headers["error"]


def test_a_missing_subscription_is_one_line_and_exit_2(
    kafka_bootstrap: str, pubsub: PubSub
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "connectors",
            "pubsub",
            "--subscription",
            f"projects/{pubsub.project}/subscriptions/no-such-subscription",
        ],
        cwd=ROOT,
        env=bridge_env(kafka_bootstrap, pubsub.host),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "no-such-subscription does not exist" in lines[0]
