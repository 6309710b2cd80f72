"""The published JSON Schema of the canonical event: checked in, generated, named by every
output record, and enforced on every output record a test reads (support.event_schema)."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from support.event_schema import SCHEMA_DIR, check_record, schema_errors, validators
from support.kafka_io import produce, read_topic

from streams.cli import main
from streams.core.delivery import Delivery
from streams.core.event import FileEvent
from streams.core.normalizers import SOURCES, MalformedDelivery, normalize
from streams.core.records import event_json, headers_dict, output_record, stale_record
from streams.core.schema import (
    FILE_EVENT_SCHEMA_PATH,
    FILE_EVENT_SCHEMA_URI,
    file_event_schema,
    schema_text,
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "normalizers" / "fixtures"
REGENERATE = f"regenerate: python -m streams schema --output {FILE_EVENT_SCHEMA_PATH}"


def an_event(**changes: Any) -> FileEvent:
    fields: dict[str, Any] = {
        "id": "s3:abc",
        "type": "created",
        "key": "photos/red flower.jpg",
        "bucket": "uploads",
        "size": 12,
        "etag": "e",
        "version_id": "v",
        "time": datetime(2026, 11, 30, 0, 8, 7, 120000, tzinfo=UTC),
        "sequencer": "0069",
        "provider": "s3",
        "version_only": None,
        "raw": {"eventName": "ObjectCreated:Put"},
    }
    return FileEvent(**{**fields, **changes})


def test_the_checked_in_schema_is_what_the_generator_writes() -> None:
    checked_in = (ROOT / FILE_EVENT_SCHEMA_PATH).read_text(encoding="utf-8")
    assert checked_in == schema_text(file_event_schema()), REGENERATE


def test_the_schema_is_a_versioned_draft_2020_12_schema_with_readable_fields() -> None:
    schema = json.loads((ROOT / FILE_EVENT_SCHEMA_PATH).read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == FILE_EVENT_SCHEMA_URI == "urn:storage-events:schema:file-event:v1"
    assert FILE_EVENT_SCHEMA_PATH == "schemas/file-event/v1.json"
    assert set(schema["properties"]) == set(FileEvent.model_fields)
    assert set(schema["required"]) == set(FileEvent.model_fields)  # all written, null or not
    assert schema["additionalProperties"] is False
    for name, field in schema["properties"].items():
        assert field.get("title") and len(field.get("description", "")) > 20, name
        assert "\n" not in field["description"], name
    assert {"type": "string", "format": "date-time"} in schema["properties"]["time"]["anyOf"]


def test_every_schema_file_is_one_the_suite_checks_against() -> None:
    """Older versions stay checked in; each file's `$id` names its own version."""
    files = sorted(SCHEMA_DIR.glob("*.json"))
    assert ROOT / FILE_EVENT_SCHEMA_PATH in files
    for path in files:
        schema = json.loads(path.read_text(encoding="utf-8"))
        assert schema["$id"] == f"urn:storage-events:schema:file-event:{path.stem}", path
    assert set(validators()) == {
        json.loads(path.read_text(encoding="utf-8"))["$id"] for path in files
    }


def test_the_schema_command_writes_the_file(tmp_path: Path) -> None:
    target = tmp_path / "v1.json"
    assert main(["schema", "--output", str(target)]) == 0
    assert target.read_text(encoding="utf-8") == (ROOT / FILE_EVENT_SCHEMA_PATH).read_text(
        encoding="utf-8"
    )


def fixture_events() -> list[FileEvent]:
    events: list[FileEvent] = []
    for source in SOURCES:
        for path in sorted((FIXTURES / source).glob("**/*.json")):
            delivery = Delivery(source=source, body=path.read_bytes(), headers={}, attributes={})
            try:
                events += normalize(delivery)
            except MalformedDelivery:
                continue  # some fixtures need their transport's headers or attributes
    return events


def test_every_fixture_event_of_every_provider_matches_the_schema() -> None:
    events = fixture_events()
    assert len({event.provider for event in events}) >= 8, "the fixtures normalize"
    for event in events:
        assert schema_errors(event_json(event), FILE_EVENT_SCHEMA_URI) == [], event.id


def test_output_and_stale_records_name_the_schema_and_match_it() -> None:
    for record in (
        output_record("files.events.a", "a", an_event()),
        stale_record("files.stale.a", "a", an_event(time=None, type="deleted"), "older"),
    ):
        headers = headers_dict(record.headers)
        assert headers["ce_dataschema"] == FILE_EVENT_SCHEMA_URI.encode()
        check_record(record.topic, 0, record.value, headers)


def as_json(**changes: Any) -> bytes:
    data = json.loads(event_json(an_event()))
    for name, value in changes.items():
        if value is ...:
            del data[name]
        else:
            data[name] = value
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (as_json(colour="red"), "Additional properties are not allowed"),
        (as_json(size="12"), "size: '12' is not valid"),
        (as_json(type="moved"), "type: 'moved' is not one of"),
        (as_json(etag=...), "'etag' is a required property"),
        (as_json(time="yesterday"), "time: 'yesterday' is not valid"),
        (as_json(time="2026-11-30 00:08:07"), "time: '2026-11-30 00:08:07' is not valid"),
        (as_json(raw=[1]), "raw: [1] is not valid"),
        (b"[]", "is not of type 'object'"),
        (b"{", "the value is not JSON"),
    ],
)
def test_an_event_that_breaks_the_schema_fails_the_test_that_reads_it(
    value: bytes, why: str
) -> None:
    headers = {"ce_dataschema": FILE_EVENT_SCHEMA_URI.encode()}
    with pytest.raises(AssertionError, match="does not match its ce_dataschema") as failure:
        check_record("events-x-default", 7, value, headers)
    assert why in str(failure.value)


def test_an_unknown_schema_fails_and_no_header_is_not_checked() -> None:
    with pytest.raises(AssertionError, match="names no schema"):
        check_record("t", 0, as_json(), {"ce_dataschema": b"urn:storage-events:schema:x:v9"})
    check_record("t", 0, b"not an event", {"source": b"s3"})  # a raw record: not an event


@pytest.mark.kafka
def test_read_topic_checks_the_records_it_reads(kafka_bootstrap: str) -> None:
    """The suite's shared reader enforces the schema on real records from the broker."""
    topic = f"schema-check-{uuid.uuid4().hex[:10]}"
    header = [("ce_dataschema", FILE_EVENT_SCHEMA_URI.encode())]
    good = output_record(topic, "a", an_event())
    asyncio.run(
        produce(kafka_bootstrap, topic, [(good.value or b"", list(good.headers))], key=b"k")
    )
    assert len(asyncio.run(read_topic(kafka_bootstrap, topic))) == 1
    asyncio.run(produce(kafka_bootstrap, topic, [(as_json(size=-1.5), header)], key=b"k"))
    with pytest.raises(AssertionError, match=r"@1 does not match its ce_dataschema: size"):
        asyncio.run(read_topic(kafka_bootstrap, topic))
