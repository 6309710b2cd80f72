"""A Google Cloud Storage emulator for the tests: `gcp-storage-emulator` (PyPI, installed by
pyproject.toml's [test] extra), serving the JSON API that google-cloud-storage speaks.

`gcs_emulator` is a session fixture: one in-memory emulator on a free port of 127.0.0.1,
answered before the first test uses it, stopped after the session. Clients point at
`endpoint` with anonymous credentials (`client()`).
"""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from support.processes import serving
from support.worker import free_port

EMULATOR = Path(sys.executable).with_name("gcp-storage-emulator")


@dataclass(frozen=True)
class GcsEmulator:
    port: int
    log_path: Path

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> Any:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project="test",
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options={"api_endpoint": self.endpoint},
        )

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/storage/v1/b", timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsEmulator]:
    if not EMULATOR.exists():
        pytest.fail(
            f"{EMULATOR} is missing: run `make test-deps` (pyproject.toml [test] installs "
            "gcp-storage-emulator)",
            pytrace=False,
        )
    workdir = tmp_path_factory.mktemp("gcs-emulator")
    port = free_port()
    server = GcsEmulator(port, workdir / "gcs-emulator.log")
    with server.log_path.open("ab") as log:
        process = subprocess.Popen(
            [str(EMULATOR), "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    with serving(process, "gcp-storage-emulator", lambda: _answers(port), server.tail):
        yield server
