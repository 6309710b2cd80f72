"""FileEvent.from_checked, the normalizers' construction without validation: the same event,
in every way a caller can tell, as FileEvent(...) builds from the same values."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from normalizer_support import FIXTURES, fixture_names, load_fixture
from pydantic import ValidationError

from streams.core.delivery import Delivery
from streams.core.event import FileEvent
from streams.core.normalizers import normalizer_for
from streams.core.normalizers.base import MalformedDelivery

VALUES: dict[str, Any] = {
    "id": "s3:0123456789abcdef0123456789abcdef",
    "type": "deleted",
    "key": "a b/\u00e9.txt",
    "bucket": "bucket",
    "size": 1024,
    "etag": "d41d8cd98f00b204e9800998ecf8427e",
    "version_id": "null",
    "time": datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
    "sequencer": "0055AED6DCD90281E5",
    "provider": "s3",
    "version_only": True,
    "raw": {"eventName": "ObjectRemoved:Delete", "s3": {"object": {"size": 2**70}}},
}

# Every normalizer that builds its events with from_checked.
CHECKED_SOURCES = ("s3", "minio", "eventbridge", "gcs")


def assert_same_event(checked: FileEvent, validated: FileEvent) -> None:
    assert checked == validated
    assert repr(checked) == repr(validated)
    assert checked.model_dump_json() == validated.model_dump_json()  # field order included
    assert checked.model_dump(mode="json") == validated.model_dump(mode="json")
    assert checked.model_dump() == validated.model_dump()
    assert checked.model_fields_set == validated.model_fields_set
    assert checked.summary() == validated.summary()
    assert list(checked) == list(validated)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"bucket": None, "size": None, "etag": None, "version_id": None, "time": None},
        {"sequencer": None, "version_only": None, "raw": None, "type": "created"},
        {"time": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)},
    ],
)
def test_from_checked_is_the_validated_event(changes: dict[str, Any]) -> None:
    values = VALUES | changes
    assert_same_event(FileEvent.from_checked(**values), FileEvent(**values))


def test_a_checked_event_is_frozen_and_copies_like_any_other() -> None:
    event = FileEvent.from_checked(**VALUES)
    with pytest.raises(ValidationError):
        event.key = "other"  # type: ignore[misc]
    copy = event.model_copy(update={"key": "other", "size": None})
    assert copy.key == "other" and copy.size is None and event.key == VALUES["key"]
    assert_same_event(copy, FileEvent(**VALUES).model_copy(update={"key": "other", "size": None}))


def test_validation_is_unchanged_for_callers_that_construct_directly() -> None:
    with pytest.raises(ValidationError, match="timezone"):
        FileEvent(**VALUES | {"time": datetime(2024, 1, 2)})
    with pytest.raises(ValidationError):
        FileEvent(**VALUES | {"type": "renamed"})
    with pytest.raises(ValidationError):
        FileEvent(**VALUES, extra=1)


def _fixture_deliveries(source: str) -> list[Delivery]:
    deliveries = []
    for name in fixture_names(source):
        document = load_fixture(source, name)
        if isinstance(document, list):  # a bare S3 record list
            document = {"Records": document}
        deliveries.append(Delivery(source=source, body=json.dumps(document).encode()))
    return deliveries


@pytest.mark.parametrize("source", CHECKED_SOURCES)
def test_every_fixture_event_is_the_validated_event(source: str) -> None:
    events = []
    for delivery in _fixture_deliveries(source):
        try:
            events.extend(normalizer_for(source)(delivery))
        except MalformedDelivery:
            continue
    assert events, f"no {source} fixture gives an event"
    for event in events:
        assert event.time is None or event.time.tzinfo is UTC
        assert_same_event(event, FileEvent(**dict(event)))


def test_the_fixture_folder_holds_every_checked_source() -> None:
    assert all((FIXTURES / source).is_dir() for source in CHECKED_SOURCES)
