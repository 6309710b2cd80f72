"""A plaintext client against the SASL_SSL listener is told the security protocol (issue 24,
item 7): before, `create-topics` retried `KafkaConnectionError("Unable to bootstrap ...")` with
a guess; now it stops with one line saying the listener speaks TLS, naming the setting."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from support.secured_broker import SecuredBroker
from support.worker import ROOT

pytestmark = pytest.mark.kafka


def test_a_plaintext_client_of_a_sasl_ssl_listener_is_told_it_speaks_tls(
    secured_kafka: SecuredBroker,
) -> None:
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("KAFKA_", "LOCAL_KAFKA_"))
    }
    env["KAFKA_BOOTSTRAP_SERVERS"] = secured_kafka.bootstrap  # the README's mistake: no client.env
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "streams", "create-topics", "--wait", "60"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert time.monotonic() - began < 30  # at once, not after retrying for --wait
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: KAFKA_SECURITY_PROTOCOL (kafka.security_protocol) is ")
    assert f"the listener at {secured_kafka.bootstrap} speaks TLS" in lines[0]
    assert "SASL_SSL" in lines[0]
