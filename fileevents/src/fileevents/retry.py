"""How often and how patiently a failing event is retried before it is dead-lettered."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff, bounded in attempts and in the longest wait.

    `attempts` counts every run of the event, the first included: with 5, a failing event is
    run once and retried 4 times, waiting 0.2, 0.4, 0.8 and 1.6 s (never more than
    `max_backoff`), then dead-lettered.
    """

    attempts: int = 5
    initial_backoff: timedelta = timedelta(milliseconds=200)
    max_backoff: timedelta = timedelta(seconds=10)
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts must be at least 1")
        if self.initial_backoff < timedelta(0) or self.max_backoff < self.initial_backoff:
            raise ValueError("RetryPolicy needs 0 <= initial_backoff <= max_backoff")
        if self.multiplier < 1:
            raise ValueError("RetryPolicy.multiplier must be at least 1")

    def backoff(self, failures: int) -> float:
        """Seconds to wait after the `failures`-th failure in a row (1-based)."""
        initial = self.initial_backoff.total_seconds()
        ceiling = self.max_backoff.total_seconds()
        exponent = min(max(failures - 1, 0), 64)  # past 2**64 the ceiling won long ago
        return float(min(ceiling, initial * self.multiplier**exponent))
