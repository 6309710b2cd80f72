"""Hostile records on an output topic, written as an attacker with write access to it would.

For each kind of record: the attack (the hostile record, then a good event), what lands on
the dead-letter topic (the record's own key, value and headers, byte for byte, plus the
reason), what the handlers see (never the hostile record, only valid Unicode), the
committed offsets (past both), and a restart of the group with a control event after the
attack that is handled while the hostile record is not met again.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import ConsumerRecord
from confluent_kafka import Producer
from consumer_support import (
    NullableHeader,
    ce_headers,
    committed,
    create_topics,
    end_offsets,
    event,
    eventually,
    produce_records,
    read_records,
    run_until,
    unique,
)
from support.kafka_io import write_header_name

from fileevents import EventContext, Failure, FileEvent, FileEvents, Outcome, RetryPolicy
from fileevents.codec import MAX_DEPTH, decode_event
from fileevents.deadletter import MAX_HEADER_TEXT_BYTES, MAX_OMITTED_KEY_BYTES

pytestmark = pytest.mark.kafka

KEY = "inbox/report.pdf"
HOSTILE = event(KEY, 0, id_="hostile")
GOOD = event(KEY, 1)
CONTROL = event(KEY, 2)
HEADERS: tuple[NullableHeader, ...] = tuple(ce_headers(HOSTILE))
OUR_HEADERS = (
    "error",
    "handler",
    "attempts",
    "group",
    "original.topic",
    "original.partition",
    "original.offset",
)


def document(**fields: str) -> bytes:
    """The hostile event's JSON with the given fields' JSON text put in verbatim (added
    when the event has no such field): what no JSON encoder of ours would write."""
    texts = {name: json.dumps(value) for name, value in HOSTILE.model_dump(mode="json").items()}
    texts.update(fields)
    return (
        "{" + ",".join(f"{json.dumps(name)}:{text}" for name, text in texts.items()) + "}"
    ).encode()


def nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


@dataclass(frozen=True)
class Attack:
    """One hostile record and what must become of it."""

    value: bytes | None
    key: bytes | None = KEY.encode()
    headers: tuple[NullableHeader, ...] = HEADERS
    reason: bytes = b""
    """Part of the dead letter's `error` header."""
    outcome: Outcome = Outcome.DEAD_LETTERED


ATTACKS: dict[str, Attack] = {
    # json.loads: ValueError (int digits limit); orjson: beyond a double's range.
    "integer-of-5000-digits": Attack(document(size="9" * 5000), reason=b"not JSON"),
    # json.loads: RecursionError; orjson: depth limit (1,024).
    "nested-100000-deep": Attack(
        document(raw="[" * 100_000 + "]" * 100_000), reason=b"not JSON: depth limit exceeded"
    ),
    # Parses, but deeper than any handler could serialise again.
    "nested-past-max-depth": Attack(
        document(raw=nested(MAX_DEPTH + 10)), reason=f"deeper than {MAX_DEPTH}".encode()
    ),
    "header-with-null-value": Attack(
        document(), headers=(*HEADERS, ("traceparent", None)), reason=b"has no value"
    ),
    "not-json": Attack(b"\x00\xff{not json", reason=b"not JSON"),
    "json-not-an-object": Attack(b'["created", "inbox/report.pdf"]', reason=b"not a JSON object"),
    "wrong-types": Attack(
        document(type='"modified"', size='"ten"', raw="[1]"), reason=b"not a canonical event"
    ),
    "missing-fields": Attack(b'{"type": "created", "key": "x"}', reason=b"not a canonical event"),
    "lone-surrogate-in-key": Attack(document(key='"inbox/\\ud800.pdf"'), reason=b"not JSON"),
    "lone-surrogate-in-id": Attack(document(id='"hostile-\\udfff"'), reason=b"not JSON"),
    "lone-surrogate-in-a-raw-name": Attack(document(raw='{"\\ud800": 1}'), reason=b"not JSON"),
    "invalid-utf8-in-a-string": Attack(
        document(bucket='"BUCKET"').replace(b"BUCKET", b"up\xff\xfeloads"), reason=b"not JSON"
    ),
    "record-key-not-utf8": Attack(document(), key=b"\xff\xfe" + KEY.encode(), reason=b"not UTF-8"),
    "record-key-an-encoded-surrogate": Attack(
        document(), key=b"inbox/\xed\xa0\x80.pdf", reason=b"not UTF-8"
    ),
    # A compacted topic's deletion marker: nothing to handle, nothing to keep.
    "tombstone": Attack(None, outcome=Outcome.TOMBSTONE),
    # A newer stream's field: ignored, so consumers keep working (fileevents/README.md).
    "unknown-fields": Attack(document(colour='"red"', extra=nested(5)), outcome=Outcome.HANDLED),
}


