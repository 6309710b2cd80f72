"""streams.kafka_settings: one connection configuration rendered for aiokafka, Faust and
librdkafka; environment precedence; validation naming the field; secrets kept out of text."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import faust
import pytest
from aiohttp import web
from aiokafka import errors as kafka_errors
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from streams.config import ConfigError, load_settings
from streams.kafka_settings import (
    ENVIRONMENT,
    KafkaAccessError,
    KafkaRefusalWording,
    KafkaSettings,
    MskIamTokenProvider,
    OidcTokenProvider,
    explain,
)

PASSWORD = "s3cr3t-Pa55word-never-shown"
CLIENT_SECRET = "oidc-client-secret-never-shown"


@dataclass
class Pki:
    ca: Path
    cert: Path
    key: Path
    encrypted_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA and a client certificate signed by it, as PEM files."""
    directory = tmp_path_factory.mktemp("pki")
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("test-ca"))
        .issuer_name(_name("test-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("client"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(ca_key, hashes.SHA256())
    )
    paths = Pki(
        directory / "ca.pem",
        directory / "client.pem",
        directory / "client.key",
        directory / "client-encrypted.key",
    )
    paths.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    paths.encrypted_key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"key-pass"),
        )
    )
    return paths


def scram(ca: Path | None = None, **fields: Any) -> KafkaSettings:
    return KafkaSettings(
        bootstrap_servers="b-1.example:9096,b-2.example:9096",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="storage-events",
        sasl_password=PASSWORD,
        ssl_ca_location=ca,
        **fields,
    )


# --- the three renderings ---------------------------------------------------------------


def test_default_is_plaintext_on_localhost_in_every_rendering() -> None:
    kafka = KafkaSettings()
    assert kafka.aiokafka_args() == {
        "bootstrap_servers": "127.0.0.1:9092",
        "security_protocol": "PLAINTEXT",
    }
    assert kafka.librdkafka_config() == {
        "bootstrap.servers": "127.0.0.1:9092",
        "security.protocol": "PLAINTEXT",
    }
    assert kafka.faust_args() == {"broker": ["kafka://127.0.0.1:9092"], "broker_credentials": None}


def test_sasl_ssl_scram_renders_the_same_connection_three_ways(pki: Pki) -> None:
    kafka = scram(pki.ca)

    args = kafka.aiokafka_args()
    context = args.pop("ssl_context")
    assert args == {
        "bootstrap_servers": "b-1.example:9096,b-2.example:9096",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "storage-events",
        "sasl_plain_password": PASSWORD,
    }
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert [cert["subject"] for cert in context.get_ca_certs()] == [((("commonName", "test-ca"),),)]

    assert kafka.librdkafka_config() == {
        "bootstrap.servers": "b-1.example:9096,b-2.example:9096",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "storage-events",
        "sasl.password": PASSWORD,
        "ssl.ca.location": str(pki.ca),
        "ssl.endpoint.identification.algorithm": "https",
    }

    rendered = kafka.faust_args()
    assert rendered["broker"] == ["kafka://b-1.example:9096", "kafka://b-2.example:9096"]
    credentials = rendered["broker_credentials"]
    assert isinstance(credentials, faust.SASLCredentials)
    # What Faust hands its own aiokafka clients is what ours get.
    faust_auth = credentials_to_aiokafka_auth(credentials)
    assert faust_auth.pop("ssl_context").get_ca_certs() == context.get_ca_certs()
    assert faust_auth == {key: value for key, value in args.items() if key != "bootstrap_servers"}


def test_no_ca_location_trusts_the_system_store() -> None:
    context = scram().ssl_context()
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    assert "ssl.ca.location" not in scram().librdkafka_config()


def test_mutual_tls_without_sasl(pki: Pki) -> None:
    kafka = KafkaSettings(
        security_protocol="SSL",
        ssl_ca_location=pki.ca,
        ssl_cert_location=pki.cert,
        ssl_key_location=pki.key,
    )
    args = kafka.aiokafka_args()
    assert args["security_protocol"] == "SSL" and "sasl_mechanism" not in args
    assert kafka.librdkafka_config() == {
        "bootstrap.servers": "127.0.0.1:9092",
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki.ca),
        "ssl.certificate.location": str(pki.cert),
        "ssl.key.location": str(pki.key),
        "ssl.endpoint.identification.algorithm": "https",
    }
    credentials = kafka.faust_args()["broker_credentials"]
    assert isinstance(credentials, faust.SSLCredentials)
    assert credentials_to_aiokafka_auth(credentials)["security_protocol"] == "SSL"


