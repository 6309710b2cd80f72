"""localkafka.py's security and state-directory rules, without starting a broker."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dev.kafka import localkafka
from dev.kafka.localkafka import Layout, LocalKafkaError


def layout(tmp_path: Path, security: str = "sasl_ssl", port: int = 19150) -> Layout:
    return Layout(root=tmp_path / "kafka", port=port, heap="512m", security=security)


def test_the_default_state_directory_follows_the_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_KAFKA_DIR", raising=False)
    monkeypatch.setenv("LOCAL_KAFKA_PORT", "9092")
    assert Layout.from_env().root == Path.home() / ".cache" / "storage-events" / "kafka"
    monkeypatch.setenv("LOCAL_KAFKA_PORT", "19151")
    assert Layout.from_env().root == Path.home() / ".cache" / "storage-events" / "kafka-19151"
    monkeypatch.setenv("LOCAL_KAFKA_DIR", "/tmp/elsewhere")
    assert Layout.from_env().root == Path("/tmp/elsewhere")


def test_an_unknown_security_names_both_ways_to_set_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_KAFKA_SECURITY", "kerberos")
    with pytest.raises(LocalKafkaError, match=r"--security / LOCAL_KAFKA_SECURITY .*'kerberos'"):
        Layout.from_env()
    assert Layout.from_env("SASL_SSL").security == "sasl_ssl"


def test_sasl_ssl_properties_enable_tls_scram_and_the_authorizer(tmp_path: Path) -> None:
    secured = layout(tmp_path)
    localkafka.ensure_credentials(secured)
    localkafka.write_properties(secured)
    properties = dict(
        line.split("=", 1) for line in secured.properties.read_text().splitlines() if line
    )
    assert properties["listeners"] == "SASL_SSL://127.0.0.1:19150,CONTROLLER://127.0.0.1:19151"
    assert properties["listener.security.protocol.map"] == "CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL"
    assert properties["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert properties["authorizer.class.name"] == (
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    )
    assert properties["allow.everyone.if.no.acl.found"] == "false"
    assert "User:admin" in properties["super.users"].split(";")
    assert (
        secured.admin_password_file.read_text().strip()
        in (properties["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"])
    )
    assert Path(properties["ssl.keystore.location"]).read_text().count("BEGIN CERTIFICATE") == 2
    assert "ssl.client.auth" not in properties
    # The broker's certificate names the address clients verify (hostname verification on).
    text = subprocess.run(
        ["openssl", "x509", "-noout", "-text", "-in", str(secured.tls_dir / "broker.pem")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "IP Address:127.0.0.1" in text and "DNS:localhost" in text


def test_ssl_requires_client_certificates_and_plaintext_adds_nothing(tmp_path: Path) -> None:
    mutual = layout(tmp_path, "ssl")
    localkafka.ensure_credentials(mutual)
    lines = localkafka.security_properties(mutual)
    assert "ssl.client.auth=required" in lines
    assert not any(line.startswith("sasl.") for line in lines)
    assert localkafka.security_properties(layout(tmp_path, "plaintext")) == []


def test_client_env_sources_in_a_shell_to_the_same_settings(tmp_path: Path) -> None:
    secured = layout(tmp_path)
    localkafka.ensure_credentials(secured)
    secured.admin_password_file.write_text('it\'s $a "hard" one\n')  # quoting is tested
    localkafka.write_client_env(secured)
    sourced = subprocess.run(
        ["bash", "-c", f'set -a; . "{secured.client_env}"; env -0'],
        capture_output=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    ).stdout.decode()
    environ = dict(entry.split("=", 1) for entry in sourced.split("\0") if "=" in entry)
    assert {name: environ[name] for name in localkafka.client_settings(secured)} == {
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:19150",
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_SSL_CA_LOCATION": str(secured.tls_dir / "ca.pem"),
        "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "KAFKA_SASL_USERNAME": "admin",
        "KAFKA_SASL_PASSWORD": 'it\'s $a "hard" one',
    }
    assert secured.client_env.stat().st_mode & 0o077 == 0


def test_the_running_listener_is_read_back_from_server_properties(tmp_path: Path) -> None:
    plain = layout(tmp_path, "plaintext", port=19160)
    plain.root.mkdir(parents=True)
    assert localkafka.running_listener(plain) is None
    localkafka.write_properties(plain)
    assert localkafka.running_listener(plain) == ("plaintext", 19160)
    moved = Layout(root=plain.root, port=19170, heap="512m")
    with pytest.raises(LocalKafkaError) as refused:
        localkafka.refuse_if_running_otherwise(moved, pid=4321)
    message = str(refused.value)
    assert "(pid 4321) on port 19160 (plaintext)" in message and "\n" not in message
    localkafka.refuse_if_running_otherwise(plain, pid=4321)  # the same: no refusal
