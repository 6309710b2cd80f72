"""`asyncio.wait_for`'s timeout on every supported Python: on 3.10 it raises asyncio's own
`TimeoutError`, which is not the built-in one. The library's waits (a retry's backoff, the
dedupe store's start-up check) must take either, or a retry's backoff ends `run()` there."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta

import pytest

from fileevents.dedupe import DedupeStoreUnavailable, check_store
from fileevents.processing import EventProcessor


def test_a_backoff_that_runs_out_returns() -> None:
    async def back_off() -> None:
        await EventProcessor._wait(0.01, asyncio.Event())

    asyncio.run(back_off())  # raised asyncio.TimeoutError on Python 3.10


def test_a_store_that_does_not_answer_is_said_so() -> None:
    class Silent:
        async def has_many(self, event_ids: Sequence[str]) -> list[bool]:
            await asyncio.sleep(60)
            return [False] * len(event_ids)

        async def add_many(self, event_ids: Sequence[str], ttl: timedelta) -> None:
            return None

    with pytest.raises(DedupeStoreUnavailable, match=r"no answer within 0\.05 s"):
        asyncio.run(check_store(Silent(), timeout_s=0.05))
