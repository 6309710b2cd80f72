"""Google's Pub/Sub emulator for the tests, when the machine has it.

`emulator` is a module fixture: `host:port` of an emulator, `PUBSUB_EMULATOR_HOST` if set, else
one started from `PUBSUB_EMULATOR_BIN` or the Google Cloud CLI's `cloud-pubsub-emulator`
(package google-cloud-cli-pubsub-emulator); without either, the tests that use it are
skipped. Tests import the fixture: `from support.pubsub_emulator import emulator`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.processes import serving
from support.worker import free_port

# Never let google-auth look for a metadata server off this machine.
NO_METADATA = {
    "NO_GCE_CHECK": "true",
    "GCE_METADATA_HOST": "127.0.0.1:9",
    "GCE_METADATA_IP": "127.0.0.1:9",
}


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


def _emulator_answers(host: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}/", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`host:port` of a Pub/Sub emulator."""
    if os.environ.get("PUBSUB_EMULATOR_HOST"):
        yield os.environ["PUBSUB_EMULATOR_HOST"]
        return
    script = emulator_script()
    if script is None:
        pytest.skip(
            "no Pub/Sub emulator on this machine (Google Cloud CLI package "
            "google-cloud-cli-pubsub-emulator); the seam tests above cover ack-after-publish"
        )
    host = f"127.0.0.1:{free_port()}"
    log_path = tmp_path_factory.mktemp("pubsub-emulator") / "emulator.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(script), "--host=127.0.0.1", f"--port={host.split(':')[1]}"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    with serving(
        process,
        "the Pub/Sub emulator",
        lambda: _emulator_answers(host),
        log_path.read_text,
        60,
        0.2,
    ):
        yield host
