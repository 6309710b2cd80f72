"""Every client of the product on a secured broker: SASL_SSL with SCRAM-SHA-512, and mutual TLS.

The brokers are the tests' own (`secured_kafka`, `mtls_kafka`: dev/kafka/localkafka.py
`start --security ...`, tests/support/secured_broker.py); every process gets their
`client.env` settings as environment variables, exactly as `set -a; . client.env` would.

* Over SASL_SSL: a webhook delivery and an SQS delivery (moto) travel bridge -> worker ->
  output -> a `fileevents` handler, each once; `python -m streams tail` (`make tail`) and
  `replay-dead-letters` work against it.
* A wrong password stops the worker, a bridge and each command with one line naming
  KAFKA_SASL_PASSWORD (the password itself never printed); a CA that did not sign the
  broker's certificate, one line naming KAFKA_SSL_CA_LOCATION.
* A plaintext client is refused.
* Mutual TLS (client certificate, no SASL): the worker and the webhook bridge.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from support.bridge_process import BridgeProcess
from support.moto_server import aws_client, unique_name
from support.payloads import s3_body, s3_record
from support.secured_broker import SecuredBroker
from support.worker import ROOT, Topology, Worker, free_port, wait_for

from fileevents import FileEvent, FileEvents
from streams.engine.topics import TopicSpec, ensure_topics
from streams.kafka_settings import KafkaSettings, check_access

pytest_plugins = ["support.moto_server"]
pytestmark = pytest.mark.kafka

WRONG_PASSWORD = "not-the-password-" + uuid.uuid4().hex[:8]


def settings_of(env: dict[str, str]) -> KafkaSettings:
    return KafkaSettings.from_environ(env)


def client_environ(env: dict[str, str], **more: str) -> dict[str, str]:
    """The test process' environment with only `env`'s Kafka settings (none inherited)."""
    base = {key: value for key, value in os.environ.items() if not key.startswith("KAFKA_")}
    return {**base, **env, **more}


def config_text(names: Topology) -> str:
    return names.config() + (f'\n[webhook]\nraw_topic = "{names.raw}"\ninsecure_sources = ["s3"]\n')


class Bridge(BridgeProcess):
    """`python -m connectors <args>` as a subprocess, its log kept."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "connectors", *args],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )


def webhook_bridge(config: Path, env: dict[str, str], workdir: Path) -> tuple[Bridge, int]:
    port = free_port()
    bridge = Bridge(
        ["--config", str(config), "webhook"],
        client_environ(env, WEBHOOK_PORT=str(port)),
        workdir / "webhook.log",
    )
    return bridge, port


def post_s3(port: int, bridge: Bridge, key: str, sequencer: str) -> None:
    """POST one S3 notification to the bridge once it answers (the publish acknowledged)."""
    body = s3_body(s3_record(key, sequencer, bucket="secured"))

    def accepted() -> bool:
        if bridge.process.poll() is not None:
            raise AssertionError(f"webhook bridge exited:\n{bridge.log()}")
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/hooks/s3", data=body, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=15) as response:
                return 200 <= response.status < 300
        except OSError:
            return False  # not listening yet, or 503 until Kafka answered

    try:
        wait_for(accepted, 60, "the webhook bridge to accept the delivery", interval_s=0.5)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{bridge.log()}") from None


