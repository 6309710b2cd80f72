"""`make install`'s compile step: the modules of streams/core/compiled.py (MODULES) built with
mypyc, in place, when a C compiler is there; left interpreted otherwise. One line says which.

    python dev/compile_core.py            compile (or say why not), then record the build
    python dev/compile_core.py --pure     remove any build: interpreted (STORAGE_EVENTS_PURE=1
                                          in the environment means the same)
    python dev/compile_core.py --clean    remove any build, say nothing

mypyc comes with mypy (the `compile` extra of pyproject.toml), installed into the running
virtualenv when it is missing. The compiler's output goes to build/mypyc/build.log, printed
when the build fails; a failed build leaves nothing compiled behind. Every build starts from
nothing (old extension files removed first), and writes streams/core/compiled-build.json last:
the sources' SHA-256 that the import-time check compares (streams.core.compiled.activate).
`--stamp FILE` touches FILE when the result is final (compiled, or interpreted on request), so
that make runs this again only when a source changes; the fallback for want of a compiler
leaves it untouched, so a compiler installed later is used by the next `make install`.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "mypyc"
LOG = BUILD / "build.log"
SAY = "make install: streams.core"


def load_compiled() -> ModuleType:
    """streams/core/compiled.py by its path: importing the package would run the check that
    this build is about to make true."""
    spec = importlib.util.spec_from_file_location(
        "_compiled_core_list", ROOT / "streams" / "core" / "compiled.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def remove_build(compiled: ModuleType) -> None:
    """Every extension file and record of a previous build (of any module list)."""
    compiled.MANIFEST.unlink(missing_ok=True)
    # The packages compiled modules live in (streams/core, streams/migrations), whichever the
    # list named before: an extension file left there would shadow its source.
    packages = {ROOT / "streams" / "core", ROOT / "streams" / "migrations"}
    packages |= {compiled.source_path(module).parent for module in compiled.MODULES}
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        found = [path for package in sorted(packages) for path in package.rglob(f"*{suffix}")]
        for path in [*found, *ROOT.glob(f"*__mypyc{suffix}")]:
            path.unlink(missing_ok=True)


def c_compiler() -> str | None:
    """The C compiler setuptools would run (Python's CC, usually `cc` or `gcc`), if found."""
    configured = os.environ.get("CC", "").split() or (sysconfig.get_config_var("CC") or "").split()
    for name in [*configured[:1], "cc"]:
        found = shutil.which(name)
        if found:
            return found
    return None


def ensure_mypyc() -> None:
    # setuptools builds the extensions; from Python 3.12 on a virtualenv has none, and its
    # distutils (which mypyc's build imports) is setuptools' alone.
    if all(importlib.util.find_spec(name) is not None for name in ("mypyc", "setuptools")):
        return
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    wanted = extras["compile"]
    names = ", ".join(re.split(r"[^A-Za-z0-9._-]", spec)[0] for spec in wanted)
    print(f"{SAY}: installing the compiler of pyproject.toml [compile]: {names}", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *wanted], check=True)


def build(compiled: ModuleType) -> None:
    """In this process: mypycify MODULES and build the extensions in place (cwd = ROOT)."""
    import setuptools  # noqa: F401  first: its distutils, which mypyc.build imports (3.12+)
    from mypyc.build import mypycify
    from setuptools import Distribution

    paths = [str(compiled.source_path(module).relative_to(ROOT)) for module in compiled.MODULES]
    # Its own mypy cache: `make lint`'s (.mypy_cache) is of other options.
    options = ["--cache-dir", str(BUILD / "mypy-cache")]
    extensions = mypycify(
        [*options, *paths], target_dir=str(BUILD / "c"), group_name=compiled.GROUP
    )
    distribution = Distribution({"name": "storage-events-core", "ext_modules": extensions})
    distribution.script_args = [
        "build_ext",
        "--inplace",
        "--build-temp",
        str(BUILD / "temp"),
        "--build-lib",
        str(BUILD / "lib"),
    ]
    distribution.parse_command_line()
    distribution.run_commands()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pure", action="store_true", help="remove any build: interpreted")
    parser.add_argument("--clean", action="store_true", help="remove any build, quietly")
    parser.add_argument("--stamp", type=Path, help="touched when the result is final")
    parser.add_argument("--build", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    compiled = load_compiled()
    if args.build:  # the child process whose output goes to the log
        os.chdir(ROOT)
        build(compiled)
        return 0
    remove_build(compiled)
    if args.clean:
        return 0
    pure = os.environ.get(compiled.PURE_VARIABLE, "") not in ("", "0")
    if args.pure or pure:
        print(f"{SAY} interpreted ({compiled.PURE_VARIABLE}=1 / PURE=1: nothing compiled)")
        return touch(args.stamp)
    compiler = c_compiler()
    if compiler is None:
        print(f"{SAY} interpreted: no C compiler (cc) on the PATH to compile it with mypyc")
        return 0
    ensure_mypyc()
    manifest = compiled.manifest_for()  # the sources as the build reads them, not as it ends
    BUILD.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with LOG.open("w") as log:
        result = subprocess.run(
            [sys.executable, __file__, "--build"], stdout=log, stderr=subprocess.STDOUT, check=False
        )
    if result.returncode != 0:
        remove_build(compiled)
        tail = LOG.read_text(errors="replace").splitlines()[-30:]
        print("\n".join(tail), file=sys.stderr)
        print(
            f"{SAY}: mypyc could not compile it (above; all of {LOG.relative_to(ROOT)}): fix "
            "the module, take it out of MODULES in streams/core/compiled.py, or build it "
            "interpreted with PURE=1",
            file=sys.stderr,
        )
        return 1
    compiled.MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    print(
        f"{SAY} compiled with mypyc ({len(compiled.MODULES)} modules, "
        f"{time.monotonic() - started:.0f} s, {Path(compiler).name}); "
        f"{compiled.PURE_VARIABLE}=1 runs it interpreted"
    )
    return touch(args.stamp)


def touch(stamp: Path | None) -> int:
    if stamp is not None:
        for other in stamp.parent.glob(".core-*"):
            other.unlink()
        stamp.touch()
    return 0


if __name__ == "__main__":
    sys.exit(main())
