"""The worker's side of a stage in a child process (`stream.stage_processes = 2`,
streams.stages.child): start it, ask it for its view, pass signals on, and stop the worker
when it ends.

Supervision, in short: the child's end stops the worker. Ended by a stop the worker asked for
(SIGTERM to the worker), that is the worker's stop; otherwise the worker stops (finishing its
own stage's batch) and exits with `exit_status` of the child's code, never 0 for a crash: 1 a
stage failed, 2 it could not start, 3 its stop ran out of time, 128 + N ended by signal N
(137: `kill -9`). A child that stopped cleanly because it was sent SIGTERM or SIGINT
itself stops the worker cleanly too (exit 0): a stop of either process is a stop of both.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import signal
import socket
import sys

from streams.config import Settings
from streams.exposition import SeriesKey, samples
from streams.progress import EXIT_STOP_TIMEOUT
from streams.stages.channel import EXIT_FAILED, EXIT_START, VIEW, StageView, receive, send

log = logging.getLogger(__name__)

VIEW_TIMEOUT_S = 2.0
"""How long a page waits for the child's view before answering without it (a busy child
answers between two batches)."""


def exit_status(returncode: int) -> int:
    """The worker's exit code for its child's: the same, or 128 + N for a child ended by
    signal N (as a shell says it; asyncio gives -N)."""
    return 128 - returncode if returncode < 0 else returncode


class StageProcess:
    """A stage of the worker running in a child process, seen from the worker."""

    def __init__(self, stages: tuple[str, ...]) -> None:
        self.stages = stages
        self.process: asyncio.subprocess.Process | None = None
        self.stopping = False
        """Set once the worker stops: the child's end is then part of that stop."""
        self.exit_code: int | None = None
        """The child's exit status once it ended (`exit_status`)."""
        self.last: StageView | None = None
        """The child's latest view (the progress line and ready line read it)."""
        self.last_samples: dict[SeriesKey, float] = {}
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._started = False
        """Whether the child has its settings (the first message: no request before it)."""
        self._asking: asyncio.Future[StageView] | None = None
        self._watching: asyncio.Future[None] | None = None

    @property
    def name(self) -> str:
        return "/".join(self.stages)

    @property
    def started(self) -> bool:
        """Whether the child was handed its settings (it starts its stages then)."""
        return self._started

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    async def spawn(self) -> None:
        """Start the child process, early (its imports take a second or two, while the worker
        creates its topics); it waits for `start`. From now on the worker exits with the
        child's code should it end before the worker (atexit)."""
        ours, theirs = socket.socketpair()
        with theirs:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "streams.stages.child",
                *self.stages,
                *("--fd", str(theirs.fileno()), "--parent", str(os.getpid())),
                *("--log-level", str(logging.getLogger().getEffectiveLevel())),
                stdin=asyncio.subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
            )
        atexit.register(self._exit_with_child_code)
        self._watching = asyncio.ensure_future(self._watch())
        self._reader, self._writer = await asyncio.open_unix_connection(sock=ours)

    async def start(self, settings: Settings) -> None:
        """Hand the child the worker's settings (the repartition topic resolved): it starts
        its stages."""
        assert self.process is not None and self._writer is not None, "not spawned"
        with contextlib.suppress(ConnectionError):
            await send(self._writer, settings)
        self._started = True
        log.info("the %s stage runs in process %d", self.name, self.process.pid)

    async def view(self, timeout_s: float = VIEW_TIMEOUT_S) -> StageView | None:
        """The child's view now; None if it does not answer within `timeout_s` (or is gone).
        A request outlasting it goes on: the next call waits for the same answer."""
        if self.exit_code is not None or not self._started:
            return None
        if self._asking is None or self._asking.done():
            self._asking = asyncio.ensure_future(self._ask())
            self._asking.add_done_callback(_retrieve)
        try:
            return await asyncio.wait_for(asyncio.shield(self._asking), timeout_s)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError):
            return None

    async def _ask(self) -> StageView:
        assert self._reader is not None and self._writer is not None
        await send(self._writer, VIEW)
        view = await receive(self._reader)
        assert isinstance(view, StageView)
        self.last, self.last_samples = view, samples(view.metrics)
        return view

    def signal(self, sig: int) -> None:
        if self.process is not None and self.exit_code is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    def stop(self) -> None:
        """The worker stops: so does the child (SIGTERM), finishing its batch in hand."""
        self.stopping = True
        self.signal(signal.SIGTERM)

    async def wait_stopped(self, deadline: float) -> None:
        """Wait for the child to end until `deadline` (loop time) less a second for the
        worker's own clients; one still there then is killed."""
        if self._watching is None:
            return
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(
                asyncio.shield(self._watching), max(0.1, deadline - 1.0 - loop.time())
            )
        except TimeoutError:
            log.warning("stopping: the %s stage's process did not stop in time; killed", self.name)
            self.signal(signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._watching), 1.0)

    async def _watch(self) -> None:
        assert self.process is not None
        code = self.exit_code = exit_status(await self.process.wait())
        if self.stopping:
            level = logging.WARNING if code else logging.INFO
            log.log(level, "the %s stage's process stopped (exit %d)", self.name, code)
            return
        if code == 0:
            log.warning("the %s stage's process was stopped: stopping the worker", self.name)
        else:
            log.error(
                "the %s stage's process ended with exit code %d (%s; its reason, if it "
                "gave one, is logged above): stopping the worker with that code",
                self.name,
                code,
                _meaning(code),
            )
        os.kill(os.getpid(), signal.SIGTERM)  # the worker's own stop: its stage finishes too

    def _exit_with_child_code(self) -> None:
        """At the worker's exit: the child's failure is the worker's exit code."""
        if self.exit_code:
            log.info("exiting with the %s stage process' code %d", self.name, self.exit_code)
            logging.shutdown()
            os._exit(self.exit_code)


def _meaning(code: int) -> str:
    if code > 128:
        try:
            return f"ended by {signal.Signals(code - 128).name}"
        except ValueError:
            return f"ended by signal {code - 128}"
    return {
        EXIT_FAILED: "a stage failed",
        EXIT_START: "it could not start",
        EXIT_STOP_TIMEOUT: "its stop ran out of time",
    }.get(code, "it failed")


def _retrieve(future: asyncio.Future[StageView]) -> None:
    if not future.cancelled():
        future.exception()  # read, so that a failure nobody awaited is not reported at exit
