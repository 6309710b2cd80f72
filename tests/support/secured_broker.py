"""Secured brokers of the tests' own: SASL_SSL with SCRAM-SHA-512, or mutual TLS, ACLs on.

Started with `localkafka.py start --security ...` in a temporary state directory on a free
pair of ports, once per session (`secured_kafka`, `mtls_kafka`, registered in conftest.py):

    def test_something(secured_kafka: SecuredBroker) -> None:
        env = {**os.environ, **secured_kafka.client_env}   # KAFKA_* as in its client.env
        ...

`client_env` is the super user `admin`; `user()` adds a SCRAM user and returns its settings,
`client_cert()` issues a client certificate for another principal (mutual TLS), and `admin()`
applies kafka-acls.sh lines (`python -m streams acls`) through the broker's own admin tool.
"""

from __future__ import annotations

import secrets
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.kafka.private import LOCAL_KAFKA, PrivateBroker


def parse_env_file(text: str) -> dict[str, str]:
    """The NAME=value lines of a client.env (values shell-quoted), as a dict."""
    settings: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, value = line.partition("=")
        words = shlex.split(value)
        settings[name] = words[0] if words else ""
    return settings


class SecuredBroker:
    """A broker with `security` ("sasl_ssl" or "ssl") in `directory`."""

    def __init__(self, directory: Path, security: str) -> None:
        self.directory = directory
        self.security = security
        self._broker = PrivateBroker(directory)
        self._broker.env["LOCAL_KAFKA_SECURITY"] = security
        self.bootstrap = self._broker.bootstrap
        self.port = self._broker.port
        self.log = self._broker.log
        self.client_env: dict[str, str] = {}

    @property
    def client_env_file(self) -> Path:
        return self.directory / "client.env"

    @property
    def ca_file(self) -> Path:
        return self.directory / "tls" / "ca.pem"

    @property
    def admin_user(self) -> str:
        return "admin"

    @property
    def admin_password(self) -> str:
        return (self.directory / "admin.password").read_text().strip()

    def start(self, fresh: bool = False) -> str:
        """Start (or restart) it; its bootstrap address, printed last by localkafka.py."""
        address = self._broker.start(fresh=fresh)
        self.client_env = parse_env_file(self.client_env_file.read_text())
        return address

    def stop(self) -> None:
        self._broker.stop()

    def admin(self, commands: str) -> str:
        """Apply kafka-acls.sh lines and `scram USER PASSWORD` lines as the super user."""
        result = subprocess.run(
            [sys.executable, str(LOCAL_KAFKA), "admin"],
            input=commands,
            env=self._broker.env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"localkafka.py admin failed: {result.stderr.strip()}")
        return result.stdout

    def user(self, name: str, password: str | None = None) -> dict[str, str]:
        """A SCRAM-SHA-512 user `name` (no ACLs); the KAFKA_* settings of a client using it."""
        if self.security != "sasl_ssl":
            raise ValueError("SCRAM users need the sasl_ssl broker; use client_cert() for ssl")
        password = password or secrets.token_hex(12)
        self.admin(f"scram {shlex.quote(name)} {shlex.quote(password)}\n")
        return {**self.client_env, "KAFKA_SASL_USERNAME": name, "KAFKA_SASL_PASSWORD": password}

    def client_cert(self, name: str) -> dict[str, str]:
        """A client certificate with CN=`name` (principal User:`name`), signed by the broker's
        CA; the KAFKA_* settings of a client using it."""
        issued = parse_env_file(self._broker.run("client-cert", name))
        return {**self.client_env, **issued}


def _started(directory: Path, security: str) -> Iterator[SecuredBroker]:
    broker = SecuredBroker(directory, security)
    broker.start(fresh=True)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def secured_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    """A SASL_SSL broker (SCRAM-SHA-512, ACLs on); `client_env` is its super user."""
    yield from _started(tmp_path_factory.mktemp("sasl-ssl-kafka"), "sasl_ssl")


@pytest.fixture(scope="session")
def mtls_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    """An SSL broker requiring client certificates (ACLs on); `client_env` is User:admin."""
    yield from _started(tmp_path_factory.mktemp("mtls-kafka"), "ssl")
