"""One log line per cause every few seconds, not one per retry, from the Kafka client.

While Kafka is away, aiokafka logs every attempt of every client: "Unable connect to node",
"Unable to update metadata", "Group Coordinator Request failed", "Failed fetch messages",
thousands of ERROR lines a minute for one outage. `RepeatFilter` lets the first record of a
logger and message template through, drops its repeats for `every_s` seconds, and lets the
next one through with how many it dropped ("(and 212 more like it in 5 s)"). Records that
differ only in their arguments (a node id, a group, a transactional id) are one cause.

Retriable start-up noise is demoted (`demote`): while a broker loads a group's or a
transaction's coordinator partition it answers GroupCoordinatorNotAvailable or "Coordinator
load in progress", and a client marks the coordinator dead to look it up again; a normal
start, not a warning, so these lines are logged at INFO. A real outage is still visible: in
the other lines, and on the worker's `/ready` and the bridges' `/healthz`.

`install_kafka_log_filter()` puts one filter on every logger of the Kafka client libraries
(a logger's filters see the records logged on it, whatever handlers the process configured:
Faust's for the worker, `logging.basicConfig` for the bridges).

Input in a log line (a header value, an object key, a reason quoting them) goes through
`printable` (or `%r`): a line break, a carriage return or an escape code in it is written as
`\\n`, `\\r`, `\\x1b`, so that whoever writes the input can neither end the worker's or a
bridge's log line nor forge the next one in its format (issue 31).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from fileevents.event import printable as printable  # the contract's, shared with fileevents

KAFKA_LOGGERS = ("aiokafka", "faust.transport")
"""Logger name prefixes the filter is installed on."""
EVERY_S = 5.0
DEMOTED = (
    "GroupCoordinatorNotAvailableError",
    "Marking the coordinator dead",
    "Coordinator load in progress",
)
"""Retriable states that are part of a normal start: logged at INFO, not WARNING or ERROR."""


@dataclass(slots=True)
class _Seen:
    passed_at: float
    dropped: int = 0


class RepeatFilter(logging.Filter):
    """Collapse repeats per (logger, message template) to one record every `every_s`."""

    def __init__(
        self, every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.every_s = every_s
        self._clock = clock
        self._seen: dict[tuple[str, str], _Seen] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not demote(record):
            return False
        key = (record.name, str(record.msg))
        now = self._clock()
        seen = self._seen.get(key)
        if seen is not None and now - seen.passed_at < self.every_s:
            seen.dropped += 1
            return False
        if seen is not None and seen.dropped:
            record.msg = f"{record.msg} (and %d more like it in %.0f s)"
            args = record.args if isinstance(record.args, tuple) else (record.args,)
            record.args = (
                *(args if record.args is not None else ()),
                seen.dropped,
                now - seen.passed_at,
            )
        self._seen[key] = _Seen(now)
        return True


def demote(record: logging.LogRecord) -> bool:
    """A WARNING or ERROR `record` naming a DEMOTED state, at INFO instead (in place); False
    if that puts it below its logger's level (so a filter drops it: the logger let it through
    at its first level, and handlers usually take every level)."""
    if record.levelno < logging.WARNING or record.levelno > logging.ERROR:
        return True
    try:
        text = record.getMessage()
    except Exception:  # a malformed record is not ours to fix
        return True
    if not any(name in text for name in DEMOTED):
        return True
    record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
    return logging.getLogger(record.name).isEnabledFor(logging.INFO)


def install_kafka_log_filter(
    prefixes: Iterable[str] = KAFKA_LOGGERS, every_s: float = EVERY_S
) -> RepeatFilter:
    """Put one RepeatFilter on every logger under `prefixes` (importing aiokafka first, so
    that its module loggers exist); idempotent. Returns the filter."""
    # Importing them creates their module loggers (aiokafka.client logs as "aiokafka").
    import aiokafka
    import aiokafka.admin
    import aiokafka.helpers  # noqa: F401

    prefixes = tuple(prefixes)
    manager = logging.Logger.manager
    names = [
        name
        for name in list(manager.loggerDict)
        if any(name == prefix or name.startswith(f"{prefix}.") for prefix in prefixes)
    ]
    installed: RepeatFilter | None = None
    for name in sorted({*names, *prefixes}):
        logger = logging.getLogger(name)
        existing = next((f for f in logger.filters if isinstance(f, RepeatFilter)), None)
        if existing is not None:
            installed = installed or existing
            continue
        installed = installed or RepeatFilter(every_s)
        logger.addFilter(installed)
    assert installed is not None
    return installed


ESCAPE_CODE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
"""ANSI escape sequences (colours, cursor moves) that Faust's coloured formatter writes."""


class PlainFormatter(logging.Formatter):
    """Another formatter's lines without terminal escape codes: a log file or a pipe gets
    text, not `\\x1b[33m`."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        return ESCAPE_CODE.sub("", self.inner.format(record))


def plain_unless_terminal(logger: logging.Logger | None = None) -> int:
    """Make every stream handler of `logger` (default: the root logger) that does not write to
    a terminal write without escape codes; how many it changed. Call it once logging is set
    up (the worker: after Faust configured its handlers)."""
    changed = 0
    for handler in (logger or logging.getLogger()).handlers:
        if not isinstance(handler, logging.StreamHandler):
            continue
        stream = getattr(handler, "stream", None)
        isatty = getattr(stream, "isatty", None)
        if (isatty is not None and isatty()) or isinstance(handler.formatter, PlainFormatter):
            continue
        handler.setFormatter(PlainFormatter(handler.formatter or logging.Formatter()))
        changed += 1
    return changed