def run_command(
    args: list[str], env: dict[str, str], timeout_s: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def tail(topic: str, env: dict[str, str], count: int, timeout_s: float = 30) -> list[Any]:
    done = run_command(
        [
            "-m",
            "streams",
            "tail",
            "--topic",
            topic,
            "--count",
            str(count),
            "--timeout",
            str(timeout_s),
        ],
        env,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def handled_by_fileevents(
    kafka: KafkaSettings, topic: str, wanted: set[str], timeout_s: float = 90
) -> Counter[str]:
    """Run a `fileevents` consumer (its own group) until every key of `wanted` was handled
    and the topic's records so far are all handled; how often each key was."""
    seen: Counter[str] = Counter()
    events = FileEvents(
        kafka=kafka, topic=topic, group_id=f"secured-{uuid.uuid4().hex[:8]}", handle_signals=False
    )

    @events.on("created")
    async def record(event: FileEvent) -> None:
        seen[event.key] += 1

    async def run() -> None:
        consuming = asyncio.create_task(events.run())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not wanted <= set(seen):
            if consuming.done():
                consuming.result()
            if loop.time() > deadline:
                raise TimeoutError(f"fileevents handled {dict(seen)}, waiting for {wanted}")
            await asyncio.sleep(0.2)
        events.stop()
        await asyncio.wait_for(consuming, 30)

    asyncio.run(run())
    return seen


@pytest.fixture(scope="module")
def secured_worker(
    secured_kafka: SecuredBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Topology, Worker]]:
    names = Topology()
    workdir = tmp_path_factory.mktemp("secured-worker")
    worker = Worker(
        secured_kafka.bootstrap,
        config_text(names),
        workdir,
        env=client_environ(secured_kafka.client_env),
    ).start()
    try:
        yield names, worker
    finally:
        assert worker.stop() == 0, worker.tail()


def test_webhook_and_sqs_deliveries_reach_a_fileevents_handler_once_over_sasl_ssl(
    secured_kafka: SecuredBroker,
    secured_worker: tuple[Topology, Worker],
    moto_server: str,
    tmp_path: Path,
) -> None:
    names, worker = secured_worker
    env = secured_kafka.client_env
    sqs, s3 = aws_client(moto_server, "sqs"), aws_client(moto_server, "s3")
    queue_url = sqs.create_queue(QueueName=unique_name("q"))["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    bucket = unique_name("b")
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={
            "QueueConfigurations": [{"QueueArn": queue_arn, "Events": ["s3:ObjectCreated:*"]}]
        },
    )
    webhook, port = webhook_bridge(worker.config_path, env, tmp_path)
    sqs_bridge = Bridge(
        [
            "--config",
            str(worker.config_path),
            "sqs",
            "--queue-url",
            queue_url,
            "--source",
            "s3",
            "--endpoint-url",
            moto_server,
            "--wait-time",
            "1",
        ],
        client_environ(env),
        tmp_path / "sqs.log",
    )
    try:
        post_s3(port, webhook, "webhook/one.txt", "0055AED6DCD90281E5")
        s3.put_object(Bucket=bucket, Key="sqs/two.txt", Body=b"two")
        output = names.output("default")
        seen = handled_by_fileevents(settings_of(env), output, {"webhook/one.txt", "sqs/two.txt"})
    finally:
        webhook_code, sqs_code = webhook.stop(), sqs_bridge.stop()
    assert webhook_code == 0, webhook.log()
    assert sqs_code == 0, sqs_bridge.log()
    assert seen == Counter({"webhook/one.txt": 1, "sqs/two.txt": 1}), worker.tail()

    # `make tail` (python -m streams tail) reads the same output with the same settings.
    printed = tail(output, client_environ(env), count=2)
    assert sorted(event["key"] for event in printed) == ["sqs/two.txt", "webhook/one.txt"]
    assert {event["provider"] for event in printed} == {"s3"}


def test_replay_dead_letters_over_sasl_ssl(
    secured_kafka: SecuredBroker, secured_worker: tuple[Topology, Worker]
) -> None:
    names, worker = secured_worker
    env = client_environ(secured_kafka.client_env, STREAMS_CONFIG=str(worker.config_path))
    kafka = settings_of(secured_kafka.client_env)

    async def publish_malformed() -> None:
        producer = AIOKafkaProducer(**kafka.aiokafka_args(), acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(
                names.raw, b"{ not json", headers=[("source", b"s3")], key=b"malformed"
            )
        finally:
            await producer.stop()

    asyncio.run(publish_malformed())
    worker.wait_metric("storage_events_dead_lettered_total", 1)
    dry = run_command(["-m", "streams", "replay-dead-letters", "--dry-run"], env)
    assert dry.returncode == 0, dry.stderr
    listed = [json.loads(line) for line in dry.stdout.splitlines() if line.strip()]
    assert len(listed) >= 1 and listed[0]["source"] == "s3", dry.stdout
    real = run_command(["-m", "streams", "replay-dead-letters", "--limit", "1"], env)
    assert real.returncode == 0, real.stderr
    assert "replayed 1 of" in real.stderr, real.stderr
    worker.wait_metric("storage_events_dead_lettered_total", 2)  # bad again: lettered again


def error_lines(stderr: str) -> list[str]:
    """What a refused command printed, minus the tail command's own `# tailing` header."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("# ")]


def test_a_wrong_password_stops_every_command_with_one_line_naming_it(
    secured_kafka: SecuredBroker, moto_server: str, tmp_path: Path
) -> None:
    names = Topology()
    queue_url = aws_client(moto_server, "sqs").create_queue(QueueName=unique_name("q"))["QueueUrl"]
    config = tmp_path / "streams.toml"
    config.write_text(config_text(names))
    env = client_environ(
        {**secured_kafka.client_env, "KAFKA_SASL_PASSWORD": WRONG_PASSWORD},
        STREAMS_CONFIG=str(config),
        STREAMS_DATA_DIR=str(tmp_path / "data"),
        STREAMS_WEB_PORT=str(free_port()),
        WEBHOOK_PORT=str(free_port()),
    )
    commands = {
        "tail": ["-m", "streams", "tail", "--topic", names.raw, "--count", "1", "--timeout", "5"],
        "create-topics": ["-m", "streams", "create-topics", "--wait", "5"],
        "replay-dead-letters": ["-m", "streams", "replay-dead-letters", "--dry-run"],
        "webhook": ["-m", "connectors", "webhook"],
        "sqs": [
            *("-m", "connectors", "sqs", "--queue-url", queue_url, "--source", "s3"),
            *("--endpoint-url", moto_server, "--wait-time", "1"),
        ],
        "worker": [str(Path(sys.executable).with_name("faust")), "-A", "streams", "worker"],
    }
    for name, args in commands.items():
        if name == "worker":
            done = subprocess.run(
                args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
            )
            lines = [
                line for line in done.stderr.splitlines() if line.startswith("storage-events:")
            ]
        else:
            done = run_command(args, env)
            lines = error_lines(done.stderr)
            if args[1] == "connectors":  # a bridge's own INFO log lines may come first
                assert "Traceback" not in done.stderr and "ERROR" not in done.stderr, done.stderr
                lines = [line for line in lines if line.startswith("connectors:")]
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        assert len(lines) == 1, (name, done.stderr)
        assert "KAFKA_SASL_PASSWORD" in lines[0] and "refused" in lines[0], (name, lines)
        assert WRONG_PASSWORD not in done.stdout + done.stderr, name
        assert secured_kafka.client_env["KAFKA_SASL_PASSWORD"] not in done.stdout + done.stderr


def other_ca(directory: Path) -> Path:
    """A CA certificate that signed nothing the broker has."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "some other CA")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = directory / "other-ca.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def test_an_untrusted_broker_certificate_is_one_line_naming_the_ca_setting(
    secured_kafka: SecuredBroker, tmp_path: Path
) -> None:
    env = client_environ(
        {**secured_kafka.client_env, "KAFKA_SSL_CA_LOCATION": str(other_ca(tmp_path))}
    )
    done = run_command(["-m", "streams", "tail", "--topic", "any", "--count", "1"], env)
    assert done.returncode == 2, done.stderr
    [line] = error_lines(done.stderr)
    assert line.startswith("error: KAFKA_SSL_CA_LOCATION (kafka.ssl_ca_location): the broker's"), (
        line
    )
    assert "not trusted" in line


def test_a_plaintext_client_is_refused(secured_kafka: SecuredBroker) -> None:
    plaintext = KafkaSettings(bootstrap_servers=secured_kafka.bootstrap)
    problem = asyncio.run(check_access(plaintext, timeout_s=5))
    assert problem is not None and problem[0].startswith("KAFKA_SECURITY_PROTOCOL"), problem

    async def produce() -> None:
        producer = AIOKafkaProducer(**plaintext.aiokafka_args(), request_timeout_ms=5000)
        try:
            await producer.start()
            await producer.send_and_wait("files.raw", b"should never land")
        finally:
            await producer.stop()

    with pytest.raises((KafkaConnectionError, TimeoutError)):
        asyncio.run(asyncio.wait_for(produce(), 20))
    assert asyncio.run(check_access(settings_of(secured_kafka.client_env))) is None


def test_worker_and_webhook_bridge_over_mutual_tls(
    mtls_kafka: SecuredBroker, tmp_path: Path
) -> None:
    env = mtls_kafka.client_env
    assert env["KAFKA_SECURITY_PROTOCOL"] == "SSL" and "KAFKA_SASL_MECHANISM" not in env
    names = Topology()
    worker = Worker(
        mtls_kafka.bootstrap, config_text(names), tmp_path / "worker", env=client_environ(env)
    )
    worker.start()
    webhook, port = webhook_bridge(worker.config_path, env, tmp_path)
    try:
        post_s3(port, webhook, "mtls/three.txt", "0055AED6DCD90281F0")
        printed = tail(names.output("default"), client_environ(env), count=1, timeout_s=60)
    finally:
        webhook_code = webhook.stop()
        worker_code = worker.stop()
    assert [event["key"] for event in printed] == ["mtls/three.txt"], worker.tail()
    assert webhook_code == 0, webhook.log()
    assert worker_code == 0, worker.tail()
    # Without the client certificate the broker refuses the TLS handshake.
    no_cert = {
        key: value
        for key, value in env.items()
        if key not in ("KAFKA_SSL_CERT_LOCATION", "KAFKA_SSL_KEY_LOCATION")
    }
    problem = asyncio.run(check_access(settings_of(no_cert), timeout_s=10))
    assert problem is not None, "a client without a certificate was let in"


def worker_log_lines(worker: Worker, text: str) -> list[str]:
    return [
        line for line in worker.log_path.read_text(errors="replace").splitlines() if text in line
    ]


@pytest.mark.slow
def test_a_running_worker_whose_password_is_revoked_says_so_and_recovers(
    secured_kafka: SecuredBroker, tmp_path: Path
) -> None:
    """The worker's user loses its password while it runs (changed, and the broker restarted
    so that every connection authenticates again): the worker stays up, says why once per
    cause every few seconds, naming the setting, and goes on once the password is back."""
    user = f"revoked-{uuid.uuid4().hex[:6]}"
    password = uuid.uuid4().hex
    env = secured_kafka.user(user, password)
    secured_kafka.admin(
        "\n".join(
            f"kafka-acls.sh --add --allow-principal User:{user} --operation All {resource}"
            for resource in ("--topic '*'", "--group '*'", "--transactional-id '*'", "--cluster")
        )
        + "\n"
    )
    names = Topology()
    worker = Worker(
        secured_kafka.bootstrap, config_text(names), tmp_path / "worker", env=client_environ(env)
    ).start()
    admin = settings_of(secured_kafka.client_env)

    def deliver(key: str, sequencer: str) -> None:
        async def send() -> None:
            producer = AIOKafkaProducer(**admin.aiokafka_args(), acks="all")
            await producer.start()
            try:
                body = s3_body(s3_record(key, sequencer, bucket="revoked"))
                await producer.send_and_wait(names.raw, body, headers=[("source", b"s3")])
            finally:
                await producer.stop()

        asyncio.run(send())

    refused = "Kafka refuses this client, retrying: "
    try:
        deliver("before.txt", "0055AED6DCD9028100")
        worker.wait_metric("storage_events_emitted_total", 1)
        secured_kafka.user(user, "revoked-" + uuid.uuid4().hex)
        secured_kafka.stop()
        secured_kafka.start()
        wait_for(lambda: worker_log_lines(worker, refused), 90, "the worker to say it is refused")
        [said, *_] = worker_log_lines(worker, refused)
        assert "KAFKA_SASL_PASSWORD (kafka.sasl_password): Kafka refused the password" in said
        first = len(worker_log_lines(worker, refused))
        started = time.monotonic()
        wait_for(lambda: time.monotonic() - started > 10, 15, "ten seconds of refusals")
        during = len(worker_log_lines(worker, refused)) - first
        assert worker.process is not None and worker.process.poll() is None, worker.tail()
        # One line per cause and logger every 5 s (streams.logs), not one per retry.
        assert 0 < during <= 30, worker.tail(80)
        secured_kafka.user(user, password)  # the password back: the worker goes on
        deliver("after.txt", "0055AED6DCD9028200")
        worker.wait_metric("storage_events_emitted_total", 2, timeout_s=120)
    finally:
        code = worker.stop()
    assert code == 0, worker.tail(60)
    assert password not in worker.log_path.read_text(errors="replace")


@pytest.mark.parametrize("broker", ["secured_kafka", "mtls_kafka"])
def test_the_librdkafka_properties_connect_as_the_aiokafka_arguments_do(
    broker: str, request: pytest.FixtureRequest
) -> None:
    """The engine's librdkafka clients (issue 15) get the same connection from the same
    settings: a confluent-kafka producer and consumer round-trip a record on the broker."""
    confluent = pytest.importorskip("confluent_kafka")
    secured: SecuredBroker = request.getfixturevalue(broker)
    kafka = settings_of(secured.client_env)
    topic = f"librdkafka-{uuid.uuid4().hex[:8]}"
    asyncio.run(ensure_topics(kafka, [TopicSpec(topic, 1, 1)], retry_for_s=30))
    config = kafka.librdkafka_config()
    delivered: list[Any] = []
    producer = confluent.Producer({**config, "acks": "all"})
    producer.produce(topic, b"via librdkafka", on_delivery=lambda error, _: delivered.append(error))
    assert producer.flush(30) == 0 and delivered == [None]
    consumer = confluent.Consumer(
        {
            **config,
            "group.id": f"librdkafka-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe([topic])

        def polled() -> Any:
            message = consumer.poll(1.0)
            return message if message is not None and message.error() is None else None

        message = wait_for(polled, 60, "the record through librdkafka", interval_s=0)
    finally:
        consumer.close()
    assert message.value() == b"via librdkafka"
