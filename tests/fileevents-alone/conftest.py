"""Fixtures of the fileevents distribution's suite: a Kafka broker and, where there is one,
redis-server. Standard library, pytest and fileevents only: this suite runs in a virtualenv
with the distribution alone (dev/fileevents-alone.sh), and in the repository's whole suite.

The broker: FILEEVENTS_TEST_BOOTSTRAP when set (dev/fileevents-alone.sh starts one for every
Python it runs), else the repository suite's `kafka_bootstrap` (its session broker)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def bootstrap(request: pytest.FixtureRequest) -> str:
    given = os.environ.get("FILEEVENTS_TEST_BOOTSTRAP")
    if given:
        return given
    try:
        return str(request.getfixturevalue("kafka_bootstrap"))
    except pytest.FixtureLookupError:
        pytest.fail("no broker: set FILEEVENTS_TEST_BOOTSTRAP (dev/fileevents-alone.sh does)")


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A redis-server of this session's own, on a free port (skipped where there is none:
    `make test` installs it)."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as directory:
        process = subprocess.Popen(
            [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", directory],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or process.poll() is not None:
                        pytest.fail("redis-server did not start")
                    time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.terminate()
            process.wait(timeout=10)
