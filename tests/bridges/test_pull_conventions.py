"""The three pull bridges keep one convention: one loop, one metric family, one exit code.

Each bridge runs as `python -m connectors <bridge>` against its emulator (moto's SQS, Azurite's
queue service, Google's Pub/Sub emulator where installed) and the real broker:

* a missing queue (or subscription) is one line on stderr and exit 2;
* after it published a message, its `/metrics` carry the same `bridge_pull_*` names as the
  others', every sample labelled with exactly `bridge` and `queue`, and nothing of the old
  per-bridge families (`bridge_azure_queue_*`, `bridge_pubsub_*`).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from azure.storage.queue import QueueClient
from support.azurite import Azurite, azurite  # noqa: F401 (the fixture)
from support.bridge_process import BridgeProcess
from support.kafka_io import create_topic
from support.moto_server import aws_client, unique_name
from support.pubsub_emulator import NO_METADATA, emulator  # noqa: F401 (the fixture)
from support.worker import ROOT, free_port

pytestmark = pytest.mark.kafka
pytest_plugins = ["support.moto_server"]

BRIDGES = ("sqs", "azure-queue", "pubsub")
FAMILY = {
    "bridge_pull_received_total",
    "bridge_pull_published_total",
    "bridge_pull_deleted_total",
    "bridge_pull_publish_failures_total",
    "bridge_pull_delete_failures_total",
    "bridge_pull_receive_errors_total",
    "bridge_pull_released_total",
    "bridge_pull_dead_lettered_total",
    "bridge_pull_extended_total",
    "bridge_pull_in_flight",
    "bridge_pull_publish_seconds_bucket",
    "bridge_pull_publish_seconds_count",
    "bridge_pull_publish_seconds_sum",
}
"""Every sample name of the family (the `_created` samples aside)."""
OLD_FAMILIES = ("bridge_azure_queue_", "bridge_pubsub_")
SAMPLE = re.compile(r"^(bridge_\w+?)(?:\{([^}]*)\})? (\S+)$", re.MULTILINE)


@dataclass
class Queues:
    """One bridge's emulator: how to make a queue with a message in it, how to name a missing
    one, and the bridge's arguments and environment for a queue."""

    make: Callable[[bytes], str]
    """A new queue holding one message with these bytes; its name as the bridge labels it."""
    missing: str
    args: Callable[[str], list[str]]
    env: dict[str, str]


@pytest.fixture
def queues(request: pytest.FixtureRequest) -> Queues:
    bridge: str = request.param
    if bridge == "sqs":
        endpoint: str = request.getfixturevalue("moto_server")
        sqs = aws_client(endpoint, "sqs")

        def make_sqs(body: bytes) -> str:
            url: str = sqs.create_queue(QueueName=unique_name("conventions"))["QueueUrl"]
            sqs.send_message(QueueUrl=url, MessageBody=body.decode())
            return url

        return Queues(
            make_sqs,
            f"{endpoint}/123456789012/{unique_name('missing')}",
            lambda url: [
                *("--queue-url", url, "--source", "s3"),
                *("--endpoint-url", endpoint, "--wait-time", "1"),
            ],
            dict(os.environ),
        )
    if bridge == "azure-queue":
        azurite: Azurite = request.getfixturevalue("azurite")
        env = {**os.environ, "CONVENTIONS_AZURE": azurite.connection_string()}

        def make_azure(body: bytes) -> str:
            client = QueueClient.from_connection_string(
                azurite.connection_string(), f"conventions-{uuid.uuid4().hex[:12]}"
            )
            client.create_queue()
            client.send_message(body.decode())
            return str(client.queue_name)

        return Queues(
            make_azure,
            "no-such-queue",
            lambda name: [
                *("--queue", name, "--connection-string-env", "CONVENTIONS_AZURE"),
                *("--max-idle-wait", "0.3"),
            ],
            env,
        )
    host: str = request.getfixturevalue("emulator")
    from google.cloud import pubsub_v1

    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", host)
    project = "storage-events-conventions"

    def make_pubsub(body: bytes) -> str:
        publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
        tag = uuid.uuid4().hex[:8]
        topic = publisher.topic_path(project, f"conventions-{tag}")
        subscription = subscriber.subscription_path(project, f"conventions-{tag}")
        publisher.create_topic(name=topic)
        subscriber.create_subscription(name=subscription, topic=topic)
        publisher.publish(topic, body).result(30)
        subscriber.close()
        return str(subscription)

    return Queues(
        make_pubsub,
        f"projects/{project}/subscriptions/no-such-subscription",
        lambda subscription: ["--subscription", subscription, "--wait-time", "2"],
        {**os.environ, **NO_METADATA, "PUBSUB_EMULATOR_HOST": host},
    )


class Bridge(BridgeProcess):
    def __init__(self, bridge: str, args: list[str], env: dict[str, str], workdir: Path) -> None:
        self.metrics_port = free_port()
        self.log_path = workdir / f"{bridge}.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "connectors", bridge, *args),
                    *("--metrics-port", str(self.metrics_port)),
                ],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        """Every `bridge_*` sample: name, labels, value."""
        import urllib.request

        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as response:
            text = response.read().decode()
        return [
            (name, dict(re.findall(r'(\w+)="([^"]*)"', labels)), float(value))
            for name, labels, value in SAMPLE.findall(text)
        ]


@pytest.fixture
def topic(kafka_bootstrap: str) -> Iterator[str]:
    name = f"conventions-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(kafka_bootstrap, name))
    yield name


@pytest.mark.parametrize("queues", BRIDGES, indirect=True)
def test_a_missing_queue_is_one_line_and_exit_2(
    queues: Queues, kafka_bootstrap: str, request: pytest.FixtureRequest
) -> None:
    bridge = request.node.callspec.params["queues"]
    done = subprocess.run(
        [sys.executable, "-m", "connectors", bridge, *queues.args(queues.missing)],
        cwd=ROOT,
        env={**queues.env, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"connectors {bridge}: "), lines[0]
    assert "does not exist" in lines[0], lines[0]


@pytest.mark.parametrize("queues", BRIDGES, indirect=True)
def test_every_pull_bridge_serves_the_same_metric_family(
    queues: Queues,
    kafka_bootstrap: str,
    topic: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    bridge_name = request.node.callspec.params["queues"]
    queue = queues.make(b'{"conventions": true}')
    bridge = Bridge(
        bridge_name,
        [*queues.args(queue), "--topic", topic],
        {**queues.env, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap},
        tmp_path,
    )
    try:
        bridge.wait_metric("bridge_pull_deleted_total", 1, timeout_s=60)
        samples = bridge.samples()
    finally:
        assert bridge.stop() == 0, bridge.log()

    names = {name for name, _, _ in samples if not name.endswith("_created")}
    assert not {name for name in names if name.startswith(OLD_FAMILIES)}, sorted(names)
    pull = [sample for sample in samples if sample[0].startswith("bridge_pull_")]
    assert {name for name, _, _ in pull if not name.endswith("_created")} == FAMILY, sorted(names)
    label = queue.rsplit("/", 1)[-1] if bridge_name == "sqs" else queue
    for name, labels, _ in pull:
        labels.pop("le", None)
        assert labels == {"bridge": bridge_name, "queue": label}, (name, labels)
    values = {name: value for name, _, value in pull}
    assert values["bridge_pull_received_total"] == 1, values
    assert values["bridge_pull_published_total"] == 1, values
    assert values["bridge_pull_deleted_total"] == 1, values
    assert values["bridge_pull_publish_failures_total"] == 0, values
    assert values["bridge_pull_publish_seconds_count"] == 1, values
