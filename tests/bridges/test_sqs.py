"""The SQS pull bridge against moto's server and the real broker.

* S3 -> SQS end to end: the bridge as a subprocess (`python -m connectors sqs`) and a real
  worker; the output topic holds the canonical events; SIGTERM stops the bridge cleanly.
* S3 -> SNS -> SQS (envelope and raw delivery) and EventBridge -> SQS, bridges in-process.
* Kafka outage: the bridge's broker (a private one, `dev/kafka/localkafka.py` on its own
  directory and port) is stopped while changes happen; no message is deleted whose publish
  Kafka did not acknowledge, they come back after the visibility timeout, and once the broker
  is back every change is in the raw topic.
* A missing queue, or no credentials: one line on stderr, exit 2.

moto quirks met (PROVIDERS.md §1 "Pitfalls"), handled here rather than in the normalizers:
its S3 records carry no `sequencer` (ids then come from eventTime and eTag; order from
eventTime), its delete records carry size and eTag, and its S3 -> EventBridge events all share
one fixed `id`, so only the first one a worker sees is not a duplicate: the EventBridge check
uses one change. moto also queues an `s3:TestEvent` when a notification configuration is
saved; the bridge publishes it like any message and the normalizer yields nothing for it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

import pytest
from support.kafka_io import read_topic
from support.local_broker import PrivateBroker
from support.moto_server import aws_client, unique_name
from support.worker import ROOT, Topology, Worker, free_port, wait_for

from connectors.publisher import PublishFailed, RawPublisher
from connectors.pull import Backoff, PullBridge, Pulled
from connectors.sqs import SqsQueue

pytest_plugins = ["support.moto_server"]


class Aws:
    """boto3 clients on the moto server, and the plumbing the tests set up."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.s3 = aws_client(endpoint, "s3")
        self.sqs = aws_client(endpoint, "sqs")
        self.sns = aws_client(endpoint, "sns")
        self.events = aws_client(endpoint, "events")

    def queue(self, visibility_timeout_s: int = 30) -> tuple[str, str]:
        url = self.sqs.create_queue(
            QueueName=unique_name("q"),
            Attributes={"VisibilityTimeout": str(visibility_timeout_s)},
        )["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
        return url, arn["Attributes"]["QueueArn"]

    def bucket_to_queue(self, queue_arn: str) -> str:
        bucket = unique_name("b")
        self.s3.create_bucket(Bucket=bucket)
        self.s3.put_bucket_notification_configuration(
            Bucket=bucket,
            NotificationConfiguration={
                "QueueConfigurations": [
                    {"QueueArn": queue_arn, "Events": ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"]}
                ]
            },
        )
        return bucket

    def put(self, bucket: str, key: str, body: bytes) -> str:
        """Put an object; its ETag without quotes."""
        etag: str = self.s3.put_object(Bucket=bucket, Key=key, Body=body)["ETag"]
        return etag.strip('"')

    def messages_in(self, queue_url: str) -> int:
        """Visible plus in-flight (received, not deleted) messages of the queue."""
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"]) + int(
            attributes["ApproximateNumberOfMessagesNotVisible"]
        )


class Stream:
    def __init__(self, bootstrap: str, names: Topology, worker: Worker) -> None:
        self.bootstrap, self.names, self.worker = bootstrap, names, worker

    def events(self, bucket: str) -> list[dict[str, Any]]:
        reads = asyncio.run(read_topic(self.bootstrap, self.names.output("default")))
        return [event for event in (read.json() for read in reads) if event["bucket"] == bucket]

    def wait_for(
        self, bucket: str, wanted: Callable[[list[dict[str, Any]]], bool], what: str
    ) -> list[dict[str, Any]]:
        def ready() -> list[dict[str, Any]] | None:
            events = self.events(bucket)
            return events if wanted(events) else None

        try:
            found: list[dict[str, Any]] = wait_for(ready, 45, what, interval_s=0.3)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; worker log:\n{self.worker.tail()}") from None
        return found


def has(events: list[dict[str, Any]], *wanted: tuple[str, str]) -> bool:
    return set(wanted) <= {(event["type"], event["key"]) for event in events}


@pytest.fixture(scope="module")
def aws(moto_server: str) -> Aws:
    return Aws(moto_server)


@pytest.fixture(scope="module")
def stream(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stream]:
    names = Topology()
    worker = Worker(kafka_bootstrap, names.config(), tmp_path_factory.mktemp("sqs-worker")).start()
    try:
        yield Stream(kafka_bootstrap, names, worker)
    finally:
        assert worker.stop() == 0, worker.tail()


def scrape(port: int) -> dict[str, float]:
    """Prometheus samples as `name{labels}` -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def bridge_command(config: Path, queue_url: str, endpoint: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "connectors",
        "--config",
        str(config),
        "sqs",
        "--queue-url",
        queue_url,
        "--source",
        "s3",
        "--endpoint-url",
        endpoint,
        "--wait-time",
        "1",
        *extra,
    ]


@pytest.mark.kafka
def test_s3_notifications_through_sqs_come_out_as_canonical_events(
    aws: Aws, stream: Stream, tmp_path: Path
) -> None:
    queue_url, queue_arn = aws.queue()
    bucket = aws.bucket_to_queue(queue_arn)
    log_path = tmp_path / "bridge.log"
    metrics_port = free_port()
    with log_path.open("wb") as log:
        bridge = subprocess.Popen(
            bridge_command(
                stream.worker.config_path,
                queue_url,
                aws.endpoint,
                "--metrics-port",
                str(metrics_port),
            ),
            cwd=ROOT,
            env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": stream.bootstrap},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        flower = aws.put(bucket, "photos/red flower.jpg", b"petals")
        plus = aws.put(bucket, "docs/a+b=c.txt", b"sum")
        stream.wait_for(
            bucket,
            lambda events: has(
                events, ("created", "photos/red flower.jpg"), ("created", "docs/a+b=c.txt")
            ),
            "both created events",
        )
        # Deleted only once its created is out: moto's events have no sequencer, so two
        # changes of one key in one millisecond would have no order at all.
        aws.s3.delete_object(Bucket=bucket, Key="photos/red flower.jpg")
        events = stream.wait_for(
            bucket,
            lambda events: has(events, ("deleted", "photos/red flower.jpg")),
            "the deleted event",
        )
        wait_for(lambda: aws.messages_in(queue_url) == 0, 20, "the queue to be emptied")
        metrics = scrape(metrics_port)
    finally:
        bridge.send_signal(signal.SIGTERM)
        code = bridge.wait(30)
    log_text = log_path.read_text(errors="replace")
    assert code == 0, log_text
    assert "sqs bridge stopped" in log_text
    labels = f'{{bridge="sqs",queue="{queue_url.rsplit("/", 1)[-1]}"}}'
    received = metrics[f"bridge_pull_received_total{labels}"]
    assert received >= 4  # the test event, two puts, one delete
    assert metrics[f"bridge_pull_published_total{labels}"] == received
    assert metrics[f"bridge_pull_deleted_total{labels}"] == received
    assert metrics[f"bridge_pull_publish_failures_total{labels}"] == 0

    by_key: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_key.setdefault(event["key"], []).append(event)
    assert [event["type"] for event in by_key["photos/red flower.jpg"]] == ["created", "deleted"]
    assert [event["type"] for event in by_key["docs/a+b=c.txt"]] == ["created"]
    created = by_key["photos/red flower.jpg"][0]
    assert (created["provider"], created["etag"], created["size"]) == ("s3", flower, 6)
    assert by_key["docs/a+b=c.txt"][0]["etag"] == plus

    raw = asyncio.run(read_topic(stream.bootstrap, stream.names.raw))
    ours = [read for read in raw if bucket.encode() in (read.value or b"")]
    assert len(ours) >= 4  # the test event, two puts, one delete
    assert {read.headers["source"] for read in ours} == {b"s3"}
    assert {read.headers["transport"] for read in ours} == {b"sqs"}
    assert len({read.headers["delivery-id"] for read in ours}) == len(ours)


class InProcess:
    """Pull bridges running in a background thread's event loop, until `stop`."""

    def __init__(
        self, bootstrap: str, topic: str, make: Callable[[RawPublisher], Sequence[PullBridge]]
    ) -> None:
        self.publisher = RawPublisher(bootstrap, topic, timeout_s=1.5)
        self._make = make
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        assert self._ready.wait(60), "the in-process bridge did not start"
        if self.error is not None:
            raise self.error

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                await self.publisher.start()
                bridges = self._make(self.publisher)
            finally:
                self._ready.set()
            try:
                await asyncio.gather(*(bridge.run(self._stop) for bridge in bridges))
            finally:
                await self.publisher.stop()

        try:
            asyncio.run(main())
        except BaseException as exc:
            self.error = exc
            self._ready.set()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        assert not self._thread.is_alive(), "the bridge did not stop"
        if self.error is not None:
            raise self.error


def sqs_bridge(publisher: RawPublisher, aws: Aws, queue_url: str, source: str) -> PullBridge:
    queue = SqsQueue(aws.sqs, queue_url, wait_time_s=1)
    return PullBridge(queue, publisher, "sqs", source, "sqs", max_in_flight=20)


@pytest.mark.kafka
def test_sns_envelopes_raw_sns_and_eventbridge_bodies_are_published_as_is(
    aws: Aws, stream: Stream
) -> None:
    enveloped_url, enveloped_arn = aws.queue()
    raw_url, raw_arn = aws.queue()
    topic = aws.sns.create_topic(Name=unique_name("t"))["TopicArn"]
    aws.sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=enveloped_arn)
    aws.sns.subscribe(
        TopicArn=topic,
        Protocol="sqs",
        Endpoint=raw_arn,
        Attributes={"RawMessageDelivery": "true"},
    )
    sns_bucket = unique_name("b")
    aws.s3.create_bucket(Bucket=sns_bucket)
    aws.s3.put_bucket_notification_configuration(
        Bucket=sns_bucket,
        NotificationConfiguration={
            "TopicConfigurations": [{"TopicArn": topic, "Events": ["s3:ObjectCreated:*"]}]
        },
    )
    eb_url, eb_arn = aws.queue()
    rule = unique_name("r")
    eb_bucket = unique_name("b")
    aws.events.put_rule(
        Name=rule,
        EventPattern=f'{{"source": ["aws.s3"], "resources": ["arn:aws:s3:::{eb_bucket}"]}}',
    )
    aws.events.put_targets(Rule=rule, Targets=[{"Id": "queue", "Arn": eb_arn}])
    aws.s3.create_bucket(Bucket=eb_bucket)
    aws.s3.put_bucket_notification_configuration(
        Bucket=eb_bucket, NotificationConfiguration={"EventBridgeConfiguration": {}}
    )

    bridges = InProcess(
        stream.bootstrap,
        stream.names.raw,
        lambda publisher: [
            sqs_bridge(publisher, aws, enveloped_url, "s3"),
            sqs_bridge(publisher, aws, raw_url, "s3"),
            sqs_bridge(publisher, aws, eb_url, "eventbridge"),
        ],
    )
    try:
        aws.put(sns_bucket, "via sns/one.txt", b"1")
        aws.put(eb_bucket, "via eb/one two.txt", b"2")
        sns_events = stream.wait_for(
            sns_bucket, lambda events: has(events, ("created", "via sns/one.txt")), "SNS event"
        )
        eb_events = stream.wait_for(
            eb_bucket, lambda events: has(events, ("created", "via eb/one two.txt")), "EB event"
        )
        urls = (enveloped_url, raw_url, eb_url)
        wait_for(lambda: all(aws.messages_in(url) == 0 for url in urls), 20, "empty queues")
    finally:
        bridges.stop()
    # The envelope and the raw copy are one change: one event.
    assert [event["provider"] for event in sns_events] == ["s3"]
    assert [event["provider"] for event in eb_events] == ["eventbridge"]


