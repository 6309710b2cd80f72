"""Which modules of the functional core mypyc compiles, and the check that a compiled build is
the build of the sources beside it.

`make install` compiles `MODULES` with mypyc (dev/compile_core.py) when a C compiler (`cc`)
is there, and leaves them interpreted otherwise; the behaviour is the same either way (the unit
and normalizer tests run against both). A compiled module is an extension file next to its
source (`routing.cpython-311-x86_64-linux-gnu.so` beside `routing.py`), which Python's import
prefers to the source. So that an edited source is never shadowed by the build of its older
text, the build records the SHA-256 of every file it compiled from (`MODULES` and the project
modules they import) in `compiled-build.json`, and `activate()` (run by streams/core/__init__.py,
before any of them is imported) compares them: on any difference it imports every module of
`MODULES` from its source, with one warning naming the file that changed (`make install`
rebuilds). Every module, not only the changed one: compiled modules call each other directly,
not through the import system.

`STORAGE_EVENTS_PURE=1` runs them interpreted whatever is built (at `make install`, it builds
nothing). `streams.core.compiled.STATE` says how they run.

Run as a script (`python streams/core/compiled.py sources`), it prints the files a build
depends on, without importing the project: the Makefile's prerequisites of the compile step.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

MODULES: tuple[str, ...] = (
    "streams.core.normalizers",
    "streams.core.normalizers.base",
    "streams.core.normalizers.keys",
    "streams.core.normalizers.s3",
    "streams.core.normalizers.eventbridge",
    "streams.core.normalizers.gcs",
    "streams.core.normalizers.azure",
    "streams.core.normalizers.minio",
    "streams.core.normalizers.supabase",
    "streams.core.normalizers.b2",
    "streams.core.normalizers.box",
    "streams.core.normalizers.cloudinary",
    "streams.core.normalizers.appwrite",
    "streams.core.normalizers.reconcile",
    "streams.core.routing",
    "streams.core.rules",
    "streams.core.ordering",
    "streams.core.records",
    "streams.core.keystate",  # a key's state record
    "streams.core.state",  # the state's tables, keys and reader
    "streams.migrations",  # what earlier releases wrote, read by the plan for a window
    "streams.migrations.reads",
    "streams.migrations.marks_move",
    "streams.core.emitting",  # the dedupe/order plan
)
"""The modules mypyc compiles: add or remove one here, and `make install` rebuilds. Besides the
core, streams.migrations, which the plan calls on every batch (it is as pure as the core).

