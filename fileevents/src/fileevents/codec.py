"""Reading a record as the canonical event the stream wrote, or refusing it as malformed.

Anyone who can write to an output topic can put any bytes on it, so this is the library's
trust boundary: a record reaches the handlers only as a `FileEvent` whose every string is
valid Unicode, read from a key, headers and value of the shape the stream writes. Everything
else raises `EventDecodeError` (and is dead-lettered), never an exception of another kind.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
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
    value = record.value
    if value is not None:  # `decode_event(value)`, its first step inlined: per record
        try:
            event = _decode_event_fast(value)
        except (msgspec.DecodeError, ValueError, TypeError, RecursionError):
            pass
        else:
            if event is not None:
                return event
    return _decode_event_validated(value)


def decode_event(value: bytes | None) -> FileEvent:
    """The `FileEvent` in `value`; fields this version does not know are ignored.

    Ignoring unknown fields keeps a consumer working when a newer stream adds one. What is
    read, and what is refused and why, is `_decode_event_validated`'s decision; a value the
    stream wrote is read by `_decode_event_fast` (msgspec, no pydantic validation, no Python
    walk), which vouches for its result being exactly that decision's, and hands every value
    it cannot vouch for to `_decode_event_validated`.
    """
    if value is not None:
        try:
            event = _decode_event_fast(value)
        except (msgspec.DecodeError, ValueError, TypeError, RecursionError):
            pass  # not the stream's shape, or not JSON: decided (and explained) below
        else:
            if event is not None:
                return event
    return _decode_event_validated(value)


def _decode_event_validated(value: bytes | None) -> FileEvent:
    """`decode_event`'s decision for any value: orjson, then the `FileEvent` model.

    The value is parsed by orjson, which refuses what `json` would turn into trouble later:
    lone surrogates (a `str` no UTF-8 encoder accepts), integers beyond a double's range
    (`json` raises `ValueError` past 4,300 digits), NaN, and nesting past 1,024 levels
    (`json` raises `RecursionError`); nesting is bounded further by `MAX_DEPTH`, walked in
    Python only for a value holding more than `MAX_DEPTH` opening brackets (orjson has no
    depth setting).
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


FAST_RAW_LEVELS = 8
"""How deep `raw`'s values may nest for `_decode_event_fast` to read the event: objects and
arrays down to level 10 of the value (the event object is level 1, `raw` level 2). msgspec
refuses the first array or object below that (as not of `_raw_value`'s type) before reading
on, and a deeper value (none of the providers' records nests so deep) is read by
`_decode_event_validated`, which applies MAX_DEPTH: msgspec's own bound on nesting is
Python's recursion limit (`Py_EnterRecursiveCall`: about 1,000 levels less the stack in use,
depending on the Python), not a depth it can be given. msgspec builds the type as a tree of
2^FAST_RAW_LEVELS nodes (about 5 ms at import for 8)."""

_INT64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
"""The integers msgspec and orjson read alike: orjson reads one beyond 64 bits as a float
(which pydantic refuses for `size`), msgspec reads it exactly; one of 2^63..2^64-1 (which
both read as an `int`) is left to the validated path too (msgspec bounds only in int64)."""


def _raw_value(levels: int) -> Any:
    """The type of a JSON value nested at most `levels` levels deep: scalars as orjson
    reads them, and arrays and objects of the next level's values (none at level 0)."""
    value: Any = None | bool | _INT64 | float | str
    for _ in range(levels):
        value = None | bool | _INT64 | float | str | list[value] | dict[str, value]
    return value


if TYPE_CHECKING:
    _RawValue = Any
else:
    _RawValue = _raw_value(FAST_RAW_LEVELS)


class _WrittenEvent(msgspec.Struct, forbid_unknown_fields=True):
    """A record value of exactly the shape the stream writes (`FileEvent.model_dump_json`):
    every field present (so the fields set are all of them, as validation would have it),
    none other, each of exactly the type validation would produce from it. msgspec refuses
    anything else, which then goes to `_decode_event_validated`: an unknown field (which
    msgspec would skip without checking its text, while orjson refuses a lone surrogate or
    NaN anywhere), a missing one, a type pydantic's lax mode would convert (`"1"` or `1.0`
    for `size`, `1` for `version_only`), an integer outside 64 bits, `raw` nested deeper
    than FAST_RAW_LEVELS, a `time` not exactly as the stream writes it (`_WRITTEN_TIME`)."""

    id: str
    type: Literal["created", "deleted"]
    key: str
    bucket: str | None
    size: _INT64 | None
    etag: str | None
    version_id: str | None
    time: str | None
    sequencer: str | None
    provider: str
    version_only: bool | None
    raw: dict[str, _RawValue] | None


_read_written = msgspec.json.Decoder(_WrittenEvent).decode


class Identity(msgspec.Struct):
    """What an event's dedupe id is made of (`id`, and `provider` and `raw` for its scope),
    and its `type`, read alone: the other fields are skipped."""

    id: str
    type: str
    provider: str
    raw: dict[str, Any] | None = None


_read_identity = msgspec.json.Decoder(Identity).decode


def read_identity(value: bytes) -> Identity | None:
    """The `Identity` of the event in `value`, None when it cannot be read so: cheap, and
    kept by no one, to look the event's id up ahead of it. Not a decision: the event read
    by `decode_record` later is what counts (the caller compares the ids)."""
    try:
        return _read_identity(value)
    except Exception:  # any value: what it is is decode_record's to say
        return None


_WRITTEN_TIME = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{6})?Z"
).fullmatch
"""`format_time`'s output, the stream's `time`: RFC 3339 in UTC, `Z`, whole seconds or six
digits of them. The hour is bounded here (pydantic refuses `24:00`, and what Python's
`fromisoformat` makes of it has varied); the other fields' ranges both refuse alike."""


def _utc_time_py311(text: str) -> datetime:
    """`text` (matching `_WRITTEN_TIME`) as the aware datetime it names, tzinfo `UTC`."""
    return datetime.fromisoformat(text)  # reads `Z` as UTC (Python 3.11+)


def _utc_time_py310(text: str) -> datetime:
    """`_utc_time_py311` for Python 3.10, whose `fromisoformat` does not read `Z`."""
    return datetime.fromisoformat(text[:-1] + "+00:00")


_utc_time = _utc_time_py311 if sys.version_info >= (3, 11) else _utc_time_py310


def _decode_event_fast(value: bytes) -> FileEvent | None:
    """The event in `value` when it is of `_WrittenEvent`'s shape, else None or msgspec's
    (or `fromisoformat`'s) error: then `_decode_event_validated` decides.

    What it returns is what `_decode_event_validated` returns for `value`: msgspec reads
    JSON as orjson does where it accepts it (it refuses lone surrogates, invalid UTF-8,
    NaN and numbers beyond a double; duplicate names keep the last value, as orjson's
    dict does), every field is of its exact type, and `time`, in the one shape pydantic
    and `fromisoformat` read alike, is in UTC: what `FileEvent.from_checked` requires of
    its caller. Held to that by tests/fileevents-alone/test_codec_fast_path.py.
    """
    written = _read_written(value)
    time: datetime | None = None
    if written.time is not None:
        if _WRITTEN_TIME(written.time) is None:
            return None
        time = _utc_time(written.time)
    return FileEvent.from_checked(
        id=written.id,
        type=written.type,
        key=written.key,
        bucket=written.bucket,
        size=written.size,
        etag=written.etag,
        version_id=written.version_id,
        time=time,
        sequencer=written.sequencer,
        provider=written.provider,
        version_only=written.version_only,
        raw=written.raw,
    )


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
