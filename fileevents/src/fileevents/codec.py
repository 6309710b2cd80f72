"""Reading a record as the canonical event the stream wrote, or refusing it as malformed.

Anyone who can write to an output topic can put any bytes on it, so this is the library's
trust boundary: a record reaches the handlers only as a `FileEvent` whose every string is
valid Unicode, read from a key, headers and value of the shape the stream writes. Everything
else raises `EventDecodeError` (and is dead-lettered), never an exception of another kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from pydantic import ValidationError

from fileevents.errors import EventDecodeError
from fileevents.event import FileEvent

_FIELDS = frozenset(FileEvent.model_fields)

MAX_DEPTH = 257
"""The deepest nesting of objects and arrays a record value may have (the event object is
level 1): exactly what the stream's own serialiser (pydantic, which stops at `raw` nested 256
levels) can write, so every event the stream emits is read, and anything deeper is not the
stream's. Handlers can serialise such an event again as the stream did (`model_dump_json`)."""


@dataclass
class UnreadableRecord(ConsumerRecord[bytes, bytes]):  # type: ignore[misc]
    """Stands in for a record aiokafka could not parse, so that it is dead-lettered (by
    position: its bytes cannot be had) and committed in offset order like any other."""

    first_offset: int = -1
    """Reading failed from here to `offset`; from `offset + 1` it worked. Offsets between
    are transaction markers or compacted away, unless several records are unreadable."""
    reason: str = ""

    @classmethod
    def at(
        cls, tp: TopicPartition, first_offset: int, offset: int, reason: str
    ) -> UnreadableRecord:
        return cls(
            topic=tp.topic,
            partition=tp.partition,
            offset=offset,
            timestamp=-1,
            timestamp_type=0,
            key=None,
            value=None,
            checksum=None,
            serialized_key_size=-1,
            serialized_value_size=-1,
            headers=(),
            first_offset=first_offset,
            reason=reason,
        )


def decode_record(record: ConsumerRecord[bytes, bytes]) -> FileEvent:
    """The `FileEvent` of `record`, or `EventDecodeError` saying why it is not one.

    Besides the value (see `decode_event`), the key must be UTF-8 (the stream writes the
    object key there) and no header may be null (the stream writes none): a handler's
    `context.key` and `context.headers` are then exactly what was read.
    """
    if isinstance(record, UnreadableRecord):
        raise EventDecodeError(f"the record cannot be parsed: {record.reason}")
    key: bytes | None = record.key
    if key is not None:
        try:
            key.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EventDecodeError(f"the record key is not UTF-8: {exc}") from exc
    for name, value in record.headers:
        if value is None:
            raise EventDecodeError(f"the record header {name!r} has no value (null)")
    return decode_event(record.value)


def decode_event(value: bytes | None) -> FileEvent:
    """The `FileEvent` in `value`; fields this version does not know are ignored.

    Ignoring unknown fields keeps a consumer working when a newer stream adds one. The value
    is parsed by orjson, which refuses what `json` would turn into trouble later: lone
    surrogates (a `str` no UTF-8 encoder accepts), integers beyond a double's range
    (`json` raises `ValueError` past 4,300 digits), NaN, and nesting past 1,024 levels
    (`json` raises `RecursionError`); nesting is bounded further by `MAX_DEPTH`, walked in
    Python only for a value holding more than `MAX_DEPTH` opening brackets (orjson has no
    depth setting, and msgspec, whose decoder would bound it, is not a dependency yet).
    """
    if value is None:
        raise EventDecodeError("the record has no value (a tombstone), not an event")
    try:
        document: Any = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise EventDecodeError(f"the record value is not JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise EventDecodeError("the record value is not a JSON object")
    # Nesting d levels deep takes d opening brackets: a value with at most MAX_DEPTH of them
    # (every event of the stream but the deepest) is not walked. bytes.count runs in C.
    if value.count(b"{") + value.count(b"[") > MAX_DEPTH and _deeper_than(document, MAX_DEPTH):
        raise EventDecodeError(f"the record value is nested deeper than {MAX_DEPTH} levels")
    # The model forbids unknown fields (the stream writes exactly these); a newer stream's
    # extra ones are dropped here, the dict rebuilt only when there are some.
    known = (
        document
        if _FIELDS.issuperset(document)
        else {name: field for name, field in document.items() if name in _FIELDS}
    )
    try:
        return FileEvent.model_validate(known)
    except ValidationError as exc:
        raise EventDecodeError(f"the record value is not a canonical event: {exc}") from exc


def _deeper_than(document: dict[str, Any], limit: int) -> bool:
    """True when objects and arrays nest more than `limit` levels; without recursion."""
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False
