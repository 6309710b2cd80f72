"""A failing event is retried with backoff, then dead-lettered, then the partition moves on."""

from __future__ import annotations

import asyncio
import logging
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
from support.kafka_io import Read, read_topic

from fileevents import (
    EventContext,
    Failure,
    FileEvent,
    FileEvents,
    Outcome,
    RetryPolicy,
    log_failure,
)

KEY = "inbox/report.pdf"


@pytest.mark.kafka
def test_retries_then_dead_letter_then_next_event(kafka_bootstrap: str) -> None:
    topic, group = unique("events"), unique("group")
    before, poison, flaky, after = (event(KEY, seq) for seq in range(4))
    garbage = (KEY, b"{not json")
    calls: list[tuple[str, str]] = []
    failures: list[Failure] = []
    flaky_failures_left = [2]

    events = FileEvents(
        bootstrap_servers=kafka_bootstrap,
        topic=topic,
        group_id=group,
        retry=RetryPolicy(
            attempts=3,
            initial_backoff=timedelta(milliseconds=20),
            max_backoff=timedelta(milliseconds=50),
        ),
        on_error=failures.append,
        commit_interval=timedelta(milliseconds=50),
        handle_signals=False,
    )

    @events.on("*")
    async def audit(item: FileEvent) -> None:
        calls.append(("audit", item.id))

    @events.on("created")
    async def convert(item: FileEvent) -> None:
        calls.append(("convert", item.id))
        if item.id == poison.id:
            raise RuntimeError("cannot convert this one")
        if item.id == flaky.id and flaky_failures_left[0]:
            flaky_failures_left[0] -= 1
            raise ConnectionError("converter busy")

    async def scenario() -> tuple[list[Read], dict[int, int], dict[int, int], int]:
        await create_topics(kafka_bootstrap, (topic, 2), (events.dead_letter_topic, 1))
        sent = await produce_events(kafka_bootstrap, topic, [before, poison, garbage, flaky, after])
        await run_until(events, lambda: ("convert", after.id) in calls, "the event after")
        dead = await read_topic(kafka_bootstrap, events.dead_letter_topic)
        return (
            dead,
            await committed(kafka_bootstrap, group, topic),
            await end_offsets(kafka_bootstrap, topic),
            sent[0].partition,
        )

    dead, commits, ends, partition = asyncio.run(scenario())

    # The poison event: audit once (a retry resumes at the failing handler), convert 3 times.
    assert calls == [
        ("audit", before.id),
        ("convert", before.id),
        ("audit", poison.id),
        ("convert", poison.id),
        ("convert", poison.id),
        ("convert", poison.id),
        ("audit", flaky.id),
        ("convert", flaky.id),
        ("convert", flaky.id),
        ("convert", flaky.id),
        ("audit", after.id),
        ("convert", after.id),
    ]
    convert_name = f"{__name__}.test_retries_then_dead_letter_then_next_event.convert"
    report = [(f.event_id, f.handler, f.attempt, f.final) for f in failures]
    assert report == [
        (poison.id, convert_name, 1, False),
        (poison.id, convert_name, 2, False),
        (poison.id, convert_name, 3, True),
        (None, "<decode>", 1, True),
        (flaky.id, convert_name, 1, False),
        (flaky.id, convert_name, 2, False),
    ]
    assert isinstance(failures[0].error, RuntimeError)
    assert failures[0].context.attempt == 1 and failures[2].context.attempt == 3

    # Both dead letters: bytes and headers as read, plus what went wrong where.
    assert [read.value for read in dead] == [poison.model_dump_json().encode(), garbage[1]]
    poisoned, undecodable = dead
    assert poisoned.key == KEY.encode()
    assert poisoned.headers["ce_id"] == poison.id.encode()
    assert poisoned.headers["ce_type"] == b"storage.object.created"
    assert poisoned.headers["error"] == b"RuntimeError: cannot convert this one"
    assert poisoned.headers["handler"] == convert_name.encode()
    assert poisoned.headers["attempts"] == b"3"
    assert poisoned.headers["group"] == group.encode()
    assert poisoned.headers["original.topic"] == topic.encode()
    assert poisoned.headers["original.partition"] == str(partition).encode()
    assert undecodable.headers["handler"] == b"<decode>"
    assert undecodable.headers["error"].startswith(
        b"EventDecodeError: the record value is not JSON"
    )

    # Everything is committed: the partition moved past both, nothing skipped silently.
    assert commits == {p: end for p, end in ends.items() if end > 0}
    assert events.outcomes == {
        Outcome.HANDLED.value: 3,
        Outcome.DEAD_LETTERED.value: 2,
    }


def test_the_default_on_error_logs_the_event_id_and_the_handler(
    caplog: pytest.LogCaptureFixture,
) -> None:
    item = event(KEY, 7)
    context = EventContext("files.events.x", 2, 41, KEY, b"{}", (), 0, "g", attempt=2)
    failure = Failure(item, context, "app.handlers.index", ValueError("bad"), 2, final=True)
    with caplog.at_level(logging.ERROR, logger="fileevents"):
        log_failure(failure)
    [logged] = caplog.records
    message = logged.getMessage()
    assert item.id in message and "app.handlers.index" in message
    assert "dead-lettering" in message and "ValueError: bad" in message
    assert logged.exc_info is None  # a retry is one line: the first attempt had the traceback
    first = Failure(item, context, "app.handlers.index", ValueError("bad"), 1, final=False)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="fileevents"):
        log_failure(first)
    [logged] = caplog.records
    assert "will retry" in logged.getMessage()
    assert logged.exc_info is not None and logged.exc_info[1] is first.error


def test_the_default_on_error_writes_an_id_and_a_message_forging_lines_escaped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 31, item 3: an event id (a B2 `eventId` the stream passes on) and an error
    message holding a line break and a line in a log format stay on the failure's line."""
    forged = "[2026-12-07 03:00:00,000] [1] [CRITICAL] FORGED ok"
    item = event(KEY, 7, id_=f"b2-id\n{forged}")
    context = EventContext("files.events.x", 2, 41, KEY, b"{}", (), 0, "g", attempt=2)
    error = ValueError(f"no such row\r\n{forged}")
    with caplog.at_level(logging.ERROR, logger="fileevents"):
        log_failure(Failure(item, context, "app.handlers.index", error, 2, final=True))
    [logged] = caplog.records
    message = logged.getMessage()
    assert message.splitlines() == [message], message
    assert f"event 'b2-id\\n{forged}'" in message
    assert f"ValueError: no such row\\r\\n{forged}" in message
