"""Fault injection for crash tests; off unless `STREAMS_FAILPOINT` is set.

`STREAMS_FAILPOINT=<point>:<n>` makes the worker kill itself with SIGKILL the n-th time it
reaches `<point>`, so that a test can crash it exactly where a guarantee is at stake:

* `after-output`: a batch's output records are acknowledged by Kafka (or its transaction
  committed), its state and input offsets are not yet recorded.
* `stage-process-start`: a stage child process (`stream.stage_processes = 2`) has its
  settings and has not started its clients yet.

`STREAMS_UNWRITABLE_TOPIC=<topic>` makes every write of the worker that includes a record for
`<topic>` fail as if Kafka were away (FailpointError, which the producers turn into
librdkafka's _TRANSPORT error), for as long as the process runs: a stage that cannot make
progress, without stopping a broker others use.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable


class FailpointError(Exception):
    """A write refused by STREAMS_UNWRITABLE_TOPIC (the producers report it as librdkafka's
    _TRANSPORT error: Kafka away)."""


_spec = os.environ.get("STREAMS_FAILPOINT", "")
_point, _, _count = _spec.partition(":")
_remaining = int(_count) if _count.isdigit() else 1
_hits = 0
_unwritable = os.environ.get("STREAMS_UNWRITABLE_TOPIC", "")


def reached(point: str) -> None:
    """Kill this process if `point` is the configured failpoint and its count is reached."""
    global _hits
    if not _spec or point != _point:
        return
    _hits += 1
    if _hits >= _remaining:
        os.kill(os.getpid(), signal.SIGKILL)


def check_writable(topics: Iterable[str]) -> None:
    """Raise FailpointError if `topics` holds the topic made unwritable."""
    if _unwritable and _unwritable in topics:
        raise FailpointError(f"failpoint: topic {_unwritable} is unwritable")