def test_encrypted_client_key_needs_its_password(pki: Pki) -> None:
    fields: dict[str, Any] = {
        "security_protocol": "SSL",
        "ssl_cert_location": pki.cert,
        "ssl_key_location": pki.encrypted_key,
    }
    kafka = KafkaSettings(**fields, ssl_key_password="key-pass")
    assert kafka.librdkafka_config()["ssl.key.password"] == "key-pass"
    with pytest.raises(ValueError, match="ssl_cert_location: the client certificate"):
        KafkaSettings(**fields, ssl_key_password="wrong")
    with pytest.raises(ValueError, match="ssl_cert_location"):
        KafkaSettings(**fields)  # no terminal prompt: an error naming the field


def test_hostname_verification_is_on_unless_turned_off(pki: Pki) -> None:
    off = scram(pki.ca, ssl_endpoint_identification_algorithm="none")
    context = off.ssl_context()
    assert context is not None
    assert not context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    assert off.librdkafka_config()["ssl.endpoint.identification.algorithm"] == "none"
    assert "hostname NOT verified" in off.describe()


def test_sasl_plaintext_plain_has_no_tls() -> None:
    kafka = KafkaSettings(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="key",
        sasl_password=PASSWORD,
    )
    assert "ssl_context" not in kafka.aiokafka_args()
    credentials = kafka.faust_args()["broker_credentials"]
    assert credentials_to_aiokafka_auth(credentials) == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "key",
        "sasl_plain_password": PASSWORD,
        "ssl_context": None,
    }


def oidc(url: str = "https://idp.example/oauth2/token", **fields: Any) -> KafkaSettings:
    return KafkaSettings(
        security_protocol="SASL_SSL",
        sasl_mechanism="OAUTHBEARER",
        sasl_oauthbearer_token_endpoint_url=url,
        sasl_oauthbearer_client_id="storage-events",
        sasl_oauthbearer_client_secret=CLIENT_SECRET,
        **fields,
    )


def test_oidc_renders_librdkafkas_own_method_and_one_shared_provider() -> None:
    kafka = oidc(sasl_oauthbearer_scope="kafka")
    config = kafka.librdkafka_config()
    assert {name: value for name, value in config.items() if name.startswith("sasl.")} == {
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.token.endpoint.url": "https://idp.example/oauth2/token",
        "sasl.oauthbearer.client.id": "storage-events",
        "sasl.oauthbearer.client.secret": CLIENT_SECRET,
        "sasl.oauthbearer.scope": "kafka",
    }
    first, second = kafka.aiokafka_args(), kafka.aiokafka_args()
    assert isinstance(first["sasl_oauth_token_provider"], OidcTokenProvider)
    assert first["sasl_oauth_token_provider"] is second["sasl_oauth_token_provider"]
    assert first["sasl_mechanism"] == "OAUTHBEARER" and "sasl_plain_password" not in first
    credentials = kafka.faust_args()["broker_credentials"]
    assert isinstance(credentials, faust.OAuthCredentials)
    auth = credentials_to_aiokafka_auth(credentials)
    assert auth["security_protocol"] == "SASL_SSL"
    assert auth["sasl_oauth_token_provider"] is first["sasl_oauth_token_provider"]


@pytest.fixture
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def test_msk_iam_signs_a_token_for_the_region(aws_credentials: None) -> None:
    kafka = KafkaSettings(
        security_protocol="SASL_SSL",
        sasl_mechanism="OAUTHBEARER",
        sasl_oauthbearer_method="aws_msk_iam",
        sasl_oauthbearer_aws_region="eu-west-1",
    )
    provider = kafka.aiokafka_args()["sasl_oauth_token_provider"]
    assert isinstance(provider, MskIamTokenProvider)
    token = asyncio.run(provider.token())
    url = urlsplit(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode())
    assert url.hostname == "kafka.eu-west-1.amazonaws.com"
    query = parse_qs(url.query)
    assert query["Action"] == ["kafka-cluster:Connect"]
    assert query["X-Amz-Credential"][0].startswith("AKIAIOSFODNN7EXAMPLE/")
    assert asyncio.run(provider.token()) == token  # cached, not signed again
    callback = kafka.librdkafka_config()["oauth_cb"]
    signed, expiry = callback("")
    assert signed and time.time() < expiry <= time.time() + 3600
    assert "sasl.oauthbearer.method" not in kafka.librdkafka_config()


