"""moto's server (S3, SQS, SNS, EventBridge emulator) for the bridge tests.

A pytest plugin: a test module says `pytest_plugins = ["support.moto_server"]` and takes the
session fixture `moto_server`, the endpoint URL of one `moto_server` process (the console
script in the virtualenv) on a free port of 127.0.0.1, started once per session and stopped
after it. The session's environment gets dummy AWS credentials and region (and no profile or
config file of the developer's), so boto3 clients and the bridge subprocesses reach moto alone.
moto keeps all state in memory for the whole session: tests use their own bucket and queue
names (`unique_name`).

PYTEST_DONT_REWRITE: test modules import the helpers here before pytest loads the module as
a plugin; it holds no assertions to rewrite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.processes import serving
from support.worker import free_port

MOTO_SERVER = Path(sys.executable).with_name("moto_server")
REGION = "us-east-1"
AWS_ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_REGION": REGION,
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
AWS_UNSET = ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL_S3")


def unique_name(prefix: str) -> str:
    """A bucket or queue name no other test uses (lower case: valid for both)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def aws_client(endpoint: str, service: str) -> Any:
    import boto3

    return boto3.session.Session().client(service, endpoint_url=endpoint, region_name=REGION)


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError:
        return True  # something answered HTTP: the server is up
    except OSError:
        return False


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The endpoint URL of a running moto server, with dummy AWS credentials in the env."""
    patch = pytest.MonkeyPatch()
    for name, value in AWS_ENVIRONMENT.items():
        patch.setenv(name, value)
    for name in AWS_UNSET:
        patch.delenv(name, raising=False)
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp("moto") / "moto.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    try:
        with serving(
            process,
            f"moto_server on {endpoint}",
            lambda: _answers(endpoint),
            lambda: log_path.read_text()[-2000:],
        ):
            yield endpoint
    finally:
        patch.undo()
