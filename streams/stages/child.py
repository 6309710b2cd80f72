"""A stage of the worker in a process of its own (`stream.stage_processes = 2`): what the
worker starts as `python -m streams.stages.child emit --fd N --parent PID` (never by hand;
streams.stages.supervisor), so that each stage has a core of its own.

It runs its stages as the one-process worker does (streams.stages.pipeline: their group
members, producers, transactions and state; the state sweep every
`stream.dedupe_sweep_interval_s`; the stall watch every second), and answers the worker's
requests for its view (streams.stages.channel) for `/ready`, `/metrics`, the progress line
and the ready line. It stops, finishing the batch in hand as the worker does
(Pipeline.shut_down, within CHILD_GRACE_S), on SIGTERM or SIGINT, when its end of the
worker's socket closes, or when a stage fails. Should the worker die, the kernel kills the
child with it (PR_SET_PDEATHSIG). SIGUSR1 is passed on to the worker, which stops both and
leaves the groups.

Exit codes: 0 stopped when asked; EXIT_FAILED a stage failed (a bug or a broken disk);
EXIT_START it could not start; streams.progress.EXIT_STOP_TIMEOUT its stop ran out of time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable

from streams.config import Settings
from streams.engine import failpoints
from streams.engine.librdkafka.consumer import RdBatchLoop
from streams.exposition import snapshot
from streams.kafka_settings import KafkaRefusalWording
from streams.logs import install_kafka_log_filter
from streams.progress import STOP_GRACE_S, arm_stop_watchdog
from streams.stages.channel import EXIT_FAILED, EXIT_START, VIEW, StageView, receive, send
from streams.stages.pipeline import STAGE_NAMES, Pipeline

log = logging.getLogger(__name__)

CHILD_GRACE_S = STOP_GRACE_S - 6.0
"""The child's grace period from SIGTERM: shorter than the worker's, which waits for the child
to be gone before it closes its own clients and, on SIGUSR1, leaves the groups."""
PR_SET_PDEATHSIG = 1
LOG_FORMAT = "[%(asctime)s] [%(process)s] [%(levelname)s] [{stage} process] %(message)s"


def die_with_parent(parent: int) -> None:
    """SIGKILL to this process when the worker dies (Linux prctl PR_SET_PDEATHSIG): a worker
    killed takes its stages with it at once, as one process would, rather than leave one
    running beside its successor. A worker gone already: stop now."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        raise SystemExit(EXIT_START)


