"""What a command says when it runs outside the project's virtualenv (issue 24, item 1).

`python3 -m streams ...` in the repository finds `streams/` in the working directory, but not
its dependencies unless the virtualenv is active; instead of a `ModuleNotFoundError`
traceback, one line says what to run. Standard library only: it runs exactly when the
dependencies are missing.
"""

from __future__ import annotations

import sys

SETUP = "run `make install`, then `. .venv/bin/activate` (or call `.venv/bin/python`)"


def not_installed_message(missing: str, command: str) -> str:
    """The one line for `command` (`python -m streams`) whose import of `missing` failed."""
    return (
        f"{command}: the project's dependencies are not installed in this Python "
        f"({sys.executable}: no module {missing!r}); {SETUP}"
    )


def exit_not_installed(error: ModuleNotFoundError, command: str) -> None:
    """Exit 2 with the line above, unless the missing module is the project's own (a real
    bug: re-raised as it is)."""
    missing = (error.name or "?").split(".")[0]
    if missing in ("streams", "connectors", "fileevents"):
        raise error
    print(not_installed_message(missing, command), file=sys.stderr)
    raise SystemExit(2)
