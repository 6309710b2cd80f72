"""One record, start to finish: decode, dedupe, handlers with retries, dead letter.

`EventProcessor.process` returns an `Outcome`; every outcome but `INTERRUPTED` means the
record is done with and its offset may be committed.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, cast

from aiokafka.structs import ConsumerRecord

from fileevents.codec import UnreadableRecord, decode_record, read_identity
from fileevents.context import EventContext
from fileevents.deadletter import DeadLetterWriter, describe
from fileevents.dedupe import AnyDedupeStore, DedupeBatcher, dedupe_id, legacy_dedupe_id
from fileevents.errors import (
    DEAD_LETTER,
    DECODE,
    DEDUPE,
    WAIT_TIMEOUT,
    EventDecodeError,
    Failure,
    HandlerTimeout,
    OnError,
    log_failure,
)
from fileevents.event import FileEvent
from fileevents.metrics import FileEventsMetrics
from fileevents.registry import EventHandler, Registered, Registry
from fileevents.retry import RetryPolicy

if TYPE_CHECKING:
    from fileevents.partition import PartitionState

logger = logging.getLogger("fileevents")

T = TypeVar("T")

WATCH_EVERY_MIN_S = 0.005


class Outcome(enum.Enum):
    """What became of one record."""

    HANDLED = "handled"
    """Every matching handler succeeded."""
    NO_HANDLER = "no_handler"
    """No handler is registered for the event's type."""
    DUPLICATE = "duplicate"
    """The dedupe store already held the event's id: no handler ran."""
    DEAD_LETTERED = "dead_lettered"
    """A handler kept failing (or the record is not an event): it is on the dead-letter topic."""
    TOMBSTONE = "tombstone"
    """The record has no value: Kafka's deletion marker of a compacted topic, not an event.
    Skipped (nothing to handle, nothing to keep), committed and counted."""
    DONE_BEFORE = "done_before"
    """Done with before a restart, above the offset committed then: its commit's metadata
    recorded it (fileevents.partition), so it is skipped, not run again."""
    INTERRUPTED = "interrupted"
    """Stopped before the record was done with: it must not be committed."""


class _Interrupted(Exception):
    """Raised inside the processor when it must stop and leave the record unfinished."""


DONE, INTERRUPTED, AWAITING_RECORD = 0, 1, 2
"""What `EventProcessor.run` made of a job, for the dispatcher (fileevents.partition): done
with; stopped before it was done (it must not be committed); done with once its dedupe
record is written (`Dispatcher.recorded`)."""

RECORDING = None
"""What `EventProcessor.process` returns for an event whose handlers succeeded and whose id
is being written to the dedupe store: it is done with once the write is acknowledged
(`EventProcessor.on_recorded`), not before, and no task waits for it."""


class Job:
    """A record handed out to run, and where its dedupe lookup's answer will be, when it was
    looked up ahead (`EventProcessor.prepare`)."""

    __slots__ = ("at", "lookup", "record", "seen_id", "size", "state", "task")

    def __init__(self, state: PartitionState, record: ConsumerRecord[bytes, bytes]) -> None:
        self.state = state
        """Its partition's `PartitionState` (fileevents.partition)."""
        self.record = record
        self.lookup: asyncio.Future[list[bool]] | None = None
        """The answer of the batch lookup its ids are in: `size` of them from `at`."""
        self.at = 0
        self.size = 0
        self.seen_id = ""
        """The id its dedupe record is written under (`dedupe_id`)."""
        self.task: asyncio.Task[Any] | None = None
        """The task running it (set by the dispatcher's task that takes it): what the
        timeout watchdog cancels, known without `asyncio.current_task()` per event."""


