"""Reading a record's value as the canonical event the stream wrote."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from fileevents.errors import EventDecodeError
from streams.event import FileEvent

_FIELDS = frozenset(FileEvent.model_fields)


def decode_event(value: bytes | None) -> FileEvent:
    """The `FileEvent` in `value`; fields this version does not know are ignored.

    Ignoring unknown fields keeps a consumer working when a newer stream adds one.
    """
    if value is None:
        raise EventDecodeError("the record has no value (a tombstone), not an event")
    try:
        document: Any = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EventDecodeError(f"the record value is not JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise EventDecodeError("the record value is not a JSON object")
    known = {name: field for name, field in document.items() if name in _FIELDS}
    try:
        return FileEvent.model_validate(known)
    except ValidationError as exc:
        raise EventDecodeError(f"the record value is not a canonical event: {exc}") from exc
