"""Where the stack `make run` started is, for every command that belongs to it (issue 35, item 2).

`make run` (dev/run.py) records the addresses it used in its run directory
(`~/.cache/storage-events/run/stack.json`); `make send`, `make tail`, `make status`,
`make dead-letters` and `fileevents`' default connection read it. The code is the consumer
library's (`fileevents.localstack`), which reads the record with no stream installed; the
stream's commands and the dev scripts use it from here.

Standard library only: `make send` runs this with the system Python, before any virtualenv,
where the fileevents distribution is not installed: the checkout's package is then imported
from its directory (importing `fileevents` loads none of its dependencies until a name of
the library is used).
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import fileevents.localstack as _stack
except ModuleNotFoundError:  # the system Python of `make send`: this checkout's fileevents
    # (found first as the distribution's directory, a namespace package without the module)
    sys.modules.pop("fileevents", None)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fileevents" / "src"))
    import fileevents.localstack as _stack

LOCATING = _stack.LOCATING
STACK_FILE_NAME = _stack.STACK_FILE_NAME
Stack = _stack.Stack
belongs_to = _stack.belongs_to
command_environ = _stack.command_environ
recorded = _stack.recorded
remove = _stack.remove
run_dir = _stack.run_dir
running = _stack.running
stack_file = _stack.stack_file
write = _stack.write
_alive = _stack._alive

__all__ = [
    "LOCATING",
    "STACK_FILE_NAME",
    "Stack",
    "belongs_to",
    "command_environ",
    "recorded",
    "remove",
    "run_dir",
    "running",
    "stack_file",
    "write",
]
