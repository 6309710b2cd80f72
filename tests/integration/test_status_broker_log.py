"""The test broker's log path printed at the end of a session points at a file that exists
when a test failed, and the directory is gone when every test passed (issue 16, item 5).

Runs a pytest session of its own (the inner test below) on the project's local broker, in a
directory under tmp_path (STORAGE_EVENTS_TEST_KAFKA_DIR), on free ports.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.worker import ROOT

INNER = "STORAGE_EVENTS_INNER_SESSION"


@pytest.mark.skipif(INNER not in os.environ, reason="the inner session of the test below")
def test_inner_session(kafka_bootstrap: str) -> None:
    assert kafka_bootstrap
    assert os.environ[INNER] == "pass", "failing on purpose: the outer test reads the log path"


def session(tmp_path: Path, outcome: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if name != "KAFKA_BOOTSTRAP_SERVERS"}
    env |= {
        INNER: outcome,
        "STORAGE_EVENTS_TEST_KAFKA_DIR": str(tmp_path / "test-kafka"),
        "DOCKER_HOST": "unix:///nonexistent",  # the local broker, not testcontainers
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"{Path(__file__).relative_to(ROOT)}::test_inner_session",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_a_failed_session_keeps_the_broker_log_it_names(tmp_path: Path) -> None:
    failed = session(tmp_path, "fail")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    # In the terminal summary at the end (pytest's short summary of failures follows it, a few
    # lines locally, the whole assertion diff under CI=true).
    ending = failed.stdout[failed.stdout.rfind("integration tests ran against") :]
    found = re.search(
        r"broker log kept \(tests failed\), until the next test session: (\S+)", ending
    )
    assert found, failed.stdout
    log = Path(found.group(1))
    assert log.is_file(), log
    assert log.is_relative_to(tmp_path)
    assert log.stat().st_size > 0


def test_a_passed_session_deletes_the_broker_directory(tmp_path: Path) -> None:
    passed = session(tmp_path, "pass")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "deleted: every test passed" in passed.stdout
    assert list((tmp_path / "test-kafka").iterdir()) == []
