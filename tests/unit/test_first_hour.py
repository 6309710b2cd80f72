"""The first hour (issue 24): the README's commands as a newcomer types them, in a plain shell
with a minimal environment, and what a wrong Python does to `.venv`.

Each shell here starts from `env -i` (HOME and a PATH of the system's directories only), as a
fresh terminal would: nothing of the test session's environment helps the command along.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def clean_shell(
    script: str, cwd: Path = ROOT, path: str = SYSTEM_PATH
) -> subprocess.CompletedProcess[str]:
    """`script` in `bash -c`, from a minimal environment."""
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": path, "LANG": "C.UTF-8"}
    return subprocess.run(
        ["/bin/bash", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def readme_block(containing: str) -> str:
    """The README's fenced block that contains `containing`, as written."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
    found = [block for block in blocks if containing in block]
    assert found, f"no README block contains {containing!r}"
    return found[0]


def python_without_dependencies() -> str:
    """The interpreter the virtualenv was made from: Python 3.11 without the project's
    dependencies, as a plain `python3` in a fresh terminal is."""
    for candidate in (Path(sys.base_prefix) / "bin" / "python3", Path("/usr/bin/python3")):
        if candidate.exists():
            probe = subprocess.run(
                [str(candidate), "-c", "import pydantic"], capture_output=True, check=False
            )
            if probe.returncode != 0:
                return str(candidate)
    pytest.skip("every Python here has the project's dependencies")


FITTING = ((3, 11), (3, 12), (3, 13))
"""The Pythons pyproject.toml's requires-python takes (issue 35, item 8)."""


def python_of(minors: tuple[int, ...], fits: bool) -> str | None:
    """A Python 3.<minor> of `minors` that fits (or does not), resolved past any shim."""
    candidates = [shutil.which(f"python3.{minor}") for minor in minors]
    for minor in minors:
        candidates += sorted(
            glob.glob(str(Path.home() / ".pyenv" / "versions" / f"3.{minor}.*" / "bin" / "python3"))
        )
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [
                candidate,
                "-c",
                f"import sys, venv; print(sys.version_info[:2] in {FITTING!r}, sys.executable)",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        fitting, _, executable = probe.stdout.strip().partition(" ")
        if probe.returncode == 0 and fitting == str(fits):
            return executable
    return None


def other_python() -> str:
    """A Python that is not 3.11 to 3.13 (the wrong one of item 5), resolved past any shim."""
    found = python_of((10, 14, 9), fits=False)
    if found is None:
        pytest.skip("no Python outside 3.11-3.13 is installed")
    return found


# Item 1: the commands are findable after the README's own set-up


def test_the_readme_activation_step_makes_its_commands_findable() -> None:
    activate = readme_block(".venv/bin/activate").strip()
    shown = clean_shell(
        f"{activate}\n"
        "python -m streams normalize --source s3 examples/s3-put.json\n"
        "faust --version && python -m connectors --help >/dev/null && echo all-found"
    )
    assert shown.returncode == 0, shown.stderr
    assert '"key":"photos/red flower.jpg"' in shown.stdout
    assert shown.stdout.strip().endswith("all-found")


@pytest.mark.parametrize("package", ["streams", "connectors"])
def test_outside_the_virtualenv_a_command_says_what_to_run(package: str) -> None:
    python = python_without_dependencies()
    result = clean_shell(f"{python} -m {package} --help")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "make install" in lines[0] and ". .venv/bin/activate" in lines[0], lines[0]
    assert "Traceback" not in result.stderr


# Item 5: a wrong Python never keeps its .venv


def clone(tmp_path: Path) -> Path:
    """The files `make install` reads, in a directory of their own."""
    project = tmp_path / "clone"
    project.mkdir()
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, project / name)
    return project


def path_with(tmp_path: Path, **pythons: str) -> str:
    """A PATH whose only Pythons are `pythons` (name -> interpreter), with what make needs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("make", "sh", "bash", "rm", "env", "cat", "dirname", "uname"):
        if found := shutil.which(tool, path=SYSTEM_PATH):
            (bin_dir / tool).symlink_to(found)
    for name, interpreter in pythons.items():
        (bin_dir / name).symlink_to(interpreter)
    return str(bin_dir)


@pytest.mark.skipif(MAKE is None, reason="make is not installed")
def test_a_venv_of_a_wrong_python_is_recreated_with_a_fitting_one(tmp_path: Path) -> None:
    project = clone(tmp_path)
    wrong = other_python()
    made = subprocess.run(
        [wrong, "-m", "venv", "--without-pip", str(project / ".venv")], check=False
    )
    assert made.returncode == 0
    (project / ".venv" / ".installed").touch()  # even a stamp does not make it kept
    fitting = str(Path(sys.base_prefix) / "bin" / "python3")
    path = path_with(tmp_path, python3=wrong, **{f"python3.{sys.version_info[1]}": fitting})

    planned = clean_shell("make -n install", cwd=project, path=path)
    assert planned.returncode == 0, planned.stderr
    assert "pip install --quiet -e ." in planned.stdout  # the stamp of the wrong one is void

    result = clean_shell("make venv", cwd=project, path=path)
    assert result.returncode == 0, result.stderr
    assert "not Python 3.11, 3.12 or 3.13: re-creating it" in result.stdout
    version = subprocess.run(
        [
            str(project / ".venv" / "bin" / "python"),
            "-c",
            "import sys; print(sys.version_info[:2])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert version.stdout.strip() == str(tuple(sys.version_info[:2]))  # the one that fits


@pytest.mark.skipif(MAKE is None, reason="make is not installed")
def test_without_a_fitting_python_make_says_which_to_install_and_makes_no_venv(
    tmp_path: Path,
) -> None:
    project = clone(tmp_path)
    path = path_with(tmp_path, python3=other_python())
    result = clean_shell("make install", cwd=project, path=path)
    assert result.returncode != 0
    said = [line for line in result.stderr.splitlines() if line.startswith("make: storage-events")]
    assert len(said) == 1, result.stderr
    assert "needs Python 3.11, 3.12 or 3.13" in said[0] and "install one" in said[0], said[0]
    assert "PYTHON=/path/to/python3.13" in said[0]
    assert not (project / ".venv").exists()


@pytest.mark.skipif(MAKE is None, reason="make is not installed")
@pytest.mark.parametrize("minor", [12, 13])
def test_a_newer_python_makes_the_venv_and_it_is_kept(tmp_path: Path, minor: int) -> None:
    """Issue 35, item 8: with only Python 3.12 or 3.13 there (Ubuntu 24.04, Debian 13), make
    takes it; a venv it made is not re-created."""
    newer = python_of((minor,), fits=True)
    if newer is None:
        pytest.skip(f"Python 3.{minor} is not installed")
    project = clone(tmp_path)
    path = path_with(tmp_path, python3=newer)
    made = clean_shell("make venv", cwd=project, path=path)
    assert made.returncode == 0, made.stderr
    version = subprocess.run(
        [
            str(project / ".venv" / "bin" / "python"),
            "-c",
            "import sys; print(sys.version_info[:2])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert version.stdout.strip() == f"(3, {minor})"
    (project / ".venv" / ".installed").touch()
    again = clean_shell("make venv", cwd=project, path=path)
    assert again.returncode == 0 and "re-creating" not in again.stdout, again.stdout
    planned = clean_shell("make -n install", cwd=project, path=path)
    assert planned.returncode == 0, planned.stderr
    assert "pip install --quiet -e ." not in planned.stdout  # kept, stamp and all
