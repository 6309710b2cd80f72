"""Servers that tests start as subprocesses (emulators, Redis): wait until up, always stop."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from support.worker import wait_for


@contextmanager
def serving(
    process: subprocess.Popen[bytes],
    what: str,
    answers: Callable[[], bool],
    log: Callable[[], str],
    timeout_s: float = 30.0,
    interval_s: float = 0.1,
) -> Iterator[None]:
    """Wait until `answers()` (failing at once, with its log, if the process exits), yield,
    then stop the process: SIGTERM, SIGKILL after 10 s."""

    def up() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{log()}")
        return answers()

    try:
        wait_for(up, timeout_s, f"{what} to answer", interval_s=interval_s)
        yield
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