@dataclass
class Run:
    """What one attack did."""

    topic: str
    group: str
    dead_letter_topic: str
    hostile_offset: int
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)
    """(run, event id, context key) of every handler call."""
    failures: list[Failure] = field(default_factory=list)
    dead: list[ConsumerRecord[bytes, bytes]] = field(default_factory=list)
    dead_after_restart: list[ConsumerRecord[bytes, bytes]] = field(default_factory=list)
    commits: dict[int, int] = field(default_factory=dict)
    ends: dict[int, int] = field(default_factory=dict)
    outcomes: list[dict[str, int]] = field(default_factory=list)


def record_of(item: FileEvent) -> tuple[bytes, bytes, Sequence[NullableHeader]]:
    return item.key.encode(), item.model_dump_json().encode(), ce_headers(item)


def consumer(bootstrap: str, topic: str, group: str, failures: list[Failure]) -> FileEvents:
    return FileEvents(
        bootstrap_servers=bootstrap,
        topic=topic,
        group_id=group,
        retry=RetryPolicy(
            attempts=2,
            initial_backoff=timedelta(milliseconds=10),
            max_backoff=timedelta(milliseconds=20),
        ),
        on_error=failures.append,
        commit_interval=timedelta(milliseconds=50),
        handle_signals=False,
    )


async def attack(
    bootstrap: str,
    hostile: tuple[bytes | None, bytes | None, Sequence[NullableHeader]] | None,
    misbehave: Callable[[], Awaitable[None]] | None = None,
    topic_config: dict[str, str] | None = None,
    write_hostile: Callable[[str], int] | None = None,
) -> Run:
    """Produce `hostile`, then a good event; run a consumer until the good one is handled;
    then restart the group, produce a control event and run until that one is handled.
    `misbehave` is what the handler does for the event `hostile` (when it is one)."""
    topic, group = unique("hostile"), unique("group")
    dead_letter_topic = f"{topic}.dead-letter"
    if topic_config is None:
        await create_topics(bootstrap, (topic, 1), (dead_letter_topic, 1))
    else:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics(
                [
                    NewTopic(topic, 1, 1, topic_configs=topic_config),
                    NewTopic(dead_letter_topic, 1, 1),
                ]
            )
        finally:
            await admin.close()
    if write_hostile is not None:
        hostile_offset = await asyncio.to_thread(write_hostile, topic)
        await produce_records(bootstrap, topic, [record_of(GOOD)])
    else:
        assert hostile is not None
        sent = await produce_records(
            bootstrap, topic, [hostile, record_of(GOOD)], max_request_size=4 * 1024 * 1024
        )
        hostile_offset = sent[0].offset
    run = Run(topic, group, dead_letter_topic, hostile_offset=hostile_offset)

    for name, until in (("first", GOOD.id), ("restart", CONTROL.id)):
        if name == "restart":
            await produce_records(bootstrap, topic, [record_of(CONTROL)])
        events = consumer(bootstrap, topic, group, run.failures)

        @events.on("*")
        async def handle(item: FileEvent, context: EventContext, name: str = name) -> None:
            run.seen.append((name, item.id, context.key))
            if misbehave is not None and item.id == HOSTILE.id:
                await misbehave()

        await run_until(
            events, lambda until=until: any(seen[1] == until for seen in run.seen), until
        )
        run.outcomes.append(dict(events.outcomes))
        if name == "first":
            run.dead = await read_records(bootstrap, dead_letter_topic)
            run.commits = await committed(bootstrap, group, topic)
            run.ends = await end_offsets(bootstrap, topic)
    run.dead_after_restart = await read_records(bootstrap, dead_letter_topic)
    return run