Not streams.core.event: FileEvent is a pydantic model, and pydantic reads its validators'
signatures and its fields' docstrings from Python functions and source, which compiled
functions are not (importing it compiled fails)."""

GROUP = "storage_events_core"
"""The build's shared library, `storage_events_core__mypyc.<suffix>` beside `streams/` (mypyc
derives the modules' `__file__` and `__path__` from where it is): the code of every module of
MODULES, whose own extension files are shims that import it. A top-level module the editable
install does not map, so activate() loads it by its path."""
PURE_VARIABLE = "STORAGE_EVENTS_PURE"
ROOT = Path(__file__).resolve().parents[2]
"""The directory holding `streams/` (the repository, or site-packages)."""
MANIFEST = Path(__file__).with_name("compiled-build.json")
"""Written last by a successful build: what it compiled, from which sources (SHA-256)."""


class StaleBuildWarning(RuntimeWarning):
    """The compiled core is not the build of the sources beside it: running them instead."""


def source_path(module: str) -> Path:
    """The source file of `module` (a package's `__init__.py`)."""
    path = ROOT.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def extension_files(module: str) -> list[Path]:
    """The extension files that would be imported for `module` before its source."""
    source = source_path(module)
    stem = "__init__" if source.name == "__init__.py" else source.stem
    return [
        source.with_name(stem + suffix)
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
        if source.with_name(stem + suffix).exists()
    ]


def group_library() -> Path | None:
    """The build's shared library (GROUP), if there is one."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = ROOT / f"{GROUP}__mypyc{suffix}"
        if path.exists():
            return path
    return None


def build_sources(modules: Sequence[str] = MODULES) -> list[Path]:
    """The files a build of `modules` depends on: their sources and the sources of every
    project module they import, directly or through one another (whose types and values the
    compiled code is built against: streams.core.event's model is fileevents')."""
    import ast  # only here: the build's question, not every import's

    found: set[Path] = set()
    pending = [source_path(module) for module in modules]
    while pending:
        source = pending.pop()
        if source in found:
            continue
        found.add(source)
        tree = ast.parse(source.read_bytes())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                path = project_source(name)
                if path is not None and path not in found:
                    pending.append(path)
    return sorted(found)


CONTRACT = "fileevents"
"""The distribution whose event contract streams.core.event re-exports: its modules are
sources of the build too, found where it is installed (`fileevents/src/` in the repository)."""


REPOSITORY_CONTRACT = ROOT / "fileevents" / "src" / CONTRACT
"""The contract's sources in the repository: where `make` finds them, whose interpreter
(`python3.11`, not the virtualenv's) has no fileevents installed."""


def contract_directory() -> Path | None:
    """Where the `fileevents` package is (located, not imported): where it is installed, else
    the repository's copy; None without either."""
    spec = importlib.util.find_spec(CONTRACT)
    if spec is None or not spec.submodule_search_locations:
        return REPOSITORY_CONTRACT if REPOSITORY_CONTRACT.is_dir() else None
    return Path(next(iter(spec.submodule_search_locations)))


def project_source(module: str) -> Path | None:
    """The source file of a project module a compiled one imports: of `streams`, or of the
    fileevents distribution; None for any other module, or a name that is no module (an
    imported class)."""
    parts = module.split(".")
    if parts[0] == "streams":
        path = source_path(module)
    elif parts[0] == CONTRACT and (package := contract_directory()) is not None:
        path = package.joinpath(*parts[1:])
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    else:
        return None
    return path if path.is_file() else None


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _relative(path: Path) -> str:
    """A source's name: relative to ROOT; the contract's as `fileevents:<path in the package>`,
    found again wherever fileevents is installed (`_source_of`)."""
    package = contract_directory()
    if package is not None and path.is_relative_to(package):
        return f"{CONTRACT}:{path.relative_to(package).as_posix()}"
    return path.relative_to(ROOT).as_posix()


def _source_of(name: str) -> Path:
    """The file a source's name (`_relative`) stands for."""
    head, colon, rest = name.partition(":")
    if colon and head == CONTRACT:
        package = contract_directory()
        return package / rest if package is not None else Path(name)
    return ROOT / name


def manifest_for(modules: Sequence[str] = MODULES) -> dict[str, object]:
    """What a build of `modules` records (dev/compile_core.py writes it once it succeeded)."""
    return {
        "modules": list(modules),
        "cache_tag": sys.implementation.cache_tag,
        "sources": {_relative(path): digest(path) for path in build_sources(modules)},
    }


def staleness() -> str | None:
    """Why the compiled modules beside the sources are not their build, or None when they are
    (or when nothing is compiled)."""
    built = [module for module in MODULES if extension_files(module)]
    try:
        manifest = json.loads(MANIFEST.read_bytes())
    except FileNotFoundError:
        return f"{built[0]} is compiled, but no build finished ({MANIFEST.name})" if built else None
    except ValueError:
        return f"{MANIFEST.name} is unreadable"
    if manifest.get("modules") != list(MODULES) or manifest.get("cache_tag") != (
        sys.implementation.cache_tag
    ):
        return "the build is of another module list (streams/core/compiled.py) or Python"
    if group_library() is None:
        return f"its shared library ({GROUP}__mypyc) is missing"
    missing = [module for module in MODULES if module not in built]
    if missing:
        return f"{missing[0]} is not compiled ({len(missing)} of {len(MODULES)} missing)"
    for name, recorded in manifest.get("sources", {}).items():
        path = _source_of(name)
        try:
            current = digest(path)
        except OSError:
            return f"{name} is gone"
        if current != recorded:
            return f"{name} changed since the build"
    return None


class _SourcesFirst:
    """Finds `modules` as their source files, ahead of any extension file beside them."""

    def __init__(self, modules: Sequence[str]) -> None:
        self.sources = {module: source_path(module) for module in modules}

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        source = self.sources.get(fullname)
        if source is None:
            return None
        package = [str(source.parent)] if source.name == "__init__.py" else None
        return importlib.util.spec_from_file_location(
            fullname, source, submodule_search_locations=package
        )


def _load(name: str, path: Path | None) -> None:
    """Import the extension module `name` from `path`, for the shims' `import name`."""
    if name in sys.modules or path is None:
        return
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


STATE = "interpreted"
"""How MODULES run in this process: `compiled`, `interpreted` (nothing is built), or
`interpreted (<why>)` when a build is there but not used; set by activate()."""


def activate() -> str:
    """Decide, before any module of MODULES is imported, whether they run compiled: only when
    a build is there, current, and STORAGE_EVENTS_PURE is not set. Otherwise they are imported
    from their sources (a stale build also with one StaleBuildWarning). Returns STATE."""
    global STATE
    if any(finder.__class__ is _SourcesFirst for finder in sys.meta_path):
        return STATE  # already decided (streams.core imported again after a reload)
    if os.environ.get(PURE_VARIABLE, "") not in ("", "0"):
        STATE = f"interpreted ({PURE_VARIABLE}=1)"
        sys.meta_path.insert(0, _SourcesFirst(MODULES))
        return STATE
    built = MANIFEST.exists() or any(extension_files(module) for module in MODULES)
    if not built:
        STATE = "interpreted"
        return STATE
    why = staleness()
    if why is None:
        _load(f"{GROUP}__mypyc", group_library())
        STATE = "compiled"
        return STATE
    STATE = f"interpreted (stale build: {why})"
    sys.meta_path.insert(0, _SourcesFirst(MODULES))
    warnings.warn(
        f"streams.core: the compiled modules are not the build of their sources ({why}): "
        f"running the sources; `make install` rebuilds them, {PURE_VARIABLE}=1 silences this",
        StaleBuildWarning,
        stacklevel=2,
    )
    return STATE


def prerequisite(path: Path) -> str:
    """A source as make names it: relative to ROOT when under it, else its absolute path."""
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def main(argv: Sequence[str]) -> int:
    if list(argv) == ["sources"]:
        print(" ".join(prerequisite(path) for path in build_sources()))
        return 0
    print("usage: python streams/core/compiled.py sources", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