def test_msk_iam_needs_a_region() -> None:
    with pytest.raises(ValueError, match="sasl_oauthbearer_aws_region: required"):
        KafkaSettings(
            security_protocol="SASL_SSL",
            sasl_mechanism="OAUTHBEARER",
            sasl_oauthbearer_method="aws_msk_iam",
        )


# --- file and environment ---------------------------------------------------------------


def test_every_environment_variable_overrides_its_field_of_the_file(
    tmp_path: Path, pki: Pki
) -> None:
    config = tmp_path / "streams.toml"
    config.write_text(
        '[kafka]\nbootstrap_servers = "file:9092"\nsecurity_protocol = "SASL_SSL"\n'
        'sasl_mechanism = "PLAIN"\nsasl_username = "from-file"\nsasl_password = "file-pass"\n'
    )
    from_file = load_settings(config, environ={}).kafka
    assert (from_file.bootstrap_servers, from_file.sasl_username) == ("file:9092", "from-file")
    environ = {
        "KAFKA_BOOTSTRAP_SERVERS": "env-1:9093,env-2:9093",
        "KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
        "KAFKA_SASL_USERNAME": "from-env",
        "KAFKA_SASL_PASSWORD": PASSWORD,
        "KAFKA_SSL_CA_LOCATION": str(pki.ca),
        "KAFKA_SSL_CERT_LOCATION": str(pki.cert),
        "KAFKA_SSL_KEY_LOCATION": str(pki.key),
        "KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM": "none",
    }
    kafka = load_settings(config, environ=environ).kafka
    assert kafka.librdkafka_config() == {
        "bootstrap.servers": "env-1:9093,env-2:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "from-env",
        "sasl.password": PASSWORD,
        "ssl.ca.location": str(pki.ca),
        "ssl.certificate.location": str(pki.cert),
        "ssl.key.location": str(pki.key),
        "ssl.endpoint.identification.algorithm": "none",
    }
    protocol = load_settings(config, environ={"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"})
    assert protocol.kafka.security_protocol == "SASL_PLAINTEXT"


def test_every_kafka_variable_names_a_kafka_field() -> None:
    from streams.config import ENVIRONMENT as ALL

    fields = set(KafkaSettings.model_fields)
    for variable, field in ENVIRONMENT.items():
        assert field in fields, variable
        assert ALL[variable] == ("kafka", field)
    assert set(ENVIRONMENT.values()) == fields
    assert {
        "KAFKA_SECURITY_PROTOCOL",
        "KAFKA_SASL_MECHANISM",
        "KAFKA_SASL_USERNAME",
        "KAFKA_SASL_PASSWORD",
        "KAFKA_SASL_PASSWORD_FILE",
        "KAFKA_SSL_CA_LOCATION",
        "KAFKA_SSL_CERT_LOCATION",
        "KAFKA_SSL_KEY_LOCATION",
        "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL",
        "KAFKA_SASL_OAUTHBEARER_CLIENT_ID",
        "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET",
        "KAFKA_SASL_OAUTHBEARER_SCOPE",
    } <= set(ENVIRONMENT)


