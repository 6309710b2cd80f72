"""The Azure Storage Queue bridge against Azurite, the real broker and a real worker.

Messages are written as Event Grid's Storage Queue handler writes them: one event per
message, the message text being the base64 of the event's JSON. The bridge runs as a real
subprocess (`python -m connectors azure-queue`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.storage.queue import QueueClient
from support.azurite import Azurite, azurite  # noqa: F401 (the fixture)
from support.bridge_process import BridgeProcess
from support.kafka_io import Read, create_topic, read_topic
from support.payloads import azure_event
from support.worker import ROOT, Topology, Worker, free_port, wait_for

pytestmark = pytest.mark.kafka

CONNECTION_ENV = "TEST_AZURE_STORAGE_CONNECTION_STRING"
WRONG_KEY = base64.b64encode(b"not the account key, but valid base64").decode()


class Bridge(BridgeProcess):
    """One `python -m connectors azure-queue` process; stderr kept for assertions."""

    def __init__(self, args: list[str], env: dict[str, str], workdir: Path) -> None:
        self.metrics_port = free_port()
        self.log_path = workdir / f"bridge-{uuid.uuid4().hex[:6]}.log"
        command = [sys.executable, "-m", "connectors", "azure-queue", *args]
        command += ["--metrics-port", str(self.metrics_port)]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )


class Harness:
    def __init__(
        self, bootstrap: str, server: Azurite, names: Topology, worker: Worker, workdir: Path
    ) -> None:
        self.bootstrap, self.azurite, self.names = bootstrap, server, names
        self.worker, self.workdir = worker, workdir
        self.bridges: list[Bridge] = []

    def env(self, **overrides: str) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if key != "STREAMS_CONFIG"}
        env.update(
            KAFKA_BOOTSTRAP_SERVERS=self.bootstrap,
            **{CONNECTION_ENV: self.azurite.connection_string()},
        )
        env.update(overrides)
        return env

    def queue(self) -> QueueClient:
        """A new, empty queue (no message encoding policy: texts go in as given)."""
        client = QueueClient.from_connection_string(
            self.azurite.connection_string(), f"events-{uuid.uuid4().hex[:12]}"
        )
        client.create_queue()
        return client

    def bridge(self, queue: str, *args: str, **env: str) -> Bridge:
        bridge = Bridge(
            [
                "--queue",
                queue,
                "--connection-string-env",
                CONNECTION_ENV,
                "--max-idle-wait",
                "0.3",
                *args,
            ],
            self.env(**env),
            self.workdir,
        )
        self.bridges.append(bridge)
        return bridge

    def run_bridge(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "connectors", "azure-queue", *args],
            cwd=ROOT,
            env=self.env(**env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def read(self, topic: str) -> list[Read]:
        return asyncio.run(read_topic(self.bootstrap, topic))

    def events(self, key: str) -> list[dict[str, Any]]:
        found = [read.json() for read in self.read(self.names.output("default"))]
        return [event for event in found if event["key"] == key]

    def wait_for_events(self, key: str, count: int) -> list[dict[str, Any]]:
        try:
            return list(
                wait_for(
                    lambda: (found := self.events(key)) and len(found) >= count and found,
                    60,
                    f"{count} event(s) for {key!r} on the output topic",
                    interval_s=0.3,
                )
            )
        except TimeoutError as exc:
            logs = "\n".join(bridge.log()[-3000:] for bridge in self.bridges)
            raise AssertionError(
                f"{exc}\nbridges:\n{logs}\nworker:\n{self.worker.tail()}"
            ) from None


@pytest.fixture(scope="module")
def harness(
    kafka_bootstrap: str,
    azurite: Azurite,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Harness]:
    names = Topology()
    workdir = tmp_path_factory.mktemp("azure-queue-bridge")
    worker = Worker(kafka_bootstrap, names.config(), workdir / "worker").start()
    harness = Harness(kafka_bootstrap, azurite, names, worker, workdir)
    try:
        yield harness
    finally:
        for bridge in harness.bridges:
            if bridge.process.poll() is None:
                bridge.process.kill()
                bridge.process.wait()
        assert worker.stop() == 0, worker.tail()


def event_grid_message(event: dict[str, Any]) -> str:
    """What Event Grid's Storage Queue handler writes: base64 of the event JSON."""
    return base64.b64encode(json.dumps(event).encode()).decode()


def queued_count(queue: QueueClient) -> int:
    """Messages in the queue, invisible ones included."""
    return int(queue.get_queue_properties().approximate_message_count or 0)