class _HandlerMetrics:
    """The metric series of one handler, looked up once (`labels()` per event costs); its
    successful runs and durations counted in a `RunTally` where it can be."""

    __slots__ = (
        "dead_lettered",
        "failed",
        "handled",
        "ran",
        "retried",
        "seconds",
        "tally",
        "timed_out",
    )

    def __init__(self, metrics: FileEventsMetrics, topic: str, group: str, handler: str) -> None:
        self.handled = metrics.handled.labels(topic, group, handler)
        self.failed = metrics.failed.labels(topic, group, handler)
        self.timed_out = metrics.timed_out.labels(topic, group, handler)
        self.retried = metrics.retried.labels(topic, group, handler)
        self.dead_lettered = metrics.dead_lettered.labels(topic, group, handler)
        self.seconds = metrics.handler_seconds.labels(topic, group, handler)
        self.tally = metrics.tally(topic, group, handler)
        self.ran: Callable[[float, bool], None] = (
            self._observe if self.tally is None else self.tally.ran
        )
        """Told each run of the handler: how long (seconds), and whether it succeeded."""

    def _observe(self, seconds: float, succeeded: bool) -> None:
        """`ran` where runs cannot be tallied: observed one by one."""
        self.seconds.observe(seconds)
        if succeeded:
            self.handled.inc()


CLOSING = "fileevents: run() is ending"
"""The message `Dispatcher.close` cancels its tasks with: on Python 3.10, which counts no
cancellations, how a handler's `CancelledError` is told to be run()'s and not a failure."""


def _cancelled_by_others(task: asyncio.Task[Any], error: asyncio.CancelledError) -> bool:
    """Whether `task` is being cancelled by someone other than the timeout watchdog (its
    own cancellation is taken back in `_ran_out`): run() ending, as opposed to a
    `CancelledError` the handler raised or let out (a failure). Python 3.11+ counts the
    task's cancellations; 3.10 reads the message `Dispatcher.close` cancels with, which
    reaches the handler's `CancelledError` (a cancellation of run() that lands together with a
    handler's timeout is taken for the timeout there, and close() cancels again until its tasks
    have ended)."""
    if sys.version_info >= (3, 11):
        return task.cancelling() > 0
    return CLOSING in error.args


