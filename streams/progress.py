"""What keeps each stage from making progress, for `/ready`, the log and a bounded stop.

The writers (the engines' producers and transactions, streams.engine) report here why a
write has not gone through yet (`trouble`), and that it did (`recovered`). A cause is logged
at most once every `LOG_EVERY_S` seconds, with how often it recurred meanwhile, instead of once
per retry; a stage whose trouble lasts `STUCK_AFTER_S` makes `/ready` answer 503 naming the
stage and why.

A stage can also be stuck without a write to report it: Kafka away while nothing is written,
or records waiting (lag) that nothing handles. `StallWatch` is told, about once a second, how
many records a stage has handled, its lag, and when Kafka last answered its consumer's fetch;
a stage that handled nothing for `QUIET_S` while it has lag, or while Kafka answers none of its
fetches, is in trouble since its last sign of life, so `/ready` says so `STUCK_AFTER_S` after it;
so is a stage one of whose partitions does not move while records wait on it (its consumer
names those), though it handles the others.

Stopping: once `stop()` was called, `pause` (the wait between two attempts) raises
`Stopping`, so no retry loop outlives the worker's grace period. Whatever is awaited at that
moment is cancelled by the worker (streams.worker.PipelineService.on_stop).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
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
FINISH_SHARE = 0.5
"""Of the grace period (STOP_GRACE_S), the part batches in hand may take to finish; the rest
is for abandoning what did not, closing the clients and Faust's own shutdown."""
LOG_EVERY_S = 5.0
"""At most one log line per stage and cause this often."""
STUCK_AFTER_S = 5.0
"""A stage in trouble this long is reported by `/ready` (503)."""
QUIET_S = 2.0
"""A stage that handled no record for this long while it has lag, or whose consumer Kafka
did not answer for this long, is in trouble (StallWatch). An idle consumer's fetch is answered
at least every fetch_max_wait_ms (0.5 s)."""
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

    def trouble(
        self, stage: str, cause: str, why: str, who: object = None, since: float | None = None
    ) -> None:
        """`stage` (its writer `who`) cannot make progress because of `why`; `cause` groups
        repeats of it in the log. `since`: when the trouble began, if before now (clock time)."""
        now = self._clock()
        current = self._troubles.get((stage, who))
        began = current.since if current else now if since is None else min(since, now)
        self._troubles[(stage, who)] = Trouble(why, began, now)
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
        """The write `who` of `stage` went through."""
        self._end(stage, who, "makes progress again after")

    def given_up(self, stage: str, who: object = None) -> None:
        """The write `who` of `stage` ended without going through (its partitions moved, it
        raised, the worker stops): its trouble ends with it, or /ready would name it for good
        while the stage carries on. Nothing if it reported none, or `recovered` came first."""
        self._end(stage, who, "no longer waits on a write in trouble (given up) after")

    def _end(self, stage: str, who: object, words: str) -> None:
        trouble = self._troubles.pop((stage, who), None)
        if trouble is None or any(key[0] == stage for key in self._troubles):
            return
        metrics.STAGE_STUCK.labels(stage).set(0)
        log.info("%s stage %s %.1f s", stage, words, self._clock() - trouble.since)
        for key in [key for key in self._logged if key[0] == stage]:
            del self._logged[key]

    def in_trouble(self, stage: str, besides: object = None) -> bool:
        """Whether a writer of `stage` other than `besides` reports trouble now."""
        return any(key[0] == stage and key[1] != besides for key in self._troubles)

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


class StallWatch:
    """Whether a stage's consumer makes progress: reported to `progress` as trouble of the
    stage (`who` = "consumer") while it handled nothing for QUIET_S although it has lag, or
    Kafka answered none of its fetches for QUIET_S; recovered once either moves again."""

    WHO = "consumer"

    def __init__(
        self, progress: Progress, stage: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.progress = progress
        self.stage = stage
        self._clock = clock
        self._handled: float | None = None
        self._handled_at = clock()
        self._stalled = False

    def sample(
        self,
        handled: float,
        lag: int | None,
        answered_at: float | None,
        stalled: Sequence[str] = (),
    ) -> None:
        """`handled`: records the stage handled so far; `lag`: records waiting on its
        partitions (None: unknown); `answered_at`: when Kafka last answered a fetch of its
        consumer (clock time; None: not since it was assigned); `stalled`: its partitions
        whose position does not move while records wait on them, each with why (the stage
        may handle its other partitions meanwhile)."""
        now = self._clock()
        if handled != self._handled:
            self._handled, self._handled_at = handled, now
        if self.progress.in_trouble(self.stage, besides=self.WHO):
            # A write says why the stage does not move: that is the cause to report, not the
            # records waiting behind it.
            self.reset()
            return
        alive_at = max(self._handled_at, answered_at or self._handled_at)
        quiet = now - self._handled_at >= QUIET_S
        if quiet and lag is not None and lag > 0:
            why = f"{lag} records waiting, none handled for {now - self._handled_at:.0f} s"
            self._report("lag", why, self._handled_at)
        elif stalled:
            more = f" (and {len(stalled) - 3} more)" if len(stalled) > 3 else ""
            self._report("partition", f"partition {'; '.join(stalled[:3])}{more}", now)
        elif now - alive_at >= QUIET_S:
            self._report(
                "unanswered", f"Kafka answered no fetch for {now - alive_at:.0f} s", alive_at
            )
        elif self._stalled:
            self._stalled = False
            self.progress.recovered(self.stage, self.WHO)

    def reset(self) -> None:
        """The stage has no partitions (or is restoring them): nothing to watch for now."""
        self._handled_at = self._clock()
        if self._stalled:
            self._stalled = False
            self.progress.recovered(self.stage, self.WHO)

    def _report(self, cause: str, why: str, since: float) -> None:
        self._stalled = True
        self.progress.trouble(self.stage, f"stall:{cause}", why, self.WHO, since=since)


def arm_stop_watchdog(grace_s: float) -> None:
    """End the process `grace_s` from now (EXIT_STOP_TIMEOUT) if it has not ended by then: a
    thread, so that it fires even when the event loop is blocked."""

    def expire() -> None:
        log.error("stopping took longer than %.0f s: exiting now", grace_s)
        logging.shutdown()
        os._exit(EXIT_STOP_TIMEOUT)

    timer = threading.Timer(grace_s, expire)
    timer.daemon = True
    timer.start()