def test_password_file_is_read_at_start_up(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    kafka = load_settings(
        environ={
            "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "KAFKA_SASL_USERNAME": "u",
            "KAFKA_SASL_PASSWORD_FILE": str(secret),
        }
    ).kafka
    assert kafka.aiokafka_args()["sasl_plain_password"] == PASSWORD
    assert kafka.librdkafka_config()["sasl.password"] == PASSWORD
    assert PASSWORD not in repr(kafka)
    secret.write_text("")
    with pytest.raises(ConfigError, match=r"sasl_password_file: .* is empty"):
        load_settings(
            environ={
                "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "KAFKA_SASL_MECHANISM": "PLAIN",
                "KAFKA_SASL_USERNAME": "u",
                "KAFKA_SASL_PASSWORD_FILE": str(secret),
            }
        )


def test_from_environ_for_fileevents_with_the_callers_address() -> None:
    environ = {
        "KAFKA_BOOTSTRAP_SERVERS": "ignored:9092",
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "KAFKA_SASL_USERNAME": "consumer",
        "KAFKA_SASL_PASSWORD": PASSWORD,
    }
    kafka = KafkaSettings.from_environ(environ, bootstrap_servers="given:9092")
    assert kafka.bootstrap_servers == "given:9092"
    assert kafka.sasl_username == "consumer" and kafka.security_protocol == "SASL_SSL"
    with pytest.raises(ValueError) as raised:
        KafkaSettings.from_environ({**environ, "KAFKA_SASL_MECHANISM": "MD5"})
    message = str(raised.value)
    assert "kafka.sasl_mechanism" in message and "KAFKA_SASL_MECHANISM" in message
    assert PASSWORD not in message


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "sasl_mechanism: required"),
        ({"KAFKA_SECURITY_PROTOCOL": "TLS"}, "kafka.security_protocol"),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512"},
            "sasl_username: required with sasl_mechanism SCRAM-SHA-512",
        ),
        (
            {
                "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "KAFKA_SASL_MECHANISM": "PLAIN",
                "KAFKA_SASL_USERNAME": "u",
            },
            "sasl_password: required with sasl_mechanism PLAIN",
        ),
        (
            {"KAFKA_SASL_MECHANISM": "PLAIN"},
            "sasl_mechanism: set, but security_protocol PLAINTEXT uses no SASL "
            r".*\(from environment variable KAFKA_SASL_MECHANISM\)",
        ),
        (
            {"KAFKA_SSL_CA_LOCATION": "/etc/ca.pem"},
            "ssl_ca_location: set, but security_protocol PLAINTEXT uses no TLS",
        ),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CA_LOCATION": "/no/such/ca.pem"},
            r"ssl_ca_location: no such file '/no/such/ca.pem' \(from environment variable "
            "KAFKA_SSL_CA_LOCATION\\)",
        ),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CERT_LOCATION": "/tmp"},
            "ssl_key_location: mutual TLS needs both",
        ),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": "OAUTHBEARER"},
            "sasl_oauthbearer_token_endpoint_url: required with sasl_oauthbearer_method oidc",
        ),
        (
            {
                "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "KAFKA_SASL_MECHANISM": "PLAIN",
                "KAFKA_SASL_USERNAME": "u",
                "KAFKA_SASL_PASSWORD": PASSWORD,
                "KAFKA_SASL_PASSWORD_FILE": "/run/secret",
            },
            "sasl_password_file: set sasl_password or sasl_password_file, not both",
        ),
        ({"KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM": "off"}, "ssl_endpoint_identification"),
    ],
)
def test_a_mistake_stops_start_up_naming_the_field(environ: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected) as raised:
        load_settings(environ=environ)
    assert PASSWORD not in str(raised.value)


def test_a_ca_file_that_is_not_pem_names_the_field(tmp_path: Path) -> None:
    bogus = tmp_path / "ca.pem"
    bogus.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"ssl_ca_location: .* holds no usable PEM CA"):
        load_settings(
            environ={"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CA_LOCATION": str(bogus)}
        )


# --- secrets ------------------------------------------------------------------------------


def test_secrets_never_appear_in_repr_str_dumps_logs_or_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    environ = {
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "KAFKA_SASL_USERNAME": "u",
        "KAFKA_SASL_PASSWORD": PASSWORD,
    }
    settings = load_settings(environ=environ)
    kafka = settings.kafka
    logging.getLogger("test").warning("settings: %s / %r / %s", settings, kafka, kafka.describe())
    texts = [
        repr(kafka),
        str(kafka),
        repr(settings),
        kafka.model_dump_json(),
        str(kafka.model_dump()),
        kafka.describe(),
        repr(kafka.faust_args()["broker_credentials"]),
        caplog.text,
    ]
    for text in texts:
        assert PASSWORD not in text
    assert "**********" in repr(kafka)
    # A mistake elsewhere in the same section: the error does not quote the password.
    with pytest.raises(ConfigError) as raised:
        load_settings(environ={**environ, "KAFKA_SSL_CA_LOCATION": "/no/such/file"})
    assert PASSWORD not in str(raised.value)
    oidc_kafka = oidc()
    assert CLIENT_SECRET not in repr(oidc_kafka) and CLIENT_SECRET not in oidc_kafka.describe()


def test_explain_names_the_setting_and_never_the_password() -> None:
    kafka = scram()
    refused = kafka_errors.SaslAuthenticationFailed(
        "Authentication failed during authentication due to invalid credentials with SASL "
        "mechanism SCRAM-SHA-512"
    )
    explained = explain(refused, kafka, "b-1.example:9096")
    assert explained is not None
    line, certain = explained
    assert certain and line.startswith("KAFKA_SASL_PASSWORD (kafka.sasl_password): Kafka refused")
    assert "KAFKA_SASL_USERNAME" in line and "storage-events" in line and PASSWORD not in line
    untrusted = ssl.SSLCertVerificationError(1, "certificate verify failed")
    untrusted.verify_message = "unable to get local issuer certificate"
    explained = explain(untrusted, kafka)
    assert explained is not None and explained[0].startswith("KAFKA_SSL_CA_LOCATION")
    mismatch = ssl.SSLCertVerificationError(1, "certificate verify failed")
    mismatch.verify_message = "Hostname mismatch, certificate is not valid for 'b-1.example'."
    explained = explain(mismatch, kafka)
    assert explained is not None
    assert explained[0].startswith("KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM")
    assert explain(ConnectionRefusedError(111, "Connection refused"), kafka) is None
    closed = explain(kafka_errors.KafkaConnectionError("Connection at b-1:9096 closed"), kafka)
    assert closed is not None and closed[0].startswith("KAFKA_SECURITY_PROTOCOL") and not closed[1]


