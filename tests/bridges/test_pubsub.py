"""The Pub/Sub pull bridge: acknowledge only what Kafka holds, leave what it does not.

The bridge is the pull bridges' shared loop (`connectors.pull.PullBridge`, whose
ack-after-publish rule `tests/bridges/test_sqs.py` checks call by call) over Pub/Sub's unary
Pull. Here it runs as `python -m connectors pubsub` against Google's Pub/Sub emulator (the
`cloud-pubsub-emulator` of the Google Cloud CLI, package google-cloud-cli-pubsub-emulator; no
package registry this project installs from carries it, so these tests are skipped without
it), with a real worker. `PUBSUB_EMULATOR_HOST` names an emulator already running;
`PUBSUB_EMULATOR_BIN` the emulator's start script. Unusable credentials are checked without
the emulator.
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
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from support.bridge_process import BridgeProcess
from support.kafka_io import read_topic
from support.payloads import gcs_attributes, gcs_resource
from support.pubsub_emulator import NO_METADATA, emulator  # noqa: F401 (the fixture)
from support.worker import ROOT, Topology, Worker, free_port, wait_for

pytestmark = pytest.mark.kafka


async def create_topic(bootstrap: str, name: str, config: dict[str, str] | None = None) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 1, 1, topic_configs=config or {})])
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

    def subscription(self) -> tuple[str, str]:
        tag = uuid.uuid4().hex[:8]
        topic = self.publisher.topic_path(self.project, f"gcs-{tag}")
        subscription = self.subscriber.subscription_path(self.project, f"bridge-{tag}")
        self.publisher.create_topic(name=topic)
        self.subscriber.create_subscription(name=subscription, topic=topic)
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

    def __init__(self, bootstrap: str, host: str, workdir: Path, *args: str) -> None:
        self.metrics_port = free_port()
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
                env=bridge_env(bootstrap, host),
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


def test_a_message_kafka_does_not_acknowledge_is_nacked_and_delivered_again(
    kafka_bootstrap: str, pubsub: PubSub, tmp_path: Path
) -> None:
    refusing = f"pubsub-refusing-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(kafka_bootstrap, refusing, {"max.message.bytes": "64"}))
    topic, subscription = pubsub.subscription()
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
    )
    try:
        # Refused, left, redelivered by Pub/Sub after the ack deadline, refused again: the one
        # message published was handled at least twice, and never acknowledged.
        bridge.wait_metric("bridge_pull_publish_failures_total", 2, timeout_s=60)
        assert bridge.metric("bridge_pull_deleted_total") == 0
    finally:
        assert bridge.stop() == 0, bridge.log()
    assert bridge.log().count(f"message {message_id}") >= 2
    assert asyncio.run(read_topic(kafka_bootstrap, refusing)) == []


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
