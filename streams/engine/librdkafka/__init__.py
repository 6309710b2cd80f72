"""The librdkafka engine: the Kafka-facing shell of the stages.

The stages' decisions (normalize, route, plan, order) are the stage runners' (streams.stages);
this package only moves records between Kafka and them:

* `consumer.RdBatchLoop`: a stage's group member (confluent_kafka.Consumer, KIP-848 or
  classic cooperative-sticky), incremental assignments, batches handed to the event loop;
* `producer.RdRecordSender`: the idempotent producers: stage one's, which reports only
  failures, and the emit stage's (at_least_once writes, the sweep);
* `transactions.MemberTransactions`: exactly-once v2 (KIP-447), one transactional producer
  per emit member, offsets sent with the consumer's group metadata.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from typing import Any

from streams.logs import EVERY_S, demote

LIBRDKAFKA_LOGGER = "streams.engine.librdkafka"
_VARYING = re.compile(
    r"\[[^\]\s]*#(?:producer|consumer)-\d+\]"  # the client: [<client.id>#consumer-2]
    r"|\[thrd:[^\]]*\]"  # the librdkafka thread
    r"|(?<=: )[^\s:]+(?::\d+)?/(?:bootstrap|\d+): "  # the broker handle: 127.0.0.1:9092/1:
    r"|(?<=: )(?:Group|Txn)Coordinator(?:: [^\s:]+:\d+)?: "  # a coordinator's handle
    r"|\(after \d+ms in state \w+(?:, \d+ identical error\(s\) suppressed)?\)"  # timings
)
"""What differs between lines of one cause: several clients (sender, consumers, transactional
producers) and threads each report a broker away in their own words."""
MAX_LINES = 1000
"""Distinct lines remembered for the repeat filter."""


def cause_of(line: str) -> str:
    """A librdkafka line without what varies between clients, threads and reconnects."""
    return _VARYING.sub("", line)


class _LineRepeatFilter(logging.Filter):
    """streams.logs.RepeatFilter's policy by the line's cause (`cause_of`): confluent-kafka
    logs every librdkafka line through one template (`"%s [%s] %s"`), so the template says
    nothing; and librdkafka logs from several threads at once (hence the lock)."""

    def __init__(self, every_s: float = EVERY_S) -> None:
        super().__init__()
        self.every_s = every_s
        self._seen: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a malformed record is not ours to fix
            return True
        if not demote(record):
            return False
        now = time.monotonic()
        cause = cause_of(text)
        with self._lock:
            passed_at, dropped = self._seen.get(cause, (-self.every_s, 0))
            if now - passed_at < self.every_s:
                self._seen[cause] = (passed_at, dropped + 1)
                return False
            if len(self._seen) >= MAX_LINES:  # lines with timings in them never repeat
                self._seen.clear()
            self._seen[cause] = (now, 0)
        if dropped:
            text = f"{text} (and {dropped} more like it in {now - passed_at:.0f} s)"
        record.msg, record.args = text, ()
        return True


def settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """Resolve `future` (on its loop, from a callback a client's thread scheduled there) with
    `result` or `error`, unless it is done already (cancelled, or timed out)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def librdkafka_log() -> logging.Logger:
    """The logger every librdkafka client of the engine logs to (its `logger` property): one
    line per cause every few seconds while Kafka is away (streams.logs.RepeatFilter), not
    one per reconnect of every client."""
    logger = logging.getLogger(LIBRDKAFKA_LOGGER)
    if not any(isinstance(existing, _LineRepeatFilter) for existing in logger.filters):
        logger.addFilter(_LineRepeatFilter())
    return logger
