"""The published JSON Schema of the canonical event, for consumers in any language.

Generated from `streams.core.event.FileEvent` (its field docstrings are the descriptions) and
checked in as `schemas/file-event/v<version>.json`; `python -m streams schema --output
schemas/file-event/v1.json` writes it again, and tests/unit/test_schema.py fails when the
checked-in file differs from what this module generates, so the two cannot drift.

The schema describes the event as written (every field present, null where unknown), and
every output and stale record names it in its `ce_dataschema` header (CloudEvents 1.0
`dataschema`, streams.core.records): `FILE_EVENT_SCHEMA_URI`, a URN, since the schema is a file
of this repository rather than a page anyone hosts; it maps to `FILE_EVENT_SCHEMA_PATH`.

Versions: a change that a consumer validating against the published schema would reject (a
field removed, renamed or narrowed, a new field, since `additionalProperties` is false) is a
new version: raise `FILE_EVENT_SCHEMA_VERSION`, which writes a new file and a new URI, and
keep the old file for consumers still on it. Descriptions may change within a version.
"""

from __future__ import annotations

import json
from typing import Any

from streams.core.event import FileEvent

FILE_EVENT_SCHEMA_VERSION = 1
FILE_EVENT_SCHEMA_URI = f"urn:storage-events:schema:file-event:v{FILE_EVENT_SCHEMA_VERSION}"
"""The schema's `$id` and every output record's `ce_dataschema`."""
FILE_EVENT_SCHEMA_PATH = f"schemas/file-event/v{FILE_EVENT_SCHEMA_VERSION}.json"
"""Where the schema of `FILE_EVENT_SCHEMA_URI` is, relative to the repository's root."""
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def file_event_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the event's JSON as output records carry it."""
    generated = FileEvent.model_json_schema(mode="serialization")
    generated.pop("title", None)
    for field in generated["properties"].values():
        if "description" in field:  # a docstring's line breaks are no part of the text
            field["description"] = " ".join(field["description"].split())
    description = generated.pop("description", "")
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": FILE_EVENT_SCHEMA_URI,
        "title": f"storage-events file event, version {FILE_EVENT_SCHEMA_VERSION}",
        "description": (
            f"{description} The value of every record on an output topic "
            "(files.events.<instance>) and a stale topic (files.stale.<instance>), and of "
            "the repartition topic's records; the record's ce_dataschema header names this "
            "schema's $id."
        ),
        **generated,
    }


def schema_text(schema: dict[str, Any]) -> str:
    """The file's text: stable key order, two-space indent, a final newline."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"