# --- the loop at its seam: fakes for the queue and Kafka -------------------------------------


class FakeQueue:
    """A queue whose `receive` serves `messages`, then waits (a long poll) until `wake`."""

    name = "fake"
    max_batch = 10

    def __init__(self, messages: list[Pulled]) -> None:
        self.pending = list(messages)
        self.asked: list[int] = []
        self.deleted: list[str] = []
        self.released: list[str] = []
        self.wake = asyncio.Event()
        self.on_wake: list[Pulled] = []

    async def check(self) -> None:
        pass

    async def receive(self, max_messages: int) -> list[Pulled]:
        self.asked.append(max_messages)
        if self.pending:
            batch, self.pending = self.pending[:max_messages], self.pending[max_messages:]
            return batch
        await self.wake.wait()
        self.wake.clear()
        batch, self.on_wake = self.on_wake, []
        return batch

    async def delete(self, messages: Sequence[Pulled]) -> list[Pulled]:
        self.deleted += [message.delivery_id for message in messages]
        return []

    async def release(self, messages: Sequence[Pulled]) -> None:
        self.released += [message.delivery_id for message in messages]


class FakeKafka:
    """Acknowledges every body but those containing `fail`, once `gate` is open."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = 0
        self.written: list[tuple[bytes, dict[str, bytes]]] = []

    async def publish(
        self, value: bytes, headers: list[tuple[str, bytes]], key: bytes | None = None
    ) -> None:
        self.waiting += 1
        await self.gate.wait()
        self.waiting -= 1
        if b"fail" in value:
            raise PublishFailed("not acknowledged")
        self.written.append((value, dict(headers)))


def pulled(index: int, body: bytes = b"{}") -> Pulled:
    return Pulled(body=body, delivery_id=f"m{index}", attributes={"kind": "test"}, handle=index)


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.005)


def test_the_loop_deletes_exactly_the_messages_kafka_acknowledged() -> None:
    async def scenario() -> tuple[FakeQueue, FakeKafka]:
        queue = FakeQueue([pulled(i, b"fail" if i in (2, 5) else b"ok") for i in range(12)])
        kafka = FakeKafka()
        bridge = PullBridge(queue, kafka, "fake", "s3", "sqs", backoff=Backoff(0.01, 0.01))
        stop = asyncio.Event()
        running = asyncio.ensure_future(bridge.run(stop))
        await until(lambda: not queue.pending and bridge.in_flight == 0)
        stop.set()
        queue.wake.set()
        await running
        return queue, kafka

    queue, kafka = asyncio.run(scenario())
    assert sorted(queue.deleted) == sorted(f"m{i}" for i in range(12) if i not in (2, 5))
    assert queue.asked[:2] == [10, 10]  # batches of up to 10
    value, headers = kafka.written[0]
    assert value == b"ok"
    assert (headers["source"], headers["transport"], headers["attribute.kind"]) == (
        b"s3",
        b"sqs",
        b"test",
    )
    assert {headers["delivery-id"] for _, headers in kafka.written} == {
        f"m{i}".encode() for i in range(12) if i not in (2, 5)
    }


def test_in_flight_work_is_bounded_and_shutdown_settles_it_and_releases_the_rest() -> None:
    async def scenario() -> tuple[FakeQueue, FakeKafka, list[int]]:
        queue = FakeQueue([pulled(i) for i in range(10)])
        kafka = FakeKafka()
        kafka.gate.clear()  # Kafka slow: nothing is acknowledged yet
        bridge = PullBridge(queue, kafka, "fake", "s3", "sqs", max_in_flight=3)
        stop = asyncio.Event()
        running = asyncio.ensure_future(bridge.run(stop))
        await until(lambda: kafka.waiting == 3)
        asked_while_full = list(queue.asked)
        assert bridge.in_flight == 3 and queue.deleted == []
        kafka.gate.set()  # acknowledged: deleted, and the loop takes more
        await until(lambda: not queue.pending and bridge.in_flight == 0)
        kafka.gate.clear()
        queue.on_wake = [pulled(10)]
        queue.wake.set()
        await until(lambda: kafka.waiting == 1)  # m10 is being published
        queue.on_wake = [pulled(11), pulled(12)]
        stop.set()
        queue.wake.set()  # the long poll in progress ends, with two more messages
        await until(lambda: len(queue.released) == 2)
        assert "m10" not in queue.deleted  # not acknowledged yet: not deleted
        kafka.gate.set()
        await running  # returns once m10 is settled
        return queue, kafka, asked_while_full

    queue, kafka, asked_while_full = asyncio.run(scenario())
    assert asked_while_full == [3]  # one receive, for the three free slots
    assert sorted(queue.deleted) == sorted(f"m{i}" for i in range(11))
    assert queue.released == ["m11", "m12"]
    assert len(kafka.written) == 11


# --- Kafka outage ---------------------------------------------------------------------------


class Spy:
    """Records what the bridge receives, what Kafka acknowledges and what it deletes.

    `violations` lists every delete of a message Kafka had not acknowledged (must stay empty).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.received: dict[str, int] = {}
        self.acknowledged: set[str] = set()
        self.deleted: set[str] = set()
        self.failed_publishes = 0
        self.violations: list[str] = []
        self._publishing: dict[bytes, str] = {}

    def queue(self, inner: SqsQueue) -> Any:
        spy = self

        class SpyQueue:
            name = inner.name
            max_batch = inner.max_batch

            async def check(self) -> None:
                await inner.check()

            async def receive(self, max_messages: int) -> list[Pulled]:
                messages = await inner.receive(max_messages)
                with spy.lock:
                    for message in messages:
                        spy.received[message.delivery_id] = (
                            spy.received.get(message.delivery_id, 0) + 1
                        )
                return messages

            async def delete(self, messages: Sequence[Pulled]) -> list[Pulled]:
                with spy.lock:
                    for message in messages:
                        if message.delivery_id not in spy.acknowledged:
                            spy.violations.append(message.delivery_id)
                left = await inner.delete(messages)
                with spy.lock:
                    spy.deleted |= {m.delivery_id for m in messages} - {m.delivery_id for m in left}
                return left

            async def release(self, messages: Sequence[Pulled]) -> None:
                await inner.release(messages)

        return SpyQueue()

    def publisher(self, inner: RawPublisher) -> Any:
        spy = self

        class SpyPublisher:
            async def publish(
                self, value: bytes, headers: list[tuple[str, bytes]], key: bytes | None = None
            ) -> None:
                delivery_id = dict(headers)["delivery-id"].decode()
                try:
                    await inner.publish(value, headers, key)
                except Exception:
                    with spy.lock:
                        spy.failed_publishes += 1
                    raise
                with spy.lock:
                    spy.acknowledged.add(delivery_id)

        return SpyPublisher()