def dead_letter_fields(run: Run) -> tuple[ConsumerRecord[bytes, bytes], dict[str, bytes]]:
    """The one dead letter of the attack, and the headers the library added to it."""
    [dead] = run.dead
    added = dict(dead.headers[len(dead.headers) - len(OUR_HEADERS) :])
    assert list(added) == list(OUR_HEADERS)
    assert added["original.topic"] == run.topic.encode()
    assert added["original.partition"] == b"0"
    assert added["original.offset"] == str(run.hostile_offset).encode()
    assert added["group"] == run.group.encode()
    for value in added.values():
        value.decode("utf-8")  # whatever the record held, what we add is valid UTF-8
        assert len(value) <= MAX_HEADER_TEXT_BYTES
    return dead, added


def assert_moved_on(run: Run, handled_hostile: bool) -> None:
    """The good event after the attack was handled, the offsets are past both, and the
    restarted group met only the control event."""
    first = [(item_id, key) for name, item_id, key in run.seen if name == "first"]
    expected = [(HOSTILE.id, KEY)] if handled_hostile else []
    assert first == [*expected, (GOOD.id, KEY)]
    assert run.commits == {0: run.ends[0]} and run.ends[0] == run.hostile_offset + 2
    assert [(item_id, key) for name, item_id, key in run.seen if name == "restart"] == [
        (CONTROL.id, KEY)
    ]
    assert run.outcomes[1] == {Outcome.HANDLED.value: 1}
    assert [(r.offset, r.value) for r in run.dead_after_restart] == [
        (r.offset, r.value) for r in run.dead
    ]


@pytest.mark.parametrize("name", list(ATTACKS))
def test_a_hostile_record_is_dead_lettered_and_the_next_one_handled(
    kafka_bootstrap: str, name: str
) -> None:
    case = ATTACKS[name]
    run = asyncio.run(attack(kafka_bootstrap, (case.key, case.value, case.headers)))

    handled_hostile = case.outcome is Outcome.HANDLED
    assert_moved_on(run, handled_hostile)
    expected = Counter({Outcome.HANDLED.value: 1})
    expected[case.outcome.value] += 1
    assert run.outcomes[0] == expected
    if case.outcome is not Outcome.DEAD_LETTERED:
        assert run.dead == [] and run.failures == []
        return

    dead, added = dead_letter_fields(run)
    # The record itself, byte for byte: key, value, and its headers in order (null kept).
    assert dead.key == case.key
    assert dead.value == case.value
    assert list(dead.headers[: len(case.headers)]) == list(case.headers)
    assert len(dead.headers) == len(case.headers) + len(OUR_HEADERS)
    assert added["handler"] == b"<decode>" and added["attempts"] == b"1"
    assert added["error"].startswith(b"EventDecodeError: ")
    assert case.reason in added["error"], added["error"]
    # on_error heard of it once, as final, with nothing that is not valid Unicode.
    [failure] = run.failures
    assert (failure.event, failure.handler, failure.final) == (None, "<decode>", True)
    assert failure.context.offset == run.hostile_offset
    if failure.context.key is not None:
        failure.context.key.encode("utf-8")


# -- handlers that fail in hostile ways ---------------------------------------------------


class Abort(BaseException):
    """A BaseException that is not an exit or a cancellation (as test frameworks raise)."""


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


async def raise_surrogate_megabyte() -> None:
    raise ValueError("key \ud800 " + "x" * 2**20)


async def recurse_forever() -> None:
    def down(depth: int) -> int:
        return down(depth + 1) + 1

    down(0)


async def raise_base_exception() -> None:
    raise Abort("not an Exception")


async def raise_unprintable() -> None:
    raise Unprintable


async def leak_a_cancellation() -> None:
    raise asyncio.CancelledError("a future the handler awaited was cancelled")


