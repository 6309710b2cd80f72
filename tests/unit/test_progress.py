"""streams.progress: a stage's trouble is logged once every few seconds per cause (not once
per retry), shows on /ready once it lasts, clears when the stage moves again; stopping ends
the waits between retries."""

from __future__ import annotations

import asyncio
import logging

import pytest

from streams.progress import LOG_EVERY_S, STUCK_AFTER_S, Progress, Stopping


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_cause_is_logged_once_per_interval_with_its_repeats(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    progress = Progress(clock)
    with caplog.at_level(logging.WARNING, "streams.progress"):
        for _ in range(50):  # 50 retries in 4 s
            progress.trouble("emit", "KafkaConnectionError", "Kafka away")
            clock.now += 0.08
        progress.trouble("emit", "other", "another cause")  # its own line
        clock.now += LOG_EVERY_S
        progress.trouble("emit", "KafkaConnectionError", "Kafka away")
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "emit stage cannot make progress: Kafka away",
        "emit stage cannot make progress: another cause",
        "emit stage cannot make progress: Kafka away (and 49 more times in 9 s)",
    ]


def test_a_stage_is_reported_stuck_only_once_its_trouble_lasts() -> None:
    clock = Clock()
    progress = Progress(clock)
    progress.trouble("normalize", "x", "first")
    assert progress.stuck() == {}
    clock.now += STUCK_AFTER_S
    progress.trouble("normalize", "y", "latest why")
    assert progress.stuck() == {"normalize": {"why": "latest why", "for_s": STUCK_AFTER_S}}
    progress.recovered("normalize")
    assert progress.stuck() == {}


def test_stopping_ends_the_pause_between_two_attempts() -> None:
    progress = Progress()

    async def scenario() -> None:
        progress.stop()
        with pytest.raises(Stopping):
            await progress.pause(60)

    asyncio.run(asyncio.wait_for(scenario(), 5))


def test_a_stage_is_stuck_while_any_of_its_writes_is() -> None:
    clock = Clock()
    progress = Progress(clock)
    progress.trouble("emit", "away", "partition 0 waits", who=0)
    clock.now += STUCK_AFTER_S
    progress.recovered("emit", who=1)  # another partition's write went through
    assert progress.stuck() == {"emit": {"why": "partition 0 waits", "for_s": STUCK_AFTER_S}}
    progress.recovered("emit", who=0)
    assert progress.stuck() == {}
