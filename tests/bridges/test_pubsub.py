"""The Pub/Sub pull bridge: ack only what Kafka holds, nack what it does not.

Two layers:

* At the seam, always: `PubSubBridge.handle` gets the library's own
  `google.cloud.pubsub_v1.subscriber.message.Message`, built from a real `PubsubMessage`
  protobuf, whose `ack()` / `nack()` put the library's `AckRequest` / `NackRequest` on the
  request queue the streaming pull manager would send them from. The publisher writes to the
  real broker; the test's request queue reads Kafka back at the moment of the ack.
* End to end, when Google's Pub/Sub emulator is on the machine (the `cloud-pubsub-emulator`
  of the Google Cloud CLI, package google-cloud-cli-pubsub-emulator; no package registry
  this project installs from carries it, so these tests are skipped without it): the bridge
  runs as `python -m connectors pubsub` against the emulator, with a real worker.
  `PUBSUB_EMULATOR_HOST` names an emulator already running; `PUBSUB_EMULATOR_BIN` the
  emulator's start script.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from google.cloud.pubsub_v1.subscriber._protocol.requests import AckRequest, NackRequest
from google.cloud.pubsub_v1.subscriber.message import Message
from google.cloud.pubsub_v1.types import PubsubMessage
from support.bridge_process import BridgeProcess
from support.kafka_io import read_topic
from support.payloads import gcs_attributes, gcs_resource
from support.processes import serving
from support.worker import ROOT, Topology, Worker, free_port, wait_for

from connectors.publisher import RawPublisher
from connectors.pubsub import PubSubBridge

pytestmark = pytest.mark.kafka

# Never let google-auth look for a metadata server off this machine.
NO_METADATA = {
    "NO_GCE_CHECK": "true",
    "GCE_METADATA_HOST": "127.0.0.1:9",
    "GCE_METADATA_IP": "127.0.0.1:9",
}


# --- the seam -------------------------------------------------------------------------


class LoopThread:
    """An asyncio loop in its own thread: the bridge's loop, seen from a callback thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Any, timeout_s: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    runner = LoopThread()
    try:
        yield runner
    finally:
        runner.close()


class KafkaCheckingRequests(queue.Queue[Any]):
    """The request queue a Message puts its ack / nack on (the manager's dispatcher reads it).

    At each ack it reads the topic back, so the test knows whether Kafka already held the
    acked message's record when the ack was given.
    """

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__()
        self.bootstrap, self.topic = bootstrap, topic
        self.held_at_ack: dict[str, bool] = {}

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        if isinstance(item, AckRequest):
            records = asyncio.run(read_topic(self.bootstrap, self.topic))
            self.held_at_ack[item.message_id] = any(
                read.headers.get("delivery-id") == item.message_id.encode() for read in records
            )
        super().put(item, block, timeout)

    def requests(self) -> list[Any]:
        return [self.get_nowait() for _ in range(self.qsize())]


def library_message(requests: queue.Queue[Any], data: bytes, attributes: dict[str, str]) -> Message:
    """The subscriber's own Message type, as the streaming pull manager builds it."""
    message_id = str(uuid.uuid4().int)[:16]
    pb = PubsubMessage(data=data, attributes=attributes, message_id=message_id)._pb
    return Message(pb, f"ack-{message_id}", 0, requests)


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


def test_a_message_is_acked_only_once_its_record_is_in_kafka(
    kafka_bootstrap: str, loop_thread: LoopThread
) -> None:
    topic = f"pubsub-seam-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(kafka_bootstrap, topic))
    publisher = RawPublisher(kafka_bootstrap, topic, timeout_s=10)
    loop_thread.run(publisher.start())
    try:
        bridge = PubSubBridge(publisher, loop_thread.loop)
        requests = KafkaCheckingRequests(kafka_bootstrap, topic)
        data, attributes = gcs_message("seam/a b.png", "1700000000000001", "OBJECT_FINALIZE")
        message = library_message(requests, data, attributes)

        assert bridge.handle(message) is True  # called here, i.e. from a non-loop thread
    finally:
        loop_thread.run(publisher.stop())

    sent = requests.requests()
    assert [type(request) for request in sent] == [AckRequest]
    assert sent[0].ack_id == message.ack_id
    assert requests.held_at_ack == {message.message_id: True}
    [record] = asyncio.run(read_topic(kafka_bootstrap, topic))
    assert record.value == data
    assert record.headers["source"] == b"gcs"
    assert record.headers["transport"] == b"pubsub-pull"
    assert record.headers["delivery-id"] == message.message_id.encode()
    assert {
        name.removeprefix("attribute."): value.decode()
        for name, value in record.headers.items()
        if name.startswith("attribute.")
    } == attributes


