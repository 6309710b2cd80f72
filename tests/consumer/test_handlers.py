"""Handlers run one at a time per event, in registration order, with the Kafka context."""

from __future__ import annotations

import asyncio

import pytest
from consumer_support import (
    create_topics,
    event,
    produce_aborted,
    produce_events,
    run_until,
    unique,
)

from fileevents import EventContext, FileEvent, FileEvents, Outcome


@pytest.mark.kafka
def test_handlers_run_in_registration_order_with_star_in_its_place(
    kafka_bootstrap: str,
) -> None:
    topic, group = unique("events"), unique("group")
    created = [event("photos/a b.jpg", 1), event("docs/x", 2)]
    deleted = [event("photos/a b.jpg", 3, "deleted")]
    calls: list[tuple[str, str]] = []
    in_flight: dict[str, str] = {}  # object key -> the handler running for it
    overlaps: list[str] = []
    contexts: dict[str, EventContext] = {}

    events = FileEvents(
        bootstrap_servers=kafka_bootstrap, topic=topic, group_id=group, handle_signals=False
    )

    async def track(name: str, item: FileEvent) -> None:
        if item.key in in_flight:  # one key: one handler of one event at a time
            overlaps.append(f"{name} started while {in_flight[item.key]} ran on {item.key}")
        in_flight[item.key] = name
        await asyncio.sleep(0)  # give anything that could interleave the chance to
        calls.append((name, item.id))
        del in_flight[item.key]

    @events.on("created")
    async def first(item: FileEvent) -> None:
        await track("first", item)

    @events.on("*")
    async def every(item: FileEvent, context: EventContext) -> None:
        contexts[item.id] = context
        await track("every", item)

    @events.on("deleted")
    async def on_deleted(item: FileEvent) -> None:
        await track("on_deleted", item)

    @events.on("created")
    async def last(item: FileEvent) -> None:
        await track("last", item)

    async def scenario() -> list[int]:
        await create_topics(kafka_bootstrap, (topic, 3))
        # An aborted transaction's events are never read (read_committed).
        await produce_aborted(kafka_bootstrap, topic, [event("photos/a b.jpg", 0)])
        sent = await produce_events(kafka_bootstrap, topic, [*created, *deleted])
        await run_until(events, lambda: len(calls) == 8, "8 handler calls")
        return [metadata.offset for metadata in sent]

    offsets = asyncio.run(scenario())

    by_event: dict[str, list[str]] = {}
    for name, event_id in calls:
        by_event.setdefault(event_id, []).append(name)
    for item in created:
        assert by_event[item.id] == ["first", "every", "last"]
    assert by_event[deleted[0].id] == ["every", "on_deleted"]
    assert "s3:photos/a b.jpg:0" not in by_event, "an aborted event was handled"
    assert overlaps == []
    assert calls.index(("every", created[0].id)) < calls.index(("every", deleted[0].id))
    assert events.outcomes[Outcome.HANDLED.value] == 3

    context = contexts[deleted[0].id]
    assert context.topic == topic
    assert context.key == "photos/a b.jpg"
    assert context.offset == offsets[2]
    assert context.header("ce_id") == deleted[0].id
    assert context.header("ce_type") == "storage.object.deleted"
    assert context.group_id == group
    assert context.attempt == 1
    assert FileEvent.model_validate_json(context.value or b"") == deleted[0]
    assert context.partition == contexts[created[0].id].partition  # one key, one partition


def test_registration_rejects_what_cannot_work() -> None:
    events = FileEvents(bootstrap_servers="127.0.0.1:1", instance="uploads", group_id="g")
    assert events.topic == "files.events.uploads"
    assert events.dead_letter_topic == "files.events.uploads.dead-letter"

    def not_async(item: FileEvent) -> None: ...

    with pytest.raises(TypeError, match="async def"):
        events.on("created")(not_async)  # type: ignore[type-var]

    async def handler(item: FileEvent) -> None: ...

    with pytest.raises(ValueError, match="expected one of"):
        events.on("updated")(handler)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fixed by FileEvents"):
        FileEvents(
            bootstrap_servers="x",
            instance="i",
            group_id="g",
            consumer_config={"enable_auto_commit": True},
        )
    with pytest.raises(RuntimeError, match="no handler"):
        asyncio.run(events.run())