class EventProcessor:
    """Runs an event's handlers under the library's guarantees (see fileevents/README.md)."""

    def __init__(
        self,
        registry: Registry,
        group_id: str,
        retry: RetryPolicy,
        dead_letters: DeadLetterWriter,
        on_error: OnError,
        dedupe: AnyDedupeStore | None = None,
        dedupe_ttl: timedelta = timedelta(hours=24),
        handler_timeout: timedelta | None = None,
        metrics: FileEventsMetrics | None = None,
        topic: str = "",
        dedupe_legacy_window: timedelta | None = None,
    ) -> None:
        self._registry = registry
        self._handler_timeout = handler_timeout
        self._watched: dict[asyncio.Task[Any], float] = {}
        """Tasks running a handler that has a timeout -> when it runs out (loop time)."""
        self._expired: set[asyncio.Task[Any]] = set()
        """Tasks the watchdog cancelled because their handler ran out of time."""
        self._watchdog: asyncio.Task[None] | None = None
        limits = [handler_timeout, *registry.timeouts()]
        shortest = min((limit.total_seconds() for limit in limits if limit), default=None)
        self._watch_every = (
            1.0 if shortest is None else min(1.0, max(WATCH_EVERY_MIN_S, shortest / 10))
        )
        """How often the watchdog looks: a tenth of the shortest timeout, 5 ms to 1 s."""
        self._metrics = metrics or FileEventsMetrics()
        self._topic = topic
        self._metrics.start_at_zero(
            topic, group_id, registry.names(), [outcome.value for outcome in Outcome]
        )
        self._group_id = group_id
        self._series: dict[str, _HandlerMetrics] = {}
        for name in [*registry.names(), DECODE]:
            self._series_of(name)
        self._retry = retry
        self._dead_letters = dead_letters
        self._on_error = on_error
        self._dedupe = (
            None
            if dedupe is None
            else DedupeBatcher(dedupe, dedupe_ttl, self._written, self._write_failed)
        )
        self.on_outcome: Callable[[Outcome], None] = _uncounted
        """Told what became of each job `run` ran (but those left `RECORDING`: they are
        `on_recorded`'s)."""
        self.on_recorded: Callable[[list[Job]], None] = _unheard
        """Told the events whose ids the store now holds (those `process` left `RECORDING`):
        done with now. The dispatcher's `recorded`."""
        self._retrying: set[asyncio.Task[None]] = set()
        """Writes being retried, one task each (held: the loop keeps weak references)."""
        window = dedupe_ttl if dedupe_legacy_window is None else dedupe_legacy_window
        self._legacy_until = time.monotonic() + max(window, timedelta(0)).total_seconds()
        """Until when (monotonic clock) a miss also reads the id's key before scopes."""

    def _series_of(self, handler: str) -> _HandlerMetrics:
        series = self._series.get(handler)
        if series is None:
            series = _HandlerMetrics(self._metrics, self._topic, self._group_id, handler)
            self._series[handler] = series
        return series

    def dedupe_id(self, event: FileEvent) -> str:
        """The id the dedupe store sees for `event`: scoped to this consumer group and to the
        provider scope that issued the id (fileevents.dedupe `dedupe_id`)."""
        return dedupe_id(self._group_id, event)

    def _lookup_ids(self, event: FileEvent, scoped: str) -> tuple[str, ...]:
        """The ids under which the store may hold `event`: its scoped id (`scoped`); within
        the upgrade window its id before scopes too (fileevents.dedupe), asked together."""
        if time.monotonic() < self._legacy_until:
            return scoped, legacy_dedupe_id(self._group_id, event)
        return (scoped,)

    def _context(self, record: ConsumerRecord[bytes, bytes], attempt: int) -> EventContext:
        return EventContext.of(record, self._group_id, attempt)

    def prepare(
        self, state: PartitionState, records: list[ConsumerRecord[bytes, bytes]]
    ) -> list[Job]:
        """`records` (of `state`'s partition) as jobs that may start now. With a store that
        is not in-process, what each one's dedupe id is made of is read ahead
        (`codec.read_identity`), and the ids of those a handler is registered for are looked
        up together, in one exchange with the store (with whatever else is asked for in this
        turn of the loop): the events start with their answer there, or soon. The event is
        read as it starts, and its id compared (a differing one is looked up again).

        The dispatcher makes a record a job once no earlier event of its key is in progress
        in this consumer (running, or its id being written): so its lookup is asked for
        after every write this consumer made of an id of that key, and sees it."""
        dedupe = self._dedupe
        if dedupe is None or dedupe.in_process:
            return [Job(state, record) for record in records]
        jobs = []
        ids: list[str] = []
        asked: list[Job] = []
        group = self._group_id
        legacy = time.monotonic() < self._legacy_until
        selectors = self._registry.selectors
        every = "*" in selectors
        for record in records:
            job = Job(state, record)
            jobs.append(job)
            value = record.value
            if value is None:
                continue  # a tombstone, or an UnreadableRecord: no event
            # Only what the id is made of: the event itself is read as it starts, and dies
            # young (holding fetched events decoded made the collector walk them).
            identity = read_identity(value)
            if identity is None or not (every or identity.type in selectors):
                continue
            job.at = len(ids)
            job.seen_id = seen_id = dedupe_id(group, identity)
            ids.append(seen_id)
            if legacy:
                ids.append(legacy_dedupe_id(group, identity))
            job.size = len(ids) - job.at
            asked.append(job)
        if ids:
            lookup = dedupe.look_up(ids)
            for job in asked:
                job.lookup = lookup
        return jobs

    async def process(self, job: Job) -> Outcome | None:
        """Handle `job`'s record; once its partition is stopping, finish the running attempt,
        no more. `RECORDING` (None): handled, done with once its id is written."""
        try:
            return await self._process(job)
        except _Interrupted:
            return Outcome.INTERRUPTED

    async def run(self, job: Job) -> int:
        """`process`, for the dispatcher: the outcome told to `on_outcome` (but `RECORDING`),
        and `DONE`, `INTERRUPTED` or `AWAITING_RECORD` returned. (One coroutine less per
        event than awaiting `process`.)"""
        try:
            outcome = await self._process(job)
        except _Interrupted:
            outcome = Outcome.INTERRUPTED
        if outcome is RECORDING:
            return AWAITING_RECORD  # told `on_recorded` once written
        self.on_outcome(outcome)
        return INTERRUPTED if outcome is Outcome.INTERRUPTED else DONE

    async def _process(self, job: Job) -> Outcome | None:
        """`process`, but `_Interrupted` raised when stopping."""
        record = job.record
        stopping = job.state.stopping
        if record.value is None and not isinstance(record, UnreadableRecord):
            logger.debug(
                "%s[%d]@%d skipped: a tombstone", record.topic, record.partition, record.offset
            )
            return Outcome.TOMBSTONE
        try:
            event = decode_record(record)
        except Exception as exc:
            # Whatever reading a hostile record raises, it is that record's fault: retrying
            # cannot help, and letting it out would stop the partition at it for good.
            malformed = exc if isinstance(exc, EventDecodeError) else _unreadable(exc)
            context = self._context(record, 1)
            await self._report(Failure(None, context, DECODE, malformed, attempt=1, final=True))
            await self._dead_letter(record, None, context, DECODE, malformed, 1, stopping)
            self._series_of(DECODE).dead_lettered.inc()
            return Outcome.DEAD_LETTERED

        pending = self._registry.for_event(event)
        if not pending:
            return Outcome.NO_HANDLER

        dedupe = self._dedupe
        if dedupe is not None:
            lookup = job.lookup
            seen_id = dedupe_id(self._group_id, event)
            if seen_id != job.seen_id:  # not looked up ahead, or under another id
                lookup = None
                job.seen_id = seen_id
            ids = self._lookup_ids(event, seen_id) if lookup is None else ()
            try:
                if lookup is None:
                    seen = await dedupe.seen(*ids)
                else:  # asked for when it was fetched (`prepare`): answered by now, or soon
                    if not lookup.done():
                        await lookup
                    if lookup.cancelled():
                        raise ConnectionError("the dedupe store's exchange was cancelled")
                    seen = any(lookup.result()[job.at : job.at + job.size])
            except Exception as exc:
                if not ids:
                    ids = self._lookup_ids(event, seen_id)
                seen = await self._reliably(
                    lambda: dedupe.seen(*ids), event, record, stopping, failed=exc
                )
            if seen:
                logger.debug(
                    "event %r skipped: already handled by group %s", event.id, self._group_id
                )
                return Outcome.DUPLICATE

        attempt = 1
        while True:
            pending, failed = await self._run(pending, event, record, attempt, job.task)
            if failed is None:
                break
            handler, error, context = failed
            final = attempt >= self._retry.attempts
            await self._report(Failure(event, context, handler.name, error, attempt, final))
            if final:
                await self._dead_letter(
                    record, event, context, handler.name, error, attempt, stopping
                )
                self._series_of(handler.name).dead_lettered.inc()
                return Outcome.DEAD_LETTERED
            self._series_of(handler.name).retried.inc()
            await self._wait(self._retry.backoff(attempt), stopping)
            attempt += 1

        if dedupe is not None:
            seen_id = job.seen_id
            if not dedupe.in_process:
                dedupe.write(seen_id, job)
                return RECORDING
            try:
                await dedupe.add(seen_id)
            except Exception as exc:
                await self._record_reliably(job, event, seen_id, exc)
        return Outcome.HANDLED

    async def _record_reliably(
        self, job: Job, event: FileEvent, seen_id: str, failed: Exception
    ) -> None:
        """Write `seen_id` until it works (its first try failed with `failed`), or until
        `job`'s partition is stopping: the handlers did succeed, so it is then committed
        rather than run again elsewhere."""
        dedupe = self._dedupe
        assert dedupe is not None
        try:
            await self._reliably(
                lambda: dedupe.add(seen_id), event, job.record, job.state.stopping, failed=failed
            )
        except _Interrupted:
            logger.warning(
                "event %r handled but not recorded in the dedupe store (stopping)",
                event.id,
            )

    def _written(self, jobs: list[Job]) -> None:
        self.on_recorded(jobs)

    def _write_failed(self, jobs: list[Job], error: Exception) -> None:
        """A batch's write failed: each of its events retries its own (reported to
        `on_error`, backing off), and is done with once written."""
        for job in jobs:
            task = asyncio.get_running_loop().create_task(self._retry_write(job, error))
            self._retrying.add(task)
            task.add_done_callback(self._retrying.discard)

    async def _retry_write(self, job: Job, error: Exception) -> None:
        event = decode_record(job.record)  # read once already: not held while written
        await self._record_reliably(job, event, job.seen_id, error)
        self.on_recorded([job])

    async def close(self) -> None:
        """Stop the store's exchanges and the writes being retried: their events stay
        unfinished (not committed)."""
        tasks = list(self._retrying)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        if self._dedupe is not None:
            await self._dedupe.close()

    async def _run(
        self,
        pending: list[Registered],
        event: FileEvent,
        record: ConsumerRecord[bytes, bytes],
        attempt: int,
        task: asyncio.Task[Any] | None = None,
    ) -> tuple[list[Registered], tuple[Registered, BaseException, EventContext] | None]:
        """Run `pending` in order, each within its timeout; on a failure, the failing handler
        and those after it, with the context of the failed attempt. The context is built
        only when a handler takes it or a run fails. (One coroutine for all the handlers, not
        one more per handler run: a no-op handler's event is a few microseconds in all.)

        A failure is anything a handler raises (`RecursionError`, a `BaseException` of a
        test framework or a library, a `CancelledError` it did not get from us), or running
        past its timeout (`HandlerTimeout`; it is cancelled), except what stops the process
        or the task: `KeyboardInterrupt`, `SystemExit`, and the cancellation of the task
        running it (the event then stays uncommitted). `task`: the task running this
        (default: the current one)."""
        context: EventContext | None = None
        if task is None:
            task = asyncio.current_task()
        expired = self._expired
        for index, handler in enumerate(pending):
            if handler.wants_context and context is None:
                context = self._context(record, attempt)
            series = self._series.get(handler.name) or self._series_of(handler.name)
            limit = handler.timeout or self._handler_timeout
            seconds = None if limit is None or task is None else limit.total_seconds()
            started = time.perf_counter()
            if seconds is not None:
                assert task is not None
                self._watched[task] = started + seconds
                if self._watchdog is None:
                    self._start_watchdog()
            error: BaseException | None = None
            try:
                if context is None:
                    await cast(EventHandler, handler.handler)(event)
                else:
                    await handler(event, context)
            except (KeyboardInterrupt, SystemExit):
                raise
            except asyncio.CancelledError as exc:
                ran_out = self._ran_out(task)
                if task is None or _cancelled_by_others(task, exc):
                    raise
                error = _timed_out(handler, seconds) if ran_out else exc
            except BaseException as exc:
                error = _timed_out(handler, seconds) if self._ran_out(task) else exc
            finally:
                if seconds is not None:
                    self._watched.pop(task, None)  # type: ignore[arg-type]
            if error is None and expired and self._ran_out(task):
                # It swallowed the watchdog's cancellation, then returned: too late.
                error = _timed_out(handler, seconds)
            series.ran(time.perf_counter() - started, error is None)
            if error is not None:
                series.failed.inc()
                if isinstance(error, HandlerTimeout):
                    series.timed_out.inc()
                if context is None:
                    context = self._context(record, attempt)
                return pending[index:], (handler, error, context)
        return [], None

    def _start_watchdog(self) -> None:
        """Watch `_watched` (tasks running a handler -> when it runs out, `perf_counter`
        time): cancel each task still running its handler past that, looking every
        `_watch_every` (one timer for every handler, not one per run), while any is."""
        self._watchdog = asyncio.get_running_loop().create_task(
            self._watch_loop(), name="fileevents:timeouts"
        )

    async def _watch_loop(self) -> None:
        try:
            while self._watched:
                await asyncio.sleep(self._watch_every)
                now = time.perf_counter()
                for task, deadline in list(self._watched.items()):
                    if deadline <= now and task not in self._expired:
                        self._expired.add(task)
                        task.cancel()
        finally:
            # Started again by the next run with a timeout (none is watched now, or this
            # task is ending with its loop).
            self._watchdog = None

    def _ran_out(self, task: asyncio.Task[Any] | None) -> bool:
        """Whether the watchdog cancelled `task`'s handler run; if so, that cancellation
        is taken back (as `asyncio.timeout` does), so it does not cancel the task."""
        if task is None or task not in self._expired:
            return False
        self._expired.discard(task)
        if sys.version_info >= (3, 11):
            task.uncancel()
        return True

    async def _dead_letter(
        self,
        record: ConsumerRecord[bytes, bytes],
        event: FileEvent | None,
        context: EventContext,
        handler: str,
        error: BaseException,
        attempts: int,
        stopping: asyncio.Event,
    ) -> None:
        await self._reliably(
            lambda: self._dead_letters.send(record, context, handler, error, attempts),
            event,
            record,
            stopping,
            what=DEAD_LETTER,
            attempt=attempts,
        )

    async def _reliably(
        self,
        operation: Callable[[], Awaitable[T]],
        event: FileEvent | None,
        record: ConsumerRecord[bytes, bytes],
        stopping: asyncio.Event,
        what: str = DEDUPE,
        attempt: int = 1,
        failed: Exception | None = None,
    ) -> T:
        """Retry the library's own I/O until it works: an outage is not the event's fault.
        `failed`: how a first try, made by the caller, failed."""
        failures = 0
        while True:
            if failed is None:
                try:
                    return await operation()
                except Exception as exc:
                    failed = exc
            failures += 1
            context = self._context(record, attempt)
            await self._report(Failure(event, context, what, failed, failures, final=False))
            failed = None
            await self._wait(self._retry.backoff(failures), stopping)

    @staticmethod
    async def _wait(seconds: float, stopping: asyncio.Event) -> None:
        """Back off for `seconds`, or raise `_Interrupted` as soon as `stopping` is set."""
        if stopping.is_set():
            raise _Interrupted
        try:
            await asyncio.wait_for(stopping.wait(), timeout=seconds)
        except WAIT_TIMEOUT:
            return
        raise _Interrupted

    async def _report(self, failure: Failure) -> None:
        try:
            result = self._on_error(failure)
            if inspect.isawaitable(result):
                await result
        except Exception:
            logger.exception("on_error raised; the failure it was given follows")
            log_failure(failure)


def _unheard(jobs: list[Job]) -> None:
    return None


def _uncounted(outcome: Outcome) -> None:
    return None


def _timed_out(handler: Registered, seconds: float | None) -> HandlerTimeout:
    return HandlerTimeout(f"{handler.name} did not finish within {seconds:g} s: cancelled")


def _unreadable(error: Exception) -> EventDecodeError:
    """A decode failure other than `EventDecodeError` (a bug, or a limit of a library), as
    one: the record is malformed either way, and the dead letter names the cause."""
    wrapped = EventDecodeError(f"the record could not be read as an event: {describe(error)}")
    wrapped.__cause__ = error
    return wrapped