class StageChild:
    """The child's stages, run until asked to stop or one fails."""

    def __init__(
        self, settings: Settings, stages: tuple[str, ...], parent: int, stop: asyncio.Event
    ) -> None:
        self.settings = settings
        self.parent = parent
        self.pipeline = Pipeline(settings, self._stop_on_failure, runs=stages)
        self.stop_requested = stop
        """Set by SIGTERM or SIGINT (handlers of `_main`), the worker gone, a stage failed."""
        self.exit_code = 0
        self.started = False
        self._failed = False

    async def run(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        """Start, serve, stop; the exit code."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, lambda: os.kill(self.parent, signal.SIGUSR1))
        answering = asyncio.ensure_future(self._answer(reader, writer))
        failpoints.reached("stage-process-start")
        starting = asyncio.ensure_future(self.pipeline.start())
        stop = asyncio.ensure_future(self.stop_requested.wait())
        await asyncio.wait({starting, stop}, return_when=asyncio.FIRST_COMPLETED)
        running: list[asyncio.Future[None]] = []
        timers: list[asyncio.Future[None]] = []
        if starting.done() and starting.exception() is not None:
            exc = starting.exception()
            log.error("could not start: %s", exc, exc_info=exc)
            os.write(
                2,
                f"storage-events: the {'/'.join(self.pipeline.runs)} stage's process "
                f"could not start: {exc}\n".encode(),
            )
            logging.shutdown()
            os._exit(EXIT_START)  # nothing started to finish; the worker stops too
        if starting.done():
            self.started = True
            log.info("started: %s", ", ".join(self.pipeline.runs))
            running = [asyncio.ensure_future(self._run(stage)) for stage in self.pipeline.stages]
            timers = [
                asyncio.ensure_future(self._every(1.0, self.pipeline.watch_stalls)),
                asyncio.ensure_future(
                    self._every(self.settings.stream.dedupe_sweep_interval_s, self.pipeline.sweep)
                ),
            ]
            await stop
        else:
            starting.cancel()
        arm_stop_watchdog(CHILD_GRACE_S)
        for timer in timers:
            timer.cancel()
        await self.pipeline.shut_down(running, CHILD_GRACE_S)
        answering.cancel()
        return self.exit_code

    def view(self) -> StageView:
        pipeline = self.pipeline
        return StageView(
            started=self.started,
            ready=pipeline.ready,
            status=pipeline.status(),
            owned={stage.name: len(stage.owned) for stage in pipeline.stages},
            metrics=snapshot(),
        )

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                if await receive(reader) == VIEW:
                    await send(writer, self.view())
        except (asyncio.IncompleteReadError, ConnectionError):
            if not self.stop_requested.is_set():
                log.warning("the worker is gone: stopping")
            self.stop_requested.set()

    async def _every(self, interval_s: float, work: Callable[[], Awaitable[None]]) -> None:
        """A timer, as Faust's in the worker: `work` failing stops the child (a bug)."""
        while True:
            await asyncio.sleep(interval_s)
            if self.pipeline.progress.stopping:
                continue
            try:
                await work()
            except Exception as exc:
                await self._stop_on_failure("/".join(self.pipeline.runs), exc)
                return

    async def _run(self, stage: RdBatchLoop) -> None:
        try:
            await stage.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._stop_on_failure(stage.name, exc)
            raise

    async def _stop_on_failure(self, stage: str, exc: BaseException) -> None:
        """As the worker's (streams.worker): a stage failing is a bug or a broken disk."""
        if self.pipeline.progress.stopping:
            log.info("the %s stage ended while stopping: %r", stage, exc)
            return
        if self._failed:
            return
        self._failed = True
        log.error("the %s stage failed; stopping", stage, exc_info=exc)
        await self.pipeline.close_consumers()  # a dying stage is assigned nothing
        self.exit_code = EXIT_FAILED
        self.stop_requested.set()


async def _main(stages: tuple[str, ...], fd: int, parent: int) -> int:
    """Wait for the worker's settings (stopping meanwhile if told to), then run."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reader, writer = await asyncio.open_unix_connection(sock=socket.socket(fileno=fd))
    receiving = asyncio.ensure_future(receive(reader))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({receiving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not receiving.done():  # the worker stopped before it started its stages
        receiving.cancel()
        return 0
    stopping.cancel()
    try:
        settings = receiving.result()
    except (asyncio.IncompleteReadError, ConnectionError):  # the worker is gone
        return EXIT_START
    if not isinstance(settings, Settings):
        os.write(
            2,
            f"storage-events: the {'/'.join(stages)} stage's process could not start: "
            f"the worker sent no settings ({type(settings).__name__})\n".encode(),
        )
        return EXIT_START
    KafkaRefusalWording(settings.kafka).install()
    return await StageChild(settings, stages, parent, stop).run(reader, writer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m streams.stages.child",
        description="A stage of the worker in its own process (started by the worker).",
    )
    parser.add_argument("stages", nargs="+", choices=STAGE_NAMES)
    parser.add_argument("--fd", type=int, required=True, help="the worker's socket")
    parser.add_argument("--parent", type=int, required=True, help="the worker's pid")
    parser.add_argument("--log-level", type=int, default=logging.WARNING)
    args = parser.parse_args(argv)
    stages = tuple(args.stages)
    logging.basicConfig(
        level=args.log_level, format=LOG_FORMAT.format(stage="/".join(stages)), stream=sys.stderr
    )
    install_kafka_log_filter()  # an outage: one line per cause every few seconds
    die_with_parent(args.parent)
    code = asyncio.run(_main(stages, args.fd, args.parent))
    logging.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
