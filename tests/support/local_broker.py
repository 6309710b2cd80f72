"""The project's own Kafka broker script, for tests that start a broker of their own."""

from __future__ import annotations

import subprocess
import sys

from dev.kafka.private import LOCAL_KAFKA, PrivateBroker, free_port_pair

__all__ = ["LOCAL_KAFKA", "PrivateBroker", "free_port_pair", "kafka_version"]


def kafka_version() -> str:
    return subprocess.run(
        [sys.executable, str(LOCAL_KAFKA), "version"], capture_output=True, text=True, check=True
    ).stdout.strip()