def test_event_grid_messages_reach_the_output_topic_and_leave_the_queue(
    harness: Harness,
) -> None:
    tag = uuid.uuid4().hex[:8]
    photo, notes = f"{tag}/red flower+1.jpg", f"{tag}/notes.txt"
    created_photo = azure_event(str(uuid.uuid4()), photo, "0000000000000442000000000002896B")
    created_notes = azure_event(str(uuid.uuid4()), notes, "00000000000004420000000000028970")
    deleted_photo = azure_event(
        str(uuid.uuid4()), photo, "0000000000000442000000000002897A", created=False
    )
    queue = harness.queue()
    sent = {}
    for event in (created_photo, created_notes):
        text = event_grid_message(event)
        sent[queue.send_message(text).id] = text

    bridge = harness.bridge(queue.queue_name, "--topic", harness.names.raw)
    assert [e["type"] for e in harness.wait_for_events(photo, 1)] == ["created"]
    assert [e["type"] for e in harness.wait_for_events(notes, 1)] == ["created"]
    # The delete comes later, as it would: the running bridge picks it up from the queue.
    text = event_grid_message(deleted_photo)
    sent[queue.send_message(text).id] = text
    photo_events = harness.wait_for_events(photo, 2)

    assert [(e["type"], e["id"]) for e in photo_events] == [
        ("created", created_photo["id"]),
        ("deleted", deleted_photo["id"]),
    ]
    assert photo_events[0]["bucket"] == "photos"
    assert photo_events[0]["size"] == 524288
    # Published exactly as received: the base64 text, undecoded, one record per message.
    raw = {
        read.headers["delivery-id"].decode(): read
        for read in harness.read(harness.names.raw)
        if read.headers["delivery-id"].decode() in sent
    }
    assert {message_id: read.value for message_id, read in raw.items()} == {
        message_id: text.encode() for message_id, text in sent.items()
    }
    for read in raw.values():
        assert read.headers["source"] == b"azure"
        assert read.headers["transport"] == b"azure-queue"
    # Deleted only after Kafka acknowledged: all three published, all three deleted.
    bridge.wait_metric("bridge_pull_deleted_total", 3)
    assert wait_for(lambda: queued_count(queue) == 0, 10, "the queue to be empty")
    assert bridge.metric("bridge_pull_publish_failures_total") == 0
    assert bridge.stop() == 0, bridge.log()
    queue.delete_queue()


def test_a_message_kafka_does_not_acknowledge_stays_and_comes_back(harness: Harness) -> None:
    # A topic whose broker-side record limit refuses every Event Grid message: the broker
    # is up, the producer connected, and the write is not acknowledged.
    refusing = f"refusing-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(harness.bootstrap, refusing, config={"max.message.bytes": "64"}))
    key = f"{uuid.uuid4().hex[:8]}/kept.bin"
    event = azure_event(str(uuid.uuid4()), key, "0000000000000442000000000002896B")
    queue = harness.queue()
    message_id = queue.send_message(event_grid_message(event)).id

    failing = harness.bridge(
        queue.queue_name,
        "--topic",
        refusing,
        "--visibility-timeout",
        "1",
        "--publish-timeout",
        "2",
    )
    # Received, refused, invisible for 1 s, received again, refused again: it came back.
    failing.wait_metric("bridge_pull_publish_failures_total", 2)
    assert failing.metric("bridge_pull_deleted_total") == 0
    assert failing.metric("bridge_pull_published_total") == 0
    assert queued_count(queue) == 1
    assert failing.stop() == 0, failing.log()
    assert harness.read(refusing) == []
    assert f"message {message_id}" in failing.log()
    assert "left in the queue" in failing.log()

    # Once Kafka takes writes again (here: a bridge on a topic that accepts them), the same
    # queue message goes through and only then leaves the queue.
    healthy = harness.bridge(queue.queue_name, "--topic", harness.names.raw)
    assert [e["id"] for e in harness.wait_for_events(key, 1)] == [event["id"]]
    healthy.wait_metric("bridge_pull_deleted_total", 1)
    assert wait_for(lambda: queued_count(queue) == 0, 10, "the queue to be empty")
    delivered = [
        read
        for read in harness.read(harness.names.raw)
        if read.headers["delivery-id"] == message_id.encode()
    ]
    assert len(delivered) == 1
    assert healthy.stop() == 0, healthy.log()
    queue.delete_queue()


def test_nothing_is_received_while_kafka_is_unreachable(harness: Harness) -> None:
    queue = harness.queue()
    queue.send_message(event_grid_message(azure_event(str(uuid.uuid4()), "k", "01")))
    bridge = harness.bridge(
        queue.queue_name, "--topic", "unused", KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{free_port()}"
    )
    wait_for(lambda: "cannot reach Kafka" in bridge.log(), 30, "the bridge to find Kafka down")
    # Still visible and never dequeued: the bridge takes messages only once Kafka answers.
    peeked = queue.peek_messages(max_messages=32)
    assert [message.dequeue_count for message in peeked] == [0]
    assert bridge.stop() == 0, bridge.log()
    queue.delete_queue()


def test_a_missing_queue_is_one_line_and_exit_2(harness: Harness) -> None:
    done = harness.run_bridge(
        "--queue",
        "no-such-queue",
        "--account-url",
        harness.azurite.queue_endpoint,
        "--credential-env",
        "TEST_AZURE_KEY",
        TEST_AZURE_KEY=harness.azurite.connection_string().split("AccountKey=")[1].split(";")[0],
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "queue 'no-such-queue'" in lines[0]
    assert "does not exist" in lines[0]


def test_refused_credentials_are_one_line_and_exit_2(harness: Harness) -> None:
    queue = harness.queue()
    done = harness.run_bridge(
        "--queue",
        queue.queue_name,
        "--connection-string-env",
        "TEST_WRONG_CONNECTION",
        TEST_WRONG_CONNECTION=harness.azurite.connection_string(account_key=WRONG_KEY),
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "refused the credentials" in lines[0]
    queue.delete_queue()
