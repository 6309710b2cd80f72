"""A handler that runs past its timeout is cancelled and fails like any other failure:
retried, then dead-lettered, then the partition goes on (real broker). The timeout is set
per handler (`on(..., timeout=)`) or for all (`handler_timeout`)."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

import pytest
from consumer_support import (
    committed,
    create_topics,
    end_offsets,
    event,
    produce_events,
    run_until,
    unique,
)
from support.kafka_io import read_topic

from fileevents import Failure, FileEvent, FileEvents, HandlerTimeout, RetryPolicy

KEY = "videos/intro.mp4"
RETRY = RetryPolicy(attempts=2, initial_backoff=timedelta(milliseconds=10))


def consumer(bootstrap: str, topic: str, failures: list[Failure], **extra: object) -> FileEvents:
    return FileEvents(
        bootstrap_servers=bootstrap,
        topic=topic,
        group_id=unique("group"),
        retry=RETRY,
        on_error=failures.append,
        commit_interval=timedelta(milliseconds=50),
        handle_signals=False,
        **extra,  # type: ignore[arg-type]
    )


@pytest.mark.kafka
def test_a_hanging_handler_is_timed_out_retried_dead_lettered_and_the_next_event_handled(
    kafka_bootstrap: str,
) -> None:
    topic = unique("events")
    hangs, after = event(KEY, 1), event(KEY, 2)
    failures: list[Failure] = []
    events = consumer(kafka_bootstrap, topic, failures)
    started: list[str] = []
    cancelled: list[str] = []
    handled: list[str] = []

    @events.on("created", timeout=timedelta(milliseconds=300))
    async def transcode(item: FileEvent) -> None:
        started.append(item.id)
        if item.id == hangs.id:
            try:
                await asyncio.Event().wait()  # a call that never answers
            except asyncio.CancelledError:
                cancelled.append(item.id)
                raise
        handled.append(item.id)

    async def scenario() -> None:
        await create_topics(kafka_bootstrap, (topic, 1), (events.dead_letter_topic, 1))
        await produce_events(kafka_bootstrap, topic, [hangs, after])
        await run_until(events, lambda: after.id in handled, "the event after the hanging one")

    asyncio.run(scenario())
    assert started == [hangs.id, hangs.id, after.id]  # run, retried once, then the next one
    assert cancelled == [hangs.id, hangs.id]  # each run was cancelled, not left running
    assert [(f.event_id, f.attempt, f.final) for f in failures] == [
        (hangs.id, 1, False),
        (hangs.id, 2, True),
    ]
    assert all(isinstance(f.error, HandlerTimeout) for f in failures), failures
    test = test_a_hanging_handler_is_timed_out_retried_dead_lettered_and_the_next_event_handled
    name = f"{__name__}.{test.__name__}.transcode"
    assert str(failures[0].error) == f"{name} did not finish within 0.3 s: cancelled"

    dead = asyncio.run(read_topic(kafka_bootstrap, events.dead_letter_topic))
    assert [read.value for read in dead] == [hangs.model_dump_json().encode()]
    assert dead[0].headers["error"] == f"HandlerTimeout: {failures[0].error}".encode()
    assert dead[0].headers["attempts"] == b"2"
    commits = asyncio.run(committed(kafka_bootstrap, events.group_id, topic))
    assert commits == asyncio.run(end_offsets(kafka_bootstrap, topic)) == {0: 2}
    assert events.outcomes == {"dead_lettered": 1, "handled": 1}
    labels = {"topic": topic, "group": events.group_id, "handler": name}
    registry = events.metrics.registry()
    assert registry.get_sample_value("fileevents_timed_out_total", labels) == 2
    assert registry.get_sample_value("fileevents_failed_total", labels) == 2
    assert registry.get_sample_value("fileevents_handled_total", labels) == 1


@pytest.mark.kafka
def test_the_default_timeout_applies_and_a_handlers_own_timeout_wins(
    kafka_bootstrap: str,
) -> None:
    """`handler_timeout` 200 ms for all; `slow_but_allowed` has 5 s of its own and takes
    400 ms: it succeeds. `swallows` ignores its cancellation and returns late: still a
    timeout, because the run took longer than allowed."""
    topic = unique("events")
    only = event(KEY, 3)
    failures: list[Failure] = []
    events = consumer(kafka_bootstrap, topic, failures, handler_timeout=timedelta(milliseconds=200))
    finished: list[str] = []

    @events.on("*", timeout=timedelta(seconds=5))
    async def slow_but_allowed(item: FileEvent) -> None:
        await asyncio.sleep(0.4)
        finished.append("slow_but_allowed")

    @events.on("*")
    async def swallows(item: FileEvent) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # it will not be cancelled
            await asyncio.sleep(10)
        finished.append("swallows")

    async def scenario() -> None:
        await create_topics(kafka_bootstrap, (topic, 1), (events.dead_letter_topic, 1))
        await produce_events(kafka_bootstrap, topic, [only])
        await run_until(events, lambda: events.outcomes.total() == 1, "the event done with")

    asyncio.run(scenario())
    # A retry resumes at the failing handler: slow_but_allowed ran once, swallows twice.
    assert finished == ["slow_but_allowed", "swallows", "swallows"]
    assert events.outcomes == {"dead_lettered": 1}
    assert [type(f.error) for f in failures] == [HandlerTimeout, HandlerTimeout]
    assert "within 0.2 s" in str(failures[0].error)
    assert failures[0].handler.endswith(".swallows")
    assert "<locals>" not in failures[0].handler


def test_timeouts_are_checked_when_registered() -> None:
    events = FileEvents(bootstrap_servers="x:9092", topic="t", group_id="g")
    with pytest.raises(ValueError, match=r"on\('created', timeout=\.\.\.\): must be positive"):
        events.on("created", timeout=timedelta(0))
    with pytest.raises(TypeError, match=r"expected a datetime\.timedelta, got int"):
        events.on("*", timeout=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="handler_timeout: must be positive"):
        FileEvents(
            bootstrap_servers="x:9092",
            topic="t",
            group_id="g",
            handler_timeout=timedelta(seconds=-1),
        )
    assert events.handler_timeout == timedelta(seconds=60)  # the default: under 300 s polls
