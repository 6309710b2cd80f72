"""Scaffolding the normalizer tests (`test_<source>.py`) share.

Fixture files, delivery builders, the JSON strategies of the property tests, and the two
checks every source makes: a malformed delivery says why, and any input gives events or
MalformedDelivery (nothing else) the same way every time.

The module is not called `support` because `tests/support` is a package of that name, and
pytest puts both folders on `sys.path`.
"""

from __future__ import annotations

import copy
import importlib
import json
from collections.abc import Callable, Mapping
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.core.delivery import Delivery
from streams.core.event import FileEvent
from streams.core.normalizers.base import MalformedDelivery, Normalizer
from streams.core.records import event_json

FIXTURES = Path(__file__).parent / "fixtures"

# --- fixture files --------------------------------------------------------------------------


def fixture_path(source: str, name: str) -> Path:
    return FIXTURES / source / name


def fixture_bytes(source: str, name: str) -> bytes:
    """A fixture file's bytes exactly as published."""
    return fixture_path(source, name).read_bytes()


def load_fixture(source: str, name: str) -> Any:
    """A fixture file's JSON document (a fresh copy on every call)."""
    return json.loads(fixture_path(source, name).read_text(encoding="utf-8"))


def fixture_names(source: str, pattern: str = "*.json") -> list[str]:
    """The names of the source's fixture files matching `pattern`, sorted."""
    return sorted(path.name for path in (FIXTURES / source).glob(pattern))


# --- documents and deliveries ---------------------------------------------------------------


def encode(document: Any) -> bytes:
    """A JSON document as `json.dumps` writes it, in UTF-8."""
    return json.dumps(document).encode()


def set_fields(target: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """`target` with each field of `changes` set in place; a None value removes the field."""
    for name, value in changes.items():
        if value is None:
            target.pop(name, None)
        else:
            target[name] = value
    return target


S3_RECORD_FIELDS = frozenset({"eventName", "eventTime", "eventSource"})


def with_s3_record(body: Any, **changes: Any) -> Any:
    """A copy of a one-record S3-format body (S3 and MinIO) with record fields (eventName,
    eventTime, eventSource) or s3.object fields changed (None removes one)."""
    body = copy.deepcopy(body)
    record = body["Records"][0]
    for name, value in changes.items():
        set_fields(record if name in S3_RECORD_FIELDS else record["s3"]["object"], {name: value})
    return body


def deliver(source: str, body: Any, headers: Mapping[str, str] | None = None) -> Delivery:
    """A delivery of `body` from `source`: bytes as they are, any other value as its JSON."""
    raw = body if isinstance(body, bytes) else encode(body)
    return Delivery(source=source, body=raw, headers=headers or {})


def normalizer(source: str) -> Normalizer:
    """`streams.core.normalizers.<source>.normalize` itself, not looked up through the registry
    (the tests that the registry finds each module compare the two)."""
    normalize: Normalizer = importlib.import_module(f"streams.core.normalizers.{source}").normalize
    return normalize


def normalized(source: str, body: Any) -> list[FileEvent]:
    """The events the source's normalizer gives for `body` (see `deliver`)."""
    return normalizer(source)(deliver(source, body))


def single(events: list[FileEvent]) -> FileEvent:
    """The one event of `events` (fails the test when there are more or none)."""
    assert len(events) == 1, events
    return events[0]


# --- the checks every source makes ----------------------------------------------------------


def _as_delivery(source: str, delivery: Delivery | Any) -> Delivery:
    return delivery if isinstance(delivery, Delivery) else deliver(source, delivery)


def assert_malformed(source: str, delivery: Delivery | Any, message: str) -> None:
    """Normalizing `delivery` (or a body, see `deliver`) raises MalformedDelivery with a
    message that `message` (a regular expression) finds."""
    with pytest.raises(MalformedDelivery, match=message):
        normalizer(source)(_as_delivery(source, delivery))


def outcome(source: str, delivery: Delivery | Any) -> list[str] | str:
    """The ids of the events a delivery (or a body) gives, or "malformed".

    Anything but MalformedDelivery escaping fails the test, and so does an event that is not
    a FileEvent of `source`, cannot be serialised (every event must reach the output topic)
    or differs from the event FileEvent's validation makes of its values.
    """
    try:
        events = normalizer(source)(_as_delivery(source, delivery))
    except MalformedDelivery:
        return "malformed"
    for event in events:
        assert isinstance(event, FileEvent)
        assert event.provider == source
        # What validation makes of the same values is the same event: the normalizers that
        # skip it (FileEvent.from_checked) must have checked what it checks.
        validated = FileEvent(**dict(event))
        assert validated == event and validated.model_dump_json() == event.model_dump_json()
        # The per-event writer (orjson) writes what pydantic would.
        assert event_json(event) == event.model_dump_json().encode()
        assert event.time is None or event.time.tzinfo is UTC
    return [event.id for event in events]


def assert_only_malformed_and_deterministic(
    source: str, delivery: Delivery | Any, again: Delivery | Any | None = None
) -> list[str] | str:
    """Normalizing raises only MalformedDelivery, and is deterministic: a second time (with
    `again`, the same change delivered another way, when given) gives the same outcome."""
    result = outcome(source, delivery)
    assert outcome(source, delivery if again is None else again) == result
    return result


def outcome_kinds(source: str, deliveries: st.SearchStrategy[Any], examples: int) -> set[str]:
    """Which of "malformed", "events" and "none" `examples` draws of `deliveries` give: the
    guard that a property's strategies do not all stop at validation."""
    seen: set[str] = set()

    @settings(max_examples=examples, deadline=None, database=None)
    @given(deliveries)
    def probe(delivery: Delivery | Any) -> None:
        result = outcome(source, delivery)
        seen.add("malformed" if result == "malformed" else "events" if result else "none")

    probe()
    return seen


# --- strategies -----------------------------------------------------------------------------


def json_strategy(
    *, max_text: int | None = 12, max_key: int = 8, max_leaves: int = 16
) -> st.SearchStrategy[Any]:
    """Any JSON value (floats include NaN and infinities): scalars, lists and objects.

    The defaults are those the webhook sources' tests were written with; the AWS and the
    Google and Azure tests use longer strings and more leaves, and keep them.
    """
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=max_text)
    return st.recursive(
        scalars,
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=max_key), children, max_size=4)
        ),
        max_leaves=max_leaves,
    )


json_values = json_strategy()


def mostly(
    valid: st.SearchStrategy[Any], invalid: st.SearchStrategy[Any] = json_values
) -> st.SearchStrategy[Any]:
    """`valid` nine times in ten, else `invalid` (any JSON value unless given): each field is
    wrong now and then, not all at once, so deep paths get exercised."""
    return st.integers(min_value=0, max_value=9).flatmap(lambda n: invalid if n == 0 else valid)


def webhook_bodies(
    documents: st.SearchStrategy[Any], encode_document: Callable[[Any], bytes] = encode
) -> st.SearchStrategy[bytes]:
    """Bodies a webhook may carry: arbitrary bytes, any JSON value, or a near-valid document
    encoded as the provider sends it."""
    return st.binary(max_size=300) | json_values.map(encode) | documents.map(encode_document)
