"""The compiled core (streams/core/compiled.py, dev/compile_core.py): where a C compiler is
there (or in CI), every module of MODULES runs compiled, so that the suite tests the compiled
build and CI cannot fall back to the interpreted one without failing; a build that is not the
build of the sources beside it is never run (the sources are, with a warning); and
STORAGE_EVENTS_PURE=1 runs the sources whatever is built.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from streams.core import compiled

ROOT = Path(__file__).resolve().parents[2]
PURE = os.environ.get(compiled.PURE_VARIABLE, "") not in ("", "0")
EXPECTED = (shutil.which("cc") is not None or os.environ.get("CI") == "true") and not PURE
EXTENSIONS = tuple(importlib.machinery.EXTENSION_SUFFIXES)


@pytest.mark.skipif(not EXPECTED, reason="no C compiler (cc), not CI, or STORAGE_EVENTS_PURE=1")
def test_every_listed_module_runs_compiled_where_a_compiler_is() -> None:
    assert compiled.STATE == "compiled", (
        f"a C compiler is there, and streams.core runs {compiled.STATE}: `make install` "
        "compiles it (dev/compile_core.py)"
    )
    for name in compiled.MODULES:
        module = importlib.import_module(name)
        assert module.__file__ is not None and module.__file__.endswith(EXTENSIONS), name
        # mypyc derives __file__ from where its shared library is: the one beside the source.
        assert Path(module.__file__).parent == compiled.source_path(name).parent, module.__file__


def test_event_stays_interpreted() -> None:
    """FileEvent is a pydantic model, which compiled functions cannot define."""
    assert "streams.core.event" not in compiled.MODULES
    from streams.core import event

    assert event.__file__ is not None and event.__file__.endswith(".py")


def test_the_build_depends_on_every_source_and_the_project_modules_they_import() -> None:
    sources = {compiled.prerequisite(path) for path in compiled.build_sources()}
    for name in compiled.MODULES:
        assert compiled.source_path(name).relative_to(ROOT).as_posix() in sources
    assert "streams/core/event.py" in sources  # imported by them, not compiled
    # The Makefile's prerequisites of the compile step are the same files.
    printed = subprocess.run(
        [sys.executable, "streams/core/compiled.py", "sources"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert set(printed) == sources


def run_core(tree: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Import the core from `tree` in a fresh interpreter; prints its state and two files."""
    code = (
        "import streams.core.routing as r, streams.core.normalizers.s3 as s\n"
        "from streams.core import compiled\n"
        "print(compiled.STATE); print(r.__file__); print(s.__file__)\n"
    )
    environment = {key: value for key, value in os.environ.items() if key != compiled.PURE_VARIABLE}
    environment.update(env, PYTHONPATH=str(tree), PYTHONWARNINGS="default")
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=tree,
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    )


def test_pure_runs_the_sources_whatever_is_built() -> None:
    result = run_core(ROOT, **{compiled.PURE_VARIABLE: "1"})
    state, routing, s3 = result.stdout.splitlines()
    assert state == f"interpreted ({compiled.PURE_VARIABLE}=1)"
    assert routing.endswith("routing.py") and s3.endswith("s3.py")
    assert "StaleBuildWarning" not in result.stderr


BUILT = compiled.MANIFEST.exists() and compiled.group_library() is not None


@pytest.fixture
def built_copy(tmp_path: Path) -> Path:
    """A copy of the package with this tree's compiled build (its shared library beside it)."""
    library = compiled.group_library()
    assert library is not None
    shutil.copytree(
        ROOT / "streams", tmp_path / "streams", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(library, tmp_path / library.name)
    return tmp_path


@pytest.mark.skipif(not BUILT, reason="no compiled build in this tree (`make install`)")
def test_a_copy_of_a_current_build_runs_compiled(built_copy: Path) -> None:
    result = run_core(built_copy)
    state, routing, s3 = result.stdout.splitlines()
    assert state == "compiled", result.stderr
    assert routing.startswith(str(built_copy)) and routing.endswith(EXTENSIONS)
    assert s3.startswith(str(built_copy)) and s3.endswith(EXTENSIONS)


@pytest.mark.skipif(not BUILT, reason="no compiled build in this tree (`make install`)")
@pytest.mark.parametrize(
    ("change", "why"),
    [
        ("edit a compiled module", "streams/core/normalizers/s3.py changed since the build"),
        ("edit a module they import", "streams/core/event.py changed since the build"),
        ("remove a module's extension", "streams.core.rules is not compiled"),
        ("remove the record of the build", "no build finished"),
        ("remove the shared library", "its shared library"),
    ],
)
def test_a_stale_build_runs_the_sources_and_says_why(
    built_copy: Path, change: str, why: str
) -> None:
    core = built_copy / "streams" / "core"
    if change == "edit a compiled module":
        with (core / "normalizers" / "s3.py").open("a") as source:
            source.write("\n# edited after the build\n")
    elif change == "edit a module they import":
        with (core / "event.py").open("a") as source:
            source.write("\n# edited after the build\n")
    elif change == "remove a module's extension":
        for path in core.glob("rules.*"):
            if path.name.endswith(EXTENSIONS):
                path.unlink()
    elif change == "remove the record of the build":
        (core / compiled.MANIFEST.name).unlink()
    else:
        for path in built_copy.glob(f"{compiled.GROUP}__mypyc*"):
            path.unlink()
    result = run_core(built_copy)
    state, routing, s3 = result.stdout.splitlines()
    assert state.startswith("interpreted (stale build: ") and why in state, state
    # Every module from its source, not only the changed one.
    assert routing == str(core / "routing.py") and s3 == str(core / "normalizers" / "s3.py")
    assert "StaleBuildWarning" in result.stderr and why in result.stderr, result.stderr
    assert "make install" in result.stderr


def test_make_rebuilds_when_the_contract_changes() -> None:
    # The Makefile lists the build's sources with `python3.11 streams/core/compiled.py sources`,
    # an interpreter without fileevents installed: the contract's event module (which
    # streams.core.event re-exports, and a build's manifest records) must be listed all the
    # same, or a change to it leaves `make install` doing nothing and the build stale.
    result = subprocess.run(
        [sys.executable, "-S", "-I", str(ROOT / "streams/core/compiled.py"), "sources"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    listed = result.stdout.split()
    assert "fileevents/src/fileevents/event.py" in listed, listed
    assert "streams/core/event.py" in listed, listed