def test_the_clients_retry_lines_name_the_refused_setting() -> None:
    kafka = scram()
    wording = KafkaRefusalWording(kafka)
    refused = kafka_errors.SaslAuthenticationFailed("invalid credentials")
    record = logging.LogRecord(
        "aiokafka.client",
        logging.ERROR,
        __file__,
        1,
        "Unable connect to node with id %s: %s",
        (1, refused),
        None,
    )
    assert wording.filter(record)
    message = record.getMessage()
    assert message.startswith(
        "Kafka refuses this client, retrying: Unable connect to node with id 1: "
        "KAFKA_SASL_PASSWORD (kafka.sasl_password): Kafka refused the password"
    )
    other = logging.LogRecord(
        "aiokafka.client",
        logging.ERROR,
        __file__,
        1,
        "Unable connect to node with id %s: %s",
        (1, ConnectionRefusedError(111, "refused")),
        None,
    )
    assert wording.filter(other)
    assert other.getMessage().startswith("Unable connect to node with id 1")


# --- the OIDC client-credentials provider, against a real HTTP token endpoint --------------


@dataclass
class TokenEndpoint:
    url: str
    requests: list[dict[str, Any]]
    answer: dict[str, Any]


@pytest.fixture
def token_endpoint() -> Iterator[TokenEndpoint]:
    loop = asyncio.new_event_loop()
    endpoint = TokenEndpoint("", [], {"status": 200, "expires_in": 3600})

    async def token(request: web.Request) -> web.Response:
        form = await request.post()
        endpoint.requests.append(
            {"form": dict(form), "authorization": request.headers.get("Authorization")}
        )
        status = endpoint.answer["status"]
        if status != 200:
            return web.json_response({"error": "invalid_client"}, status=status)
        number = len(endpoint.requests)
        return web.json_response(
            {
                "access_token": f"token-{number}",
                "token_type": "Bearer",
                "expires_in": endpoint.answer["expires_in"],
            }
        )

    app = web.Application()
    app.router.add_post("/token", token)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    endpoint.url = f"http://127.0.0.1:{port}/token"
    endpoint.loop = loop  # type: ignore[attr-defined]
    yield endpoint
    loop.run_until_complete(runner.cleanup())
    loop.close()


def test_oidc_provider_fetches_caches_and_refreshes_the_token(
    token_endpoint: TokenEndpoint,
) -> None:
    now = [1_000_000.0]
    kafka = oidc(token_endpoint.url, sasl_oauthbearer_scope="kafka.write")
    provider = OidcTokenProvider(kafka, clock=lambda: now[0])
    loop: asyncio.AbstractEventLoop = token_endpoint.loop  # type: ignore[attr-defined]

    assert loop.run_until_complete(provider.token()) == "token-1"
    assert loop.run_until_complete(provider.token()) == "token-1"  # cached
    [request] = token_endpoint.requests
    assert request["form"] == {"grant_type": "client_credentials", "scope": "kafka.write"}
    expected = base64.b64encode(f"storage-events:{CLIENT_SECRET}".encode()).decode()
    assert request["authorization"] == f"Basic {expected}"
    now[0] += 3600 - 30  # within the refresh margin of expires_in
    assert loop.run_until_complete(provider.token()) == "token-2"


def test_oidc_refused_client_credentials_name_the_settings_not_the_secret(
    token_endpoint: TokenEndpoint,
) -> None:
    token_endpoint.answer["status"] = 401
    provider = OidcTokenProvider(oidc(token_endpoint.url))
    loop: asyncio.AbstractEventLoop = token_endpoint.loop  # type: ignore[attr-defined]
    with pytest.raises(KafkaAccessError) as raised:
        loop.run_until_complete(provider.token())
    message = str(raised.value)
    assert "KAFKA_SASL_OAUTHBEARER_CLIENT_ID" in message and "HTTP 401" in message
    assert CLIENT_SECRET not in message
    explained = explain(raised.value, oidc(token_endpoint.url))
    assert explained == (message, True)