@pytest.mark.kafka
def test_a_kafka_outage_deletes_nothing_unacknowledged_and_loses_nothing(
    aws: Aws, tmp_path: Path
) -> None:
    broker = PrivateBroker(tmp_path / "kafka")
    bootstrap = broker.start(fresh=True)
    topic = "raw-outage"
    queue_url, queue_arn = aws.queue(visibility_timeout_s=2)
    bucket = aws.bucket_to_queue(queue_arn)
    spy = Spy()

    def make(publisher: RawPublisher) -> list[PullBridge]:
        queue = spy.queue(SqsQueue(aws.sqs, queue_url, wait_time_s=1))
        return [
            PullBridge(
                queue,
                spy.publisher(publisher),
                "sqs",
                "s3",
                "sqs",
                max_in_flight=10,
                backoff=Backoff(initial_s=0.2, maximum_s=1.0),
            )
        ]

    bridges = InProcess(bootstrap, topic, make)
    try:
        for index in range(3):
            aws.put(bucket, f"before/{index}.txt", b"x" * index)
        wait_for(lambda: aws.messages_in(queue_url) == 0, 20, "the first changes to be settled")
        before = set(spy.deleted)

        broker.stop()
        for index in range(3):
            aws.put(bucket, f"during/{index}.txt", b"y" * index)
        aws.s3.delete_object(Bucket=bucket, Key="before/0.txt")

        def redelivered() -> bool:
            # every change made during the outage was received twice at least (it came back
            # after its visibility timeout), and none of them is deleted or acknowledged
            with spy.lock:
                during = [mid for mid in spy.received if mid not in before]
                return len(during) >= 4 and all(spy.received[mid] >= 2 for mid in during)

        wait_for(redelivered, 30, "the unacknowledged messages to come back")
        with spy.lock:
            during = {mid for mid in spy.received if mid not in before}
            assert not during & spy.deleted
            assert not during & spy.acknowledged
            assert spy.failed_publishes >= 4
        assert aws.messages_in(queue_url) >= 4

        broker.start()
        wait_for(
            lambda: aws.messages_in(queue_url) == 0 and during <= spy.deleted,
            60,
            "every message to be published and deleted after the broker returned",
        )
        raw = asyncio.run(read_topic(bootstrap, topic))
    finally:
        bridges.stop()
        broker.stop()
    assert spy.violations == [], "deleted before Kafka acknowledged"
    assert spy.deleted == spy.acknowledged == set(spy.received)
    published = {read.headers["delivery-id"].decode() for read in raw}
    assert set(spy.received) <= published
    # Every change is in the raw topic (moto form-encodes keys: `/` is `%2F`).
    changes = {
        (record["eventName"], unquote_plus(record["s3"]["object"]["key"]))
        for read in raw
        for record in json.loads(read.value or b"{}").get("Records", [])
    }
    assert changes == {
        *(
            ("ObjectCreated:Put", f"{stage}/{index}.txt")
            for stage in ("before", "during")
            for index in range(3)
        ),
        ("ObjectRemoved:Delete", "before/0.txt"),
    }


# --- failures the bridge reports as one line ------------------------------------------------


def run_bridge(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_a_missing_queue_is_one_line_and_exit_2(aws: Aws, tmp_path: Path) -> None:
    config = tmp_path / "streams.toml"
    config.write_text("")
    missing = f"{aws.endpoint}/123456789012/{unique_name('missing')}"
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9"}  # never reached
    result = run_bridge(bridge_command(config, missing, aws.endpoint), env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0] == (
        f"connectors sqs: queue {missing} does not exist (AWS.SimpleQueueService.NonExistentQueue)"
    )

    no_credentials = {
        name: value
        for name, value in env.items()
        if name not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
    }
    result = run_bridge(bridge_command(config, missing, aws.endpoint), no_credentials)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("connectors sqs: no usable AWS credentials")
