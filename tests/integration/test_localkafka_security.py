"""`localkafka.py start --security sasl_ssl|ssl`: the secured local broker, through real clients.

What a client of the product gets from the broker's client.env works (SCRAM-SHA-512 over TLS
with hostname verification; a client certificate for mutual TLS), and what it does not hold
is refused: a plaintext client, a wrong password, TLS without a client certificate, and a
principal without ACLs.
"""

from __future__ import annotations

import asyncio
import ssl
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, KafkaError, TopicAuthorizationFailedError
from aiokafka.helpers import create_ssl_context
from support.secured_broker import SecuredBroker, parse_env_file

pytestmark = pytest.mark.kafka


def client_args(settings: dict[str, str]) -> dict[str, object]:
    """aiokafka's arguments for the KAFKA_* settings of a client.env (as the product reads
    them; written here once more so that this test checks the file, not the product)."""
    args: dict[str, object] = {
        "bootstrap_servers": settings["KAFKA_BOOTSTRAP_SERVERS"],
        "security_protocol": settings["KAFKA_SECURITY_PROTOCOL"],
        "ssl_context": create_ssl_context(
            cafile=settings["KAFKA_SSL_CA_LOCATION"],
            certfile=settings.get("KAFKA_SSL_CERT_LOCATION"),
            keyfile=settings.get("KAFKA_SSL_KEY_LOCATION"),
        ),
    }
    if "KAFKA_SASL_MECHANISM" in settings:
        args |= {
            "sasl_mechanism": settings["KAFKA_SASL_MECHANISM"],
            "sasl_plain_username": settings["KAFKA_SASL_USERNAME"],
            "sasl_plain_password": settings["KAFKA_SASL_PASSWORD"],
        }
    return args


async def round_trip(settings: dict[str, str]) -> bytes:
    """Write one record to a new topic and read it back; its value."""
    topic = f"secured-{uuid.uuid4().hex[:8]}"
    value = uuid.uuid4().bytes
    producer = AIOKafkaProducer(**client_args(settings), enable_idempotence=True)  # type: ignore[arg-type]
    await producer.start()
    try:
        await producer.send_and_wait(topic, value)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic,
        **client_args(settings),  # type: ignore[arg-type]
        group_id=f"{topic}-group",
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        message = await asyncio.wait_for(consumer.getone(), 60)
    finally:
        await consumer.stop()
    assert message.value is not None
    return message.value


async def refused(**args: object) -> BaseException:
    """The error a producer with `args` gets (start + one send), which must fail."""
    producer = AIOKafkaProducer(request_timeout_ms=5000, **args)  # type: ignore[arg-type]
    try:
        await asyncio.wait_for(producer.start(), 30)
        await asyncio.wait_for(producer.send_and_wait(f"refused-{uuid.uuid4().hex[:8]}", b"x"), 30)
    except (KafkaError, OSError, TimeoutError, ssl.SSLError) as exc:
        return exc
    finally:
        await producer.stop()
    raise AssertionError(f"a producer with {sorted(args)} was not refused")


def test_client_env_names_every_setting_of_a_sasl_ssl_client(
    secured_kafka: SecuredBroker,
) -> None:
    settings = parse_env_file(secured_kafka.client_env_file.read_text())
    assert settings == {
        "KAFKA_BOOTSTRAP_SERVERS": secured_kafka.bootstrap,
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "KAFKA_SASL_USERNAME": "admin",
        "KAFKA_SASL_PASSWORD": secured_kafka.admin_password,
        "KAFKA_SSL_CA_LOCATION": str(secured_kafka.ca_file),
        # where the broker is, so that localkafka.py (admin, stop) follows a sourced file
        "LOCAL_KAFKA_PORT": secured_kafka.bootstrap.rpartition(":")[2],
        "LOCAL_KAFKA_DIR": str(secured_kafka.directory),
    }
    assert len(secured_kafka.admin_password) >= 32
    assert (secured_kafka.client_env_file.stat().st_mode & 0o077) == 0  # it holds a password
    properties = (secured_kafka.directory / "server.properties").read_text()
    assert "org.apache.kafka.metadata.authorizer.StandardAuthorizer" in properties
    assert "advertised.listeners=SASL_SSL://" in properties


def test_a_client_with_client_env_round_trips_over_sasl_ssl(secured_kafka: SecuredBroker) -> None:
    value = asyncio.run(round_trip(secured_kafka.client_env))
    assert len(value) == 16


def broker_log_count(broker: SecuredBroker, text: str) -> int:
    return broker.log.read_text(errors="replace").count(text)


def test_a_plaintext_client_is_refused(secured_kafka: SecuredBroker) -> None:
    before = broker_log_count(secured_kafka, "(SSL handshake failed)")
    error = asyncio.run(refused(bootstrap_servers=secured_kafka.bootstrap))
    assert isinstance(error, KafkaConnectionError | TimeoutError)
    # The broker says why: the plaintext bytes are not a TLS handshake.
    assert broker_log_count(secured_kafka, "(SSL handshake failed)") > before


def test_a_wrong_password_is_refused(secured_kafka: SecuredBroker) -> None:
    reason = "invalid credentials with SASL mechanism SCRAM-SHA-512"
    before = broker_log_count(secured_kafka, reason)
    wrong = {**secured_kafka.client_env, "KAFKA_SASL_PASSWORD": "not-the-password"}
    error = asyncio.run(refused(**client_args(wrong)))
    assert isinstance(error, KafkaConnectionError)
    assert broker_log_count(secured_kafka, reason) > before


def test_a_user_without_acls_is_denied_the_topic(secured_kafka: SecuredBroker) -> None:
    nobody = secured_kafka.user(f"nobody-{uuid.uuid4().hex[:6]}")
    error = asyncio.run(refused(**client_args(nobody)))
    assert isinstance(error, TopicAuthorizationFailedError)


def test_mutual_tls_round_trips_with_the_client_certificate(mtls_kafka: SecuredBroker) -> None:
    settings = parse_env_file(mtls_kafka.client_env_file.read_text())
    assert settings["KAFKA_SECURITY_PROTOCOL"] == "SSL"
    assert "KAFKA_SASL_USERNAME" not in settings
    assert settings["KAFKA_SSL_CERT_LOCATION"].endswith("admin.pem")
    properties = (mtls_kafka.directory / "server.properties").read_text()
    assert "ssl.client.auth=required" in properties
    value = asyncio.run(round_trip(settings))
    assert len(value) == 16


def test_mutual_tls_refuses_a_client_without_a_certificate(mtls_kafka: SecuredBroker) -> None:
    anonymous = dict(mtls_kafka.client_env)
    del anonymous["KAFKA_SSL_CERT_LOCATION"], anonymous["KAFKA_SSL_KEY_LOCATION"]
    error = asyncio.run(refused(**client_args(anonymous)))
    assert isinstance(error, KafkaConnectionError | TimeoutError | ssl.SSLError)


def test_mutual_tls_principal_is_the_certificates_cn(mtls_kafka: SecuredBroker) -> None:
    stranger = mtls_kafka.client_cert(f"stranger-{uuid.uuid4().hex[:6]}")
    error = asyncio.run(refused(**client_args(stranger)))
    assert isinstance(error, TopicAuthorizationFailedError)
