"""Where the stack `make run` started is, for every command that belongs to it (issue 35, item 2).

`make run` (dev/run.py) records the addresses it used in its run directory
(`~/.cache/storage-events/run/stack.json`: its pid, the Kafka client settings the worker and
the bridge got, the webhook bridge's and the worker's ports, the local broker's port and
directory) and removes the record when it stops. `make send`, `make tail`, `make status`,
`make dead-letters` and `fileevents`' default connection read it, so a stack moved with
`LOCAL_KAFKA_PORT`, `WEBHOOK_PORT` or `STREAMS_WEB_PORT` is found from a fresh shell with no
variable set. A variable given to a command wins; a command whose Kafka variables name
another broker than the stack's does not take the stack's ports either.

Standard library only: `make send` runs it with the system Python, before any virtualenv.

This is THE module: the consumer reads the stack's record with it without the stream
installed, and the storage-events repository's streams/localstack.py re-exports it (for the
stream's commands and the dev scripts; `make send`'s system Python imports it from the
checkout's fileevents/src), so the writer and every reader share one format by construction.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

STACK_FILE_NAME = "stack.json"
LOCATING = ("KAFKA_BOOTSTRAP_SERVERS", "LOCAL_KAFKA_PORT", "LOCAL_KAFKA_DIR")
"""The variables that say which Kafka a command is for."""


def run_dir(home: Path | None = None) -> Path:
    """`make run`'s directory: its logs and its stack record."""
    return (home or Path.home()) / ".cache" / "storage-events" / "run"


@dataclass(frozen=True)
class Stack:
    """One running `make run`: what it started and where."""

    pid: int
    kafka: dict[str, str]
    """The KAFKA_* client settings the worker and the bridge got."""
    webhook_port: int
    worker_port: int
    local_kafka: dict[str, str] = field(default_factory=dict)
    """LOCAL_KAFKA_PORT and LOCAL_KAFKA_DIR of the local broker (empty: an external one)."""

    @property
    def bootstrap(self) -> str:
        return self.kafka.get("KAFKA_BOOTSTRAP_SERVERS", "?")

    @property
    def webhook_url(self) -> str:
        return f"http://127.0.0.1:{self.webhook_port}"

    @property
    def worker_url(self) -> str:
        return f"http://127.0.0.1:{self.worker_port}"

    def environ(self) -> dict[str, str]:
        """The variables a command of this stack runs with."""
        return {
            **self.kafka,
            **self.local_kafka,
            "WEBHOOK_PORT": str(self.webhook_port),
            "STREAMS_WEB_PORT": str(self.worker_port),
        }

    def describe(self) -> str:
        """One line: where this stack is."""
        return (
            f"`make run` (pid {self.pid}) runs Kafka at {self.bootstrap}, the webhook bridge "
            f"at {self.webhook_url}, the worker at {self.worker_url}"
        )

    def agrees_with(self, environ: Mapping[str, str]) -> bool:
        """Whether `environ`'s Kafka variables (those it sets) name this stack's broker."""
        mine = self.environ()
        for name in LOCATING:
            given = environ.get(name)
            if given and given != mine.get(name):
                return False
        return True


def stack_file(home: Path | None = None) -> Path:
    return run_dir(home) / STACK_FILE_NAME


def write(stack: Stack, home: Path | None = None) -> Path:
    """Record `stack` (readable by its user only: the settings may hold a password)."""
    path = stack_file(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.touch(mode=0o600)
    partial.write_text(json.dumps(asdict(stack), indent=1) + "\n")
    partial.replace(path)
    return path


def remove(pid: int, home: Path | None = None) -> None:
    """Forget the record, when it is `pid`'s (another `make run` may have replaced it)."""
    found = recorded(home)
    if found is not None and found.pid == pid:
        stack_file(home).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recorded(home: Path | None = None) -> Stack | None:
    """The record as written, alive or not (None: none, or unreadable)."""
    try:
        data = json.loads(stack_file(home).read_text())
        return Stack(
            pid=int(data["pid"]),
            kafka={str(k): str(v) for k, v in data["kafka"].items()},
            webhook_port=int(data["webhook_port"]),
            worker_port=int(data["worker_port"]),
            local_kafka={str(k): str(v) for k, v in data.get("local_kafka", {}).items()},
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def running(home: Path | None = None) -> Stack | None:
    """The stack of a `make run` that is still running (a record left by one that died is
    ignored)."""
    stack = recorded(home)
    return stack if stack is not None and _alive(stack.pid) else None


def belongs_to(environ: Mapping[str, str], home: Path | None = None) -> Stack | None:
    """The running stack a command with `environ` belongs to: the one `make run` started,
    unless `environ`'s Kafka variables name another broker."""
    stack = running(home)
    return stack if stack is not None and stack.agrees_with(environ) else None


def command_environ(environ: Mapping[str, str], home: Path | None = None) -> dict[str, str]:
    """What a command of the stack it belongs to adds to `environ` (its variables win)."""
    stack = belongs_to(environ, home)
    if stack is None:
        return {}
    return {name: value for name, value in stack.environ().items() if not environ.get(name)}
