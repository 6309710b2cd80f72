"""A real Pub/Sub server for the tests: Google's emulator where installed, else Google's fake.

`emulator` is a module fixture: `host:port` of a Pub/Sub server speaking gRPC, the first of

1. `PUBSUB_EMULATOR_HOST`, a server already running;
2. the Google Cloud CLI's `cloud-pubsub-emulator` (package google-cloud-cli-pubsub-emulator),
   or the start script `PUBSUB_EMULATOR_BIN` names;
3. `pubsub-fake` (dev/pubsub-fake: `pstest`, the fake of Google's Go Pub/Sub client, which
   `make test-deps` builds into .venv/bin), or the binary `PUBSUB_FAKE_BIN` names.

`PUBSUB_SERVER=fake` (or `emulator`) picks one of the last two. Without any of them the tests
that use it are skipped, except when `PUBSUB_FAKE_BIN` is set (`make test` sets it): then a
missing binary fails them, so CI never skips them quietly.
Tests import the fixture: `from support.pubsub_emulator import emulator`.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from support.processes import serving
from support.worker import ROOT, free_port

# Never let google-auth look for a metadata server off this machine.
NO_METADATA = {
    "NO_GCE_CHECK": "true",
    "GCE_METADATA_HOST": "127.0.0.1:9",
    "GCE_METADATA_IP": "127.0.0.1:9",
}

FAKE = ROOT / ".venv" / "bin" / "pubsub-fake"
"""Where `make test-deps` builds dev/pubsub-fake."""


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


def fake_binary() -> Path | None:
    """The pstest server, or None; `PUBSUB_FAKE_BIN` naming a missing file fails the test."""
    given = os.environ.get("PUBSUB_FAKE_BIN")
    if given:
        if not Path(given).is_file():
            pytest.fail(
                f"PUBSUB_FAKE_BIN={given} does not exist: `make test-deps` builds it from "
                "dev/pubsub-fake (needs Go)"
            )
        return Path(given)
    return FAKE if FAKE.is_file() else None


def _emulator_answers(host: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}/", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _port_open(host: str) -> bool:
    address, port = host.rsplit(":", 1)
    try:
        with socket.create_connection((address, int(port)), timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`host:port` of a Pub/Sub server."""
    if os.environ.get("PUBSUB_EMULATOR_HOST"):
        yield os.environ["PUBSUB_EMULATOR_HOST"]
        return
    answers: Callable[[str], bool]
    chosen = os.environ.get("PUBSUB_SERVER", "")
    if chosen not in ("", "fake", "emulator"):
        pytest.fail(f"PUBSUB_SERVER={chosen!r}: expected 'fake' or 'emulator'")
    script = emulator_script() if chosen != "fake" else None
    if chosen == "emulator" and script is None:
        pytest.fail("PUBSUB_SERVER=emulator, and no cloud-pubsub-emulator on this machine")
    if script is not None:
        what, command, answers = "the Pub/Sub emulator", [str(script)], _emulator_answers
    elif (fake := fake_binary()) is not None:
        what, command, answers = "the Pub/Sub fake (pstest)", [str(fake)], _port_open
    else:
        pytest.skip(
            "no Pub/Sub server on this machine: `make test-deps` builds Google's fake "
            "(dev/pubsub-fake, needs Go), or install the Google Cloud CLI's "
            "google-cloud-cli-pubsub-emulator"
        )
    host = f"127.0.0.1:{free_port()}"
    log_path = tmp_path_factory.mktemp("pubsub-emulator") / "emulator.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*command, "--host=127.0.0.1", f"--port={host.split(':')[1]}"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    with serving(process, what, lambda: answers(host), log_path.read_text, 60, 0.1):
        yield host
