"""The per-record types of the core with an `__init__` of their own (compiled by mypyc,
where a dataclass's generated one runs interpreted): built, compared and printed as the
dataclasses they are, defaults included, and no default shared between two records."""

from __future__ import annotations

import dataclasses

from streams.core.emitting import KeyedInput
from streams.core.keystate import KeyState
from streams.core.ordering import Mark
from streams.core.records import KeyedEvent, OutRecord, RawRecord
from streams.core.routing import Routed


def test_out_record_defaults_and_equality() -> None:
    record = OutRecord("t", b"k", b"v")
    assert (record.headers, record.partition) == ((), None)
    assert record == OutRecord(topic="t", key=b"k", value=b"v", headers=(), partition=None)
    assert record != OutRecord("t", b"k", b"v", partition=1)
    assert repr(record) == "OutRecord(topic='t', key=b'k', value=b'v', headers=(), partition=None)"
    assert [field.name for field in dataclasses.fields(record)] == [
        "topic",
        "key",
        "value",
        "headers",
        "partition",
    ]


def test_defaults_are_not_shared() -> None:
    first, second = RawRecord("t", b"v"), RawRecord("t", b"v")
    assert first.headers == {} and first.headers is not second.headers
    one, other = KeyState(), KeyState()
    one.ids.append(["id", 1.0])
    assert other.ids == [] and other == KeyState(None, [], None, None)
    inputs = KeyedInput("t", 0, None, b"v"), KeyedInput("t", 0, None, b"v")
    assert inputs[0].headers is not inputs[1].headers and inputs[0].offset == -1


def test_keyed_event_by_keyword_and_position() -> None:
    values = dict(
        instance="a",
        id="s3:1",
        type="created",
        key="k",
        bucket="b",
        provider="s3",
        sequencer="01",
        time=None,
        time_text=None,
        version_only=None,
        raw=None,
        value=b"{}",
    )
    by_keyword = KeyedEvent(**values)  # type: ignore[arg-type]
    assert by_keyword == KeyedEvent(*values.values())  # type: ignore[arg-type]
    assert by_keyword.etag is None
    assert KeyedEvent(**values, etag="e") != by_keyword  # type: ignore[arg-type]


def test_mark_defaults_replace_and_equality() -> None:
    mark = Mark("aws-sequencer", ("01",), 1.0, "s3:1", "created")
    assert mark.forget_at is None
    assert dataclasses.replace(mark, forget_at=5.0) == Mark(
        kind="aws-sequencer",
        token=("01",),
        time=1.0,
        event_id="s3:1",
        type="created",
        forget_at=5.0,
    )
    assert repr(mark).startswith("Mark(kind='aws-sequencer', token=('01',), time=1.0,")


def test_routed_defaults_are_not_shared() -> None:
    first, second = Routed(), Routed()
    first.records.append(OutRecord("t", b"k", b"v"))
    first.filtered[("a", "prefix")] = 1
    assert (second.records, second.filtered, second.events) == ([], {}, 0)
    assert Routed(dead_letter_reason="s3: bad").dead_letter_reason == "s3: bad"
