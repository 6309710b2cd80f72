"""Failures as `on_error` sees them, and the default reporter that logs them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fileevents.context import EventContext
from fileevents.event import FileEvent, printable

logger = logging.getLogger("fileevents")

DECODE = "<decode>"
"""The `handler` of a failure to read the record as a canonical event (never retried)."""
DEDUPE = "<dedupe>"
"""The `handler` of a failure of the dedupe store (retried until it answers)."""
DEAD_LETTER = "<dead-letter>"
"""The `handler` of a failure to write the dead-letter topic (retried until it works)."""


WAIT_TIMEOUT: tuple[type[Exception], ...] = (TimeoutError, asyncio.TimeoutError)
"""What `asyncio.wait_for` raises when its time is up: the built-in `TimeoutError` from Python
3.11, asyncio's own class (not a subclass of it) on 3.10."""


class EventDecodeError(ValueError):
    """A record whose value is not a canonical event."""


class HandlerTimeout(TimeoutError):
    """A handler ran past its timeout and was cancelled: a failure like any other (retried,
    then dead-lettered), so a hanging call cannot hold its partition up for good."""


@dataclass(frozen=True)
class Failure:
    """One failed attempt: a handler raised, or the library could not do its part."""

    event: FileEvent | None
    """The event, or None when the record could not be decoded."""
    context: EventContext
    handler: str
    """The handler's `module.qualname`, or `<decode>`, `<dedupe>`, `<dead-letter>`."""
    error: BaseException
    attempt: int
    """1-based; for handler failures, at most the retry policy's `attempts`."""
    final: bool
    """True when no retry follows: the event goes to the dead-letter topic next."""

    @property
    def event_id(self) -> str | None:
        """The event's id, else the record's `ce_id` header, else None."""
        return self.event.id if self.event is not None else self.context.header("ce_id")


OnError = Callable[[Failure], Awaitable[None] | None]
"""`on_error`: called (and awaited, if it returns an awaitable) for every failure."""


def log_failure(failure: Failure) -> None:
    """The default `on_error`: one log record naming the event id and the handler; the
    traceback with the first attempt only, so that each retry is one line."""
    context = failure.context
    outcome = "dead-lettering it" if failure.final else "will retry"
    traceback = failure.error if failure.attempt == 1 else None
    try:
        message = str(failure.error)
    except Exception as exc:
        message = f"<str() of the exception raised {type(exc).__name__}>"
    # The id and the message may be a record's text: quoted / escaped, one line each.
    logger.error(
        "event %r (%s[%d]@%d, key %r) failed in %s, attempt %d: %s: %s; %s",
        failure.event_id,
        context.topic,
        context.partition,
        context.offset,
        context.key,
        failure.handler,
        failure.attempt,
        type(failure.error).__name__,
        printable(message),
        outcome,
        exc_info=traceback,
    )