HANDLER_FAILURES: dict[str, tuple[Callable[[], Awaitable[None]], bytes]] = {
    "error-text-with-a-lone-surrogate-and-a-megabyte": (
        raise_surrogate_megabyte,
        b"ValueError: key \\ud800 xxx",
    ),
    "recursion-error": (recurse_forever, b"RecursionError: maximum recursion depth exceeded"),
    "base-exception": (raise_base_exception, b"Abort: not an Exception"),
    "exception-whose-str-raises": (
        raise_unprintable,
        b"Unprintable: <str() of the exception raised RuntimeError>",
    ),
    "leaked-cancellation": (
        leak_a_cancellation,
        b"CancelledError: a future the handler awaited was cancelled",
    ),
}


@pytest.mark.parametrize("name", list(HANDLER_FAILURES))
def test_a_handler_failing_in_a_hostile_way_is_retried_then_dead_lettered(
    kafka_bootstrap: str, name: str
) -> None:
    misbehave, error = HANDLER_FAILURES[name]
    limit = sys.getrecursionlimit()
    run = asyncio.run(attack(kafka_bootstrap, record_of(HOSTILE), misbehave))
    assert sys.getrecursionlimit() == limit

    # Run twice (the retry policy's 2 attempts), then dead-lettered; the good event next.
    first = [item_id for stage, item_id, _ in run.seen if stage == "first"]
    assert first == [HOSTILE.id, HOSTILE.id, GOOD.id]
    assert run.outcomes[0] == {Outcome.DEAD_LETTERED.value: 1, Outcome.HANDLED.value: 1}
    assert [(f.event_id, f.attempt, f.final) for f in run.failures] == [
        (HOSTILE.id, 1, False),
        (HOSTILE.id, 2, True),
    ]
    dead, added = dead_letter_fields(run)
    assert (dead.key, dead.value) == record_of(HOSTILE)[:2]
    assert list(dead.headers[: len(HEADERS)]) == list(HEADERS)
    assert added["attempts"] == b"2"
    assert added["error"].startswith(error), added["error"][:200]
    assert added["handler"].endswith(b".handle")
    # The rest of the run as for any other attack: moved on, committed, not met again.
    run.seen = [seen for seen in run.seen if seen[0] == "restart" or seen[1] != HOSTILE.id]
    assert_moved_on(run, handled_hostile=False)


def test_a_record_too_large_to_dead_letter_with_its_bytes_is_dead_lettered_without_them(
    kafka_bootstrap: str,
) -> None:
    """The topic takes 4 MiB records, the dead-letter producer and topic 1 MiB: the dead
    letter cannot hold the record, so it names it (where it is, how large it was)."""
    value = b"\x00" + b"x" * (1_500_000)
    headers: tuple[NullableHeader, ...] = (*HEADERS, ("padding", b"p" * 1000))
    key = b"k" * 5000
    run = asyncio.run(
        attack(
            kafka_bootstrap,
            (key, value, headers),
            topic_config={"max.message.bytes": str(4 * 1024 * 1024)},
        )
    )

    assert_moved_on(run, handled_hostile=False)
    assert run.outcomes[0] == {Outcome.DEAD_LETTERED.value: 1, Outcome.HANDLED.value: 1}
    [dead] = run.dead
    assert dead.value == b"" and dead.key == key[:MAX_OMITTED_KEY_BYTES]
    added: dict[str, Any] = dict(dead.headers)
    assert added["error"].startswith(b"EventDecodeError: the record value is not JSON")
    assert added["original.offset"] == str(run.hostile_offset).encode()
    assert added["dead-letter.omitted"] == b"key,value,headers"
    assert added["original.value-bytes"] == str(len(value)).encode()
    assert added["original.key-bytes"] == str(len(key)).encode()
    assert added["original.header-count"] == str(len(headers)).encode()
    assert "padding" not in added


# aiokafka's C record builder refuses such a header name; its pure-Python one writes what a
# str subclass's encode() returns, as librdkafka or franz-go clients write any bytes.
def write_unreadable(bootstrap: str, topic: str, partition: int = 0) -> int:
    """Write a record whose header name is not UTF-8 to `topic`; its offset."""
    return write_header_name(
        bootstrap, topic, partition, b"inbox/report.pdf", b"trace\xff\xfe", b"{}"
    )


