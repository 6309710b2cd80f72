"""What `make run` and `make test` install on a fresh clone (issue 16, 2), by `make -n`.

Running needs the project's Python package and the Kafka broker jars, nothing of the tests:
no npm packages (Azurite and the other emulators), no redis-server through apt (which fails
as non-root), no pytest. `make test` installs the test tooling and says so, one line each.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make")
CLONE_FILES = (
    "Makefile",
    "pyproject.toml",
    "package.json",
    "package-lock.json",
    "dev/pubsub-fake/main.go",
    "dev/pubsub-fake/go.mod",
    "dev/pubsub-fake/go.sum",
)

pytestmark = pytest.mark.skipif(MAKE is None, reason="make is not installed")


def dry_run(target: str, clone: Path, *variables: str) -> list[str]:
    """The commands `make <target> [VAR=value...]` would run in a clone where nothing is
    installed yet."""
    clone.mkdir(exist_ok=True)
    for name in CLONE_FILES:
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, clone / name)
    env = {key: value for key, value in os.environ.items() if not key.startswith("MAKE")}
    result = subprocess.run(
        [str(MAKE), "-n", target, *variables],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_make_run_installs_the_package_only_and_starts_the_local_default(tmp_path: Path) -> None:
    commands = dry_run("run", tmp_path)
    text = "\n".join(commands)
    assert "pip install --quiet -e ." in text
    assert any(command.endswith("dev/run.py") for command in commands), text
    for test_only in ("npm", "node_modules", "redis", "apt-get", "[test]", "make test:"):
        assert test_only not in text, f"`make run` would run {test_only!r}:\n{text}"


def test_make_test_installs_the_test_tooling_and_says_what(tmp_path: Path) -> None:
    commands = dry_run("test", tmp_path)
    text = "\n".join(commands)
    assert "pip install --quiet -e '.[test]'" in text
    assert "npm ci" in text
    assert "apt-get install -y -qq redis-server" in text
    assert any("-m pytest" in command for command in commands), text
    said = [command for command in commands if "make test: installing" in command]
    assert len(said) >= 3, text
    assert any("[test]" in line and "pytest" in line for line in said), said
    assert any("npm" in line and "azurite" in line for line in said), said
    assert any("redis-server" in line for line in said), said


def test_the_test_tooling_is_one_target_that_make_test_uses(tmp_path: Path) -> None:
    tooling = dry_run("test-deps", tmp_path)
    suite = dry_run("test", tmp_path / "again")
    assert tooling, "make -n test-deps does nothing on a fresh clone"
    # The Go build names its output by absolute path, which is each clone's own.
    tooling = [command.replace(str(tmp_path), "<clone>") for command in tooling]
    suite = [command.replace(str(tmp_path / "again"), "<clone>") for command in suite]
    missing = [command for command in tooling if command not in suite]
    assert not missing, missing


def test_make_test_runs_the_other_pythons_suites_beside_the_whole_suite(tmp_path: Path) -> None:
    commands = dry_run("test", tmp_path)
    [beside] = [command for command in commands if command.startswith("dev/beside.sh ")]
    side, *main = shlex.split(beside)[1:]
    assert "dev/other_pythons.sh 3.12 3.13;" in side, side
    assert "dev/fileevents-alone.sh 3.10 3.13" in side, side
    assert main[-2:] == ["-m", "pytest"], main  # the whole suite, no test picked


def test_make_test_with_pytest_args_runs_only_the_suite(tmp_path: Path) -> None:
    commands = dry_run("test", tmp_path, "PYTEST_ARGS=-k nothing")
    assert not any("beside.sh" in command for command in commands), commands
    assert any(command.endswith("-m pytest -k nothing") for command in commands), commands


def beside(side: str, main: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / "dev/beside.sh"), side, "bash", "-c", main],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_beside_prints_the_side_output_after_the_main_one_and_keeps_a_failure() -> None:
    both_pass = beside("echo side; echo side-err >&2", "echo main")
    assert both_pass.returncode == 0, both_pass
    lines = both_pass.stdout.splitlines()
    assert lines.index("main") < lines.index("side") and "side-err" in lines, lines
    # The side job's failure fails the run; the main one's wins when both fail.
    assert beside("exit 3", "echo main").returncode == 3
    assert beside("exit 0", "exit 2").returncode == 2
    assert beside("exit 3", "exit 2").returncode == 2