def test_a_write_kafka_refuses_is_nacked_and_nothing_is_acked(
    kafka_bootstrap: str, loop_thread: LoopThread
) -> None:
    # The broker is up and the producer connected, but the topic's record limit makes the
    # broker refuse the write: Kafka does not hold it, so Pub/Sub must deliver it again.
    topic = f"pubsub-refusing-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(kafka_bootstrap, topic, {"max.message.bytes": "64"}))
    publisher = RawPublisher(kafka_bootstrap, topic, timeout_s=2)
    loop_thread.run(publisher.start())
    try:
        bridge = PubSubBridge(publisher, loop_thread.loop, first_backoff_s=0.01)
        requests = KafkaCheckingRequests(kafka_bootstrap, topic)
        message = library_message(requests, *gcs_message("seam/x", "1", "OBJECT_FINALIZE"))

        assert bridge.handle(message) is False
    finally:
        loop_thread.run(publisher.stop())

    sent = requests.requests()
    assert [type(request) for request in sent] == [NackRequest]
    assert sent[0].ack_id == message.ack_id
    assert asyncio.run(read_topic(kafka_bootstrap, topic)) == []


def test_a_publisher_without_kafka_nacks(loop_thread: LoopThread) -> None:
    # Pointed at a port where no broker listens: its start is still retrying in the loop.
    publisher = RawPublisher(f"127.0.0.1:{free_port()}", "unused", timeout_s=0.5)
    starting = asyncio.run_coroutine_threadsafe(publisher.start(), loop_thread.loop)
    try:
        bridge = PubSubBridge(publisher, loop_thread.loop, first_backoff_s=0.01)
        requests: queue.Queue[Any] = queue.Queue()
        message = library_message(requests, b"{}", {})
        assert bridge.handle(message) is False
        assert [type(request) for request in requests.queue] == [NackRequest]
    finally:
        starting.cancel()


def test_a_stopping_bridge_nacks_without_publishing(
    kafka_bootstrap: str, loop_thread: LoopThread
) -> None:
    topic = f"pubsub-stopping-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(kafka_bootstrap, topic))
    publisher = RawPublisher(kafka_bootstrap, topic, timeout_s=5)
    loop_thread.run(publisher.start())
    try:
        bridge = PubSubBridge(publisher, loop_thread.loop)
        bridge.stopping.set()
        requests: queue.Queue[Any] = queue.Queue()
        assert bridge.handle(library_message(requests, b"{}", {})) is False
        assert [type(request) for request in requests.queue] == [NackRequest]
    finally:
        loop_thread.run(publisher.stop())
    assert asyncio.run(read_topic(kafka_bootstrap, topic)) == []


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


def emulator_script() -> Path | None:
    given = os.environ.get("PUBSUB_EMULATOR_BIN")
    if given:
        return Path(given)
    gcloud = shutil.which("gcloud")
    roots = [Path(gcloud).resolve().parent.parent] if gcloud else []
    roots.append(Path("/usr/lib/google-cloud-sdk"))
    for root in roots:
        script = root / "platform" / "pubsub-emulator" / "bin" / "cloud-pubsub-emulator"
        if script.exists():
            return script
    return None


def _emulator_answers(host: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}/", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`host:port` of a Pub/Sub emulator."""
    if os.environ.get("PUBSUB_EMULATOR_HOST"):
        yield os.environ["PUBSUB_EMULATOR_HOST"]
        return
    script = emulator_script()
    if script is None:
        pytest.skip(
            "no Pub/Sub emulator on this machine (Google Cloud CLI package "
            "google-cloud-cli-pubsub-emulator); the seam tests above cover ack-after-publish"
        )
    host = f"127.0.0.1:{free_port()}"
    log_path = tmp_path_factory.mktemp("pubsub-emulator") / "emulator.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(script), "--host=127.0.0.1", f"--port={host.split(':')[1]}"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    with serving(
        process,
        "the Pub/Sub emulator",
        lambda: _emulator_answers(host),
        log_path.read_text,
        60,
        0.2,
    ):
        yield host


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
def pubsub(emulator: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[PubSub]:
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
    kafka_bootstrap: str, emulator: str, tmp_path_factory: pytest.TempPathFactory
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
        bridge.wait_metric("bridge_pubsub_acked_total", 2)
        assert bridge.metric("bridge_pubsub_nacked_total") == 0
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
        # Refused, nacked, redelivered by Pub/Sub, refused again: the one message published
        # was handled at least twice, and never acked.
        bridge.wait_metric("bridge_pubsub_nacked_total", 2)
        assert bridge.metric("bridge_pubsub_acked_total") == 0
    finally:
        assert bridge.stop() == 0, bridge.log()
    assert bridge.log().count(f"message {message_id} not acknowledged by Kafka") >= 2
    assert asyncio.run(read_topic(kafka_bootstrap, refusing)) == []
    # (Whether it is still in the subscription after the bridge stopped is not asked of the
    # emulator: it ignores a nack sent after the stream closed, which is when the bridge
    # nacks at shutdown, and redelivers only after the stream's 60 s ack deadline.)


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