def test_a_record_aiokafka_cannot_parse_is_dead_lettered_by_position(
    kafka_bootstrap: str,
) -> None:
    """A header name that is not UTF-8: aiokafka raises from every fetch that meets it
    (CorruptRecordException), naming no partition; the consumer finds it, dead-letters
    where it is, and goes on."""

    run = asyncio.run(
        attack(kafka_bootstrap, None, write_hostile=lambda t: write_unreadable(kafka_bootstrap, t))
    )

    assert_moved_on(run, handled_hostile=False)
    assert run.outcomes[0] == {Outcome.DEAD_LETTERED.value: 1, Outcome.HANDLED.value: 1}
    [dead] = run.dead
    added = dict(dead.headers)
    assert dead.value == b"" and dead.key is None
    assert added["error"].startswith(b"EventDecodeError: the record cannot be parsed: ")
    assert b"UnicodeDecodeError" in added["error"]
    assert added["original.offset"] == str(run.hostile_offset).encode()
    assert added["original.first-offset"] == str(run.hostile_offset).encode()
    assert added["dead-letter.omitted"] == b"key,value,headers"
    [failure] = run.failures
    assert (failure.handler, failure.context.offset) == ("<decode>", run.hostile_offset)


PARTITIONS = 6


@pytest.mark.parametrize("when", ["in-the-first-fetch", "after-a-restart", "while-running"])
def test_an_unreadable_record_costs_no_other_record_on_any_partition(
    kafka_bootstrap: str, when: str
) -> None:
    """aiokafka drops every record a failing fetch had read, on every partition (and raises
    naming none): the consumer must rewind them all, to the group's offsets when it has
    handed out nothing yet (a new group: the beginning; after a restart: the commits),
    else to the next record each partition's worker expects. Six partitions, each with
    events before and after, written in transactions as the stream writes them, and the
    unreadable record amid partition 1's; "while-running" writes it inside the
    transaction of the events after, so that its commit makes all partitions readable at
    once and one fetch brings them all. Every good event is handled once, in order per
    partition, and the one dead letter is where the unreadable record is."""
    topic, group = unique("hostile"), unique("group")
    failures: list[Failure] = []
    seen: list[tuple[int, int, str]] = []
    parts = range(PARTITIONS)
    before = {p: [event(f"p{p}/before-{n}", n) for n in range(40)] for p in parts}
    after = {p: [event(f"p{p}/after-{n}", 100 + n) for n in range(200)] for p in parts}
    total = sum(len(items) for items in (*before.values(), *after.values()))

    async def write_before() -> None:
        for p in parts:
            await produce_records(
                kafka_bootstrap,
                topic,
                [record_of(e) for e in before[p]],
                partition=p,
                transactional=True,
            )

    async def write_after_and_hostile() -> int:
        """The events after and, amid partition 1's, the unreadable record: all made
        readable (read_committed) at once by one transaction's commit."""
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap, transactional_id=unique("writer")
        )
        await producer.start()
        try:
            await producer.begin_transaction()
            for p in parts:
                for item in after[p][: len(after[p]) // 2]:
                    key, value, headers = record_of(item)
                    await producer.send(topic, value, key=key, headers=list(headers), partition=p)
            await producer.flush()
            hostile_offset = await asyncio.to_thread(write_unreadable, kafka_bootstrap, topic, 1)
            for p in parts:
                for item in after[p][len(after[p]) // 2 :]:
                    key, value, headers = record_of(item)
                    await producer.send(topic, value, key=key, headers=list(headers), partition=p)
            await producer.commit_transaction()
            return hostile_offset
        finally:
            await producer.stop()

    def handler_of(events: FileEvents) -> None:
        @events.on("*")
        async def handle(item: FileEvent, context: EventContext) -> None:
            seen.append((context.partition, context.offset, item.id))

    async def scenario() -> tuple[int, list[ConsumerRecord[bytes, bytes]], dict[int, int]]:
        await create_topics(kafka_bootstrap, (topic, PARTITIONS), (f"{topic}.dead-letter", 1))
        events = consumer(kafka_bootstrap, topic, group, failures)
        handler_of(events)
        await write_before()
        first = 40 * PARTITIONS
        if when == "in-the-first-fetch":
            hostile_offset = await write_after_and_hostile()
            await run_until(events, lambda: len(seen) >= total, "every good event", 60)
        elif when == "after-a-restart":
            await run_until(events, lambda: len(seen) >= first, "the events before", 60)
            hostile_offset = await write_after_and_hostile()
            events = consumer(kafka_bootstrap, topic, group, failures)
            handler_of(events)
            await run_until(events, lambda: len(seen) >= total, "every good event", 60)
        else:
            task = asyncio.create_task(events.run())
            await eventually(lambda: len(seen) >= first or task.done(), 60, "the events before")
            hostile_offset = await write_after_and_hostile()
            await eventually(lambda: len(seen) >= total or task.done(), 60, "every event")
            events.stop()
            await asyncio.wait_for(task, 30)
        return (
            hostile_offset,
            await read_records(kafka_bootstrap, f"{topic}.dead-letter"),
            await committed(kafka_bootstrap, group, topic),
        )

    hostile_offset, dead, commits = asyncio.run(scenario())
    for p in parts:
        assert [item_id for partition, _, item_id in seen if partition == p] == [
            e.id for e in (*before[p], *after[p])
        ]
    [marker] = dead
    headers = dict(marker.headers)
    assert headers["original.partition"] == b"1"
    assert headers["original.offset"] == str(hostile_offset).encode()
    assert int(headers["original.first-offset"]) <= hostile_offset
    assert [(f.handler, f.context.partition) for f in failures] == [("<decode>", 1)]
    # Committed past the last event of each partition (the end offset is one further, past
    # the last transaction's commit marker), and past the unreadable record.
    last = {p: max(offset for partition, offset, _ in seen if partition == p) for p in parts}
    assert commits == {p: last[p] + 1 for p in parts} and commits[1] > hostile_offset + 1


def test_every_event_the_stream_can_serialise_is_read() -> None:
    """The consumer's nesting bound agrees with the stream's serialiser: the deepest `raw`
    the stream can write is read back; one level deeper the stream refuses to write it."""
    from streams.core.records import event_json

    def raw_nested(depth: int) -> dict[str, Any]:
        node: dict[str, Any] = {}
        for _ in range(depth - 1):
            node = {"a": node}
        return node

    deepest = MAX_DEPTH - 1  # the event object is level 1
    written = event_json(
        FileEvent(id="s3:x", type="created", key=KEY, provider="s3", raw=raw_nested(deepest))
    )
    assert decode_event(written).id == "s3:x"
    with pytest.raises(ValueError):
        event_json(
            FileEvent(
                id="s3:x", type="created", key=KEY, provider="s3", raw=raw_nested(deepest + 1)
            )
        )


def write_zstd(bootstrap: str, topic: str, partition: int = 0) -> int:
    """Write one zstd-compressed record (librdkafka has the codec built in) to `topic`; its
    offset."""
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "zstd"})
    offsets: list[int] = []
    producer.produce(
        topic,
        b'{"padding": "' + b"a" * 20_000 + b'"}',  # compressible: librdkafka compresses it
        b"inbox/report.pdf",
        partition,
        on_delivery=lambda error, message: offsets.append(message.offset()),
    )
    producer.flush(30)
    [offset] = offsets
    return offset


def test_a_record_compressed_with_a_codec_aiokafka_lacks_is_dead_lettered(
    kafka_bootstrap: str,
) -> None:
    """aiokafka decompresses lz4, zstd and snappy only with optional libraries; without them a
    fetch meeting such a batch raised UnsupportedCodecError and `run()` stopped: one record
    from whoever may write the topic stopped every consumer. Dead-lettered by position (or,
    where the codec is installed, as the non-event it is), and the next record handled."""
    run = asyncio.run(
        attack(kafka_bootstrap, None, write_hostile=lambda t: write_zstd(kafka_bootstrap, t))
    )

    assert_moved_on(run, handled_hostile=False)
    assert run.outcomes[0] == {Outcome.DEAD_LETTERED.value: 1, Outcome.HANDLED.value: 1}
    [dead] = run.dead
    added = dict(dead.headers)
    assert added["original.offset"] == str(run.hostile_offset).encode()
    assert added["error"].startswith(b"EventDecodeError: "), added["error"]
