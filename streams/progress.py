"""What keeps each stage from making progress, for `/ready`, the log and a bounded stop.

The writers (streams.sending, streams.transactions) report here why a write has not gone
through yet (`trouble`), and that it did (`recovered`). A cause is logged at most once every
`LOG_EVERY_S` seconds, with how often it recurred meanwhile, instead of once per retry; a
stage whose trouble lasts `STUCK_AFTER_S` makes `/ready` answer 503 naming the stage and why.

Stopping: once `stop()` was called, `pause` (the wait between two attempts) raises
`Stopping`, so no retry loop outlives the worker's grace period. Whatever is awaited at that
moment is cancelled by the worker (streams.worker.PipelineService.on_stop).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from streams import metrics

log = logging.getLogger(__name__)

STOP_GRACE_S = 30.0
"""From SIGTERM to the worker's exit, at most (Kubernetes' terminationGracePeriodSeconds must
be longer: k8s/base/worker.yaml gives 120 s)."""
EXIT_STOP_TIMEOUT = 3
"""The worker's exit code when the grace period ran out before it was done stopping (it is
ended there; nothing uncommitted is lost: it is read again on the next start)."""
LOG_EVERY_S = 5.0
"""At most one log line per stage and cause this often."""
STUCK_AFTER_S = 5.0
"""A stage in trouble this long is reported by `/ready` (503)."""
SLOW_WRITE_S = 5.0
"""A write Kafka has not acknowledged after this long is reported as trouble (aiokafka
retries retriable errors by itself, e.g. NOT_ENOUGH_REPLICAS, so nothing else would say)."""
Result = TypeVar("Result")


class Stopping(Exception):
    """The worker is stopping: a write still retrying is abandoned. Its input offsets are not
    committed, so the next start reads its records again."""


@dataclass(slots=True)
class Trouble:
    why: str
    since: float
    logged_at: float
    repeats: int = 0


class Progress:
    """Per stage: what it is stuck on since when; and whether the worker is stopping.

    A stage may wait on several writes at once (the emit stage, one per partition): each
    reports as its own `who`, and the stage is stuck while any of them is."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._troubles: dict[tuple[str, object], Trouble] = {}
        self._logged: dict[tuple[str, str], Trouble] = {}
        self._stopping = False

    def trouble(self, stage: str, cause: str, why: str, who: object = None) -> None:
        """`stage` (its writer `who`) cannot make progress because of `why`; `cause` groups
        repeats of it in the log."""
        now = self._clock()
        current = self._troubles.get((stage, who))
        self._troubles[(stage, who)] = Trouble(why, current.since if current else now, now)
        metrics.STAGE_STUCK.labels(stage).set(1)
        logged = self._logged.get((stage, cause))
        if logged is not None and now - logged.logged_at < LOG_EVERY_S:
            logged.repeats += 1
            return
        again = (
            f" (and {logged.repeats} more times in {now - logged.logged_at:.0f} s)"
            if logged is not None and logged.repeats
            else ""
        )
        self._logged[(stage, cause)] = Trouble(why, now, now)
        log.warning("%s stage cannot make progress: %s%s", stage, why, again)

    def recovered(self, stage: str, who: object = None) -> None:
        trouble = self._troubles.pop((stage, who), None)
        if trouble is None or any(key[0] == stage for key in self._troubles):
            return
        metrics.STAGE_STUCK.labels(stage).set(0)
        log.info("%s stage makes progress again after %.1f s", stage, self._clock() - trouble.since)
        for key in [key for key in self._logged if key[0] == stage]:
            del self._logged[key]

    def stuck(self) -> dict[str, dict[str, object]]:
        """Stages in trouble for `STUCK_AFTER_S` or longer: why (the longest-lasting
        trouble's latest), and for how long."""
        now = self._clock()
        oldest: dict[str, Trouble] = {}
        for (stage, _), trouble in self._troubles.items():
            if stage not in oldest or trouble.since < oldest[stage].since:
                oldest[stage] = trouble
        return {
            stage: {"why": trouble.why, "for_s": round(now - trouble.since, 1)}
            for stage, trouble in oldest.items()
            if now - trouble.since >= STUCK_AFTER_S
        }

    def stop(self) -> None:
        self._stopping = True

    @property
    def stopping(self) -> bool:
        return self._stopping

    def check(self) -> None:
        """Raise Stopping once the worker is stopping."""
        if self._stopping:
            raise Stopping("the worker is stopping")

    async def pause(self, seconds: float) -> None:
        """Wait between two attempts; Stopping instead once the worker stops."""
        self.check()
        await asyncio.sleep(seconds)
        self.check()

    async def watch(
        self, stage: str, what: str, work: Awaitable[Result], who: object = None
    ) -> Result:
        """Await `work`; while it takes longer than `SLOW_WRITE_S`, report so as trouble."""
        task = asyncio.ensure_future(work)
        started = self._clock()
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=SLOW_WRITE_S)
                if done:
                    return task.result()
                self.trouble(
                    stage,
                    f"slow:{what}",
                    f"{what}: not acknowledged by Kafka after {self._clock() - started:.0f} s",
                    who,
                )
        finally:
            # A task of ours is cancelled with the wait; a producer's future is left to it.
            if isinstance(task, asyncio.Task) and not task.done():
                task.cancel()
