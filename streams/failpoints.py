"""Fault injection for crash tests; off unless `STREAMS_FAILPOINT` is set.

`STREAMS_FAILPOINT=<point>:<n>` makes the worker kill itself with SIGKILL the n-th time it
reaches `<point>`, so that a test can crash it exactly where a guarantee is at stake:

* `after-output`: a batch's output records are acknowledged by Kafka (or its transaction
  committed), its state and input offsets are not yet recorded.
"""

from __future__ import annotations

import os
import signal

_spec = os.environ.get("STREAMS_FAILPOINT", "")
_point, _, _count = _spec.partition(":")
_remaining = int(_count) if _count.isdigit() else 1
_hits = 0


def reached(point: str) -> None:
    """Kill this process if `point` is the configured failpoint and its count is reached."""
    global _hits
    if not _spec or point != _point:
        return
    _hits += 1
    if _hits >= _remaining:
        os.kill(os.getpid(), signal.SIGKILL)
