"""Every output record a test reads is checked against the published event schema.

`support.kafka_io.read_topic` calls `check_record` on each record: one that names a schema in
its `ce_dataschema` header (every output and stale record the worker writes) must name a
schema checked in under `schemas/file-event/`, and its value must validate against that file
(not against the generator: consumers get the file), formats included (`time` is RFC 3339).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas" / "file-event"
DATASCHEMA_HEADER = "ce_dataschema"


@functools.cache
def validators() -> dict[str, Draft202012Validator]:
    """The checked-in event schemas by their `$id`, each checked against its metaschema."""
    found: dict[str, Draft202012Validator] = {}
    for path in sorted(SCHEMA_DIR.glob("v*.json")):
        schema = json.loads(path.read_text(encoding="utf-8"))
        Draft202012Validator.check_schema(schema)
        found[schema["$id"]] = Draft202012Validator(
            schema, format_checker=Draft202012Validator.FORMAT_CHECKER
        )
    return found


def schema_errors(value: bytes | None, uri: str) -> list[str]:
    """Why `value` is not an event of the schema `uri`; empty when it is one."""
    validator = validators().get(uri)
    if validator is None:
        return [f"{DATASCHEMA_HEADER} {uri!r} names no schema in {SCHEMA_DIR}"]
    try:
        data: Any = json.loads(value or b"")
    except ValueError as exc:
        return [f"the value is not JSON: {exc}"]
    return [
        f"{'/'.join(str(part) for part in error.absolute_path) or '(event)'}: {error.message}"
        for error in validator.iter_errors(data)
    ]


def check_record(
    topic: str, offset: int, value: bytes | None, headers: Mapping[str, bytes]
) -> None:
    """Fail (AssertionError) when a record that names its schema does not match it."""
    uri = headers.get(DATASCHEMA_HEADER)
    if uri is None:
        return
    errors = schema_errors(value, uri.decode("utf-8", errors="replace"))
    assert not errors, (
        f"{topic}@{offset} does not match its {DATASCHEMA_HEADER}: {'; '.join(errors)}; "
        f"value {value!r}"
    )
