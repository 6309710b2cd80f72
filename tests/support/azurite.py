"""Azurite's queue service (npm package `azurite`, installed by `make test-deps`) for the tests.

`azurite` is a session fixture: one `azurite-queue` process on a free port of 127.0.0.1, its
state in a temporary folder, started once, answered before the first test uses it, stopped
after the session. Tests import the fixture: `from support.azurite import azurite`.
"""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.processes import serving
from support.worker import ROOT, free_port

AZURITE_QUEUE = ROOT / "node_modules" / ".bin" / "azurite-queue"

# Azurite's well-known development account and key (documented by Microsoft:
# learn.microsoft.com/azure/storage/common/storage-use-azurite#well-known-storage-account-and-key).
ACCOUNT_NAME = "devstoreaccount1"
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


@dataclass(frozen=True)
class Azurite:
    port: int
    log_path: Path

    @property
    def queue_endpoint(self) -> str:
        """The account URL (Azurite puts the account name in the path)."""
        return f"http://127.0.0.1:{self.port}/{ACCOUNT_NAME}"

    def connection_string(self, account_key: str = ACCOUNT_KEY) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT_NAME};"
            f"AccountKey={account_key};QueueEndpoint={self.queue_endpoint};"
        )

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


def _answers(port: int) -> bool:
    """Any HTTP answer (Azurite refuses the unsigned request with 4xx) means it is up."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/{ACCOUNT_NAME}?comp=list", timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    if not AZURITE_QUEUE.exists():
        pytest.fail(
            f"{AZURITE_QUEUE.relative_to(ROOT)} is missing: run `make test-deps` "
            "(it installs Azurite from the npm registry, pinned by package-lock.json)",
            pytrace=False,
        )
    workdir = tmp_path_factory.mktemp("azurite")
    port = free_port()
    server = Azurite(port, workdir / "azurite.log")
    with server.log_path.open("ab") as log:
        process = subprocess.Popen(
            [
                str(AZURITE_QUEUE),
                "--queueHost",
                "127.0.0.1",
                "--queuePort",
                str(port),
                "--location",
                str(workdir),
                "--silent",
                "--skipApiVersionCheck",
                "--loose",
                "--disableTelemetry",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    with serving(process, "azurite-queue", lambda: _answers(port), server.tail):
        yield server


AZURITE_BLOB = ROOT / "node_modules" / ".bin" / "azurite-blob"


@dataclass(frozen=True)
class AzuriteBlob:
    """Azurite's blob service (the same npm package), for the reconcile listing's tests."""

    port: int
    log_path: Path

    @property
    def blob_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{ACCOUNT_NAME}"

    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT_NAME};"
            f"AccountKey={ACCOUNT_KEY};BlobEndpoint={self.blob_endpoint};"
        )

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


@pytest.fixture(scope="session")
def azurite_blob(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteBlob]:
    if not AZURITE_BLOB.exists():
        pytest.fail(
            f"{AZURITE_BLOB.relative_to(ROOT)} is missing: run `make test-deps`", pytrace=False
        )
    workdir = tmp_path_factory.mktemp("azurite-blob")
    port = free_port()
    server = AzuriteBlob(port, workdir / "azurite-blob.log")
    with server.log_path.open("ab") as log:
        process = subprocess.Popen(
            [
                str(AZURITE_BLOB),
                *("--blobHost", "127.0.0.1", "--blobPort", str(port)),
                *("--location", str(workdir)),
                *("--silent", "--skipApiVersionCheck", "--loose", "--disableTelemetry"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    with serving(process, "azurite-blob", lambda: _answers(port), server.tail):
        yield server
