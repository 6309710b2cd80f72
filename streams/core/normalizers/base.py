"""What every normalizer shares: its signature, its one error, and the value helpers.

A normalizer is a pure function `Delivery -> list[FileEvent]`. It does no I/O, reads no
clock, and raises nothing but `MalformedDelivery`.

Offered here:
* reading: `load_json` (the body, or a JSON string inside it, with every check a normalizer
  needs: JSON at all, not nested too deeply, no NaN/Infinity, no over-long integers, no
  lone UTF-16 surrogates; msgspec first, orjson and the standard library for what it
  refuses) and `reject_lone_surrogates` (the last check, for text that did not come
  through `load_json`, such as Pub/Sub attributes);
* ids: `derived_id`, `record_hash_id`, and `change_id`, the version / time+etag / record
  hash fallback chain of providers that send no event id;
* times: `parse_time` (RFC 3339 / ISO 8601) and `parse_epoch_millis`, both giving UTC;
* values: `require_dict`, `require_str`, `optional_str`, `present` (`""` counts as absent),
  `optional_int` (sizes) and `strip_quotes` (ETags).
Key decoding lives in `streams.core.normalizers.keys`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec
import orjson

from streams.core.delivery import Delivery
from streams.core.event import FileEvent, format_time

Normalizer = Callable[[Delivery], list[FileEvent]]

# optional_int takes decimal strings up to this length: far beyond any size, far below the
# length at which int() becomes slow or refuses.
_MAX_INT_DIGITS = 30


class MalformedDelivery(ValueError):
    """The delivery cannot be read as this source's notification; the message says why."""


class _NonFinite(ValueError):
    """A JSON number that is NaN or infinite (a literal constant, or a float that overflows)."""


def _reject_constant(name: str) -> Any:
    raise _NonFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # e.g. 1e400, which float() turns into inf
        raise _NonFinite(text)
    return value


def load_json(body: bytes | str, what: str = "body") -> Any:
    """Parse JSON, turning every failure into MalformedDelivery.

    Also refused: NaN/Infinity (as constants or as numbers too large for a float),
    integers longer than Python converts, and lone UTF-16 surrogates (`"\\ud800"`, or the
    UTF-8-style bytes of one) in any string or object key at any depth, which no UTF-8
    encoder downstream (ids, the output topic) can write.

    msgspec reads nearly every body (`_decode`): it refuses all of the above by itself, and
    reads an integer of any length (up to Python's digit limit) exactly, so its value is the
    one the readers below give, with no scan of the body for long integers. Whatever it
    refuses, or nests deeper than it reads, is read as before (`_load_json_fast`): by
    orjson, several times faster than `json`; where orjson differs from `json`, by the
    standard library (`_load_json_slowly`), so that every refusal keeps its reason and
    message: a body orjson refuses (UTF-16/32 and BOM-prefixed bodies are JSON to `json`),
    and one that may hold an integer outside the 64-bit range, which orjson reads as a float
    that has lost digits (`_may_hold_long_integer`). Nesting is refused beyond 1024 levels,
    where `json` gave up at Python's recursion limit.
    """
    if isinstance(body, str):
        try:
            raw = body.encode("utf-8")
        except UnicodeEncodeError:  # a surrogate character in the text itself
            raise MalformedDelivery(
                f"{what} holds a lone UTF-16 surrogate (not valid Unicode)"
            ) from None
    else:
        raw = body
    try:
        return _decode(raw)
    except (msgspec.DecodeError, ValueError, RecursionError):  # UnicodeDecodeError: ValueError
        return _load_json_fast(body, raw, what)  # it decides, and says why


_decode = msgspec.json.Decoder().decode
"""msgspec's reading of any JSON value: dicts, lists, str, int (any length), float, bool, None."""


def _load_json_fast(body: bytes | str, raw: bytes, what: str) -> Any:
    """`load_json` by orjson, else by the standard library (see load_json)."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _load_json_slowly(body, raw, what)  # it decides, and says why
    if _may_have_misread_integer(value, raw):
        return _load_json_slowly(body, raw, what)
    return value


def _may_have_misread_integer(value: Any, raw: bytes) -> bool:
    """Whether orjson may have read an integer of `raw` as a float (see load_json)."""
    if type(value) is dict:
        for item in value.values():
            if type(item) is not str:
                break
        else:
            # An object of strings (an SNS envelope) holds no number; asking this of the
            # parsed envelope is far cheaper than asking `_may_hold_long_integer` of its
            # bytes, which are mostly its Message.
            return False
    return _may_hold_long_integer(raw)


def _may_hold_long_integer(raw: bytes) -> bool:
    """Whether `raw` may hold a number whose integer part has 19 or more digits (the fewest
    that can leave the 64-bit range: -9999999999999999999), if it is JSON at all.

    In JSON a number starts the document or follows `:`, `,` or `[`, then whitespace and
    a `-`. With whitespace and `-` deleted, digits turned to `0`, those three delimiters to
    `b` and every other byte to `x`, such a number becomes `b` and 19 zeros (or starts with
    19 zeros). A digit run inside a string (an Azure sequencer, a Terraform name such as
    `tf-s3-queue-20180307174600377300000002`) does not, unless a delimiter precedes it,
    which only costs the slower parse. One `translate` and one search: about a nanosecond
    a byte, a tenth of what a regex costs.
    """
    marked = raw.translate(_NUMBER_MARKS, b" \t\n\r-")
    # find, not `in`: `in` on bytes first tries its operand as an integer, and raises and
    # drops a TypeError on every call.
    return marked.find(_LONG_INTEGER) >= 0 or marked.startswith(_LONG_DIGITS)


_NUMBER_MARKS = bytes(
    ord("0") if byte in b"0123456789" else ord("b") if byte in b":,[" else ord("x")
    for byte in range(256)
)
_LONG_DIGITS = b"0" * 19
_LONG_INTEGER = b"b" + _LONG_DIGITS


def _load_json_slowly(body: bytes | str, raw: bytes, what: str) -> Any:
    """`load_json` by the standard library, which reads UTF-8, UTF-16 and UTF-32 bodies
    (BOM or not) and integers of any length; `raw` is `body` as bytes."""
    try:
        value = json.loads(body, parse_constant=_reject_constant, parse_float=_finite_float)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedDelivery(f"{what} is not JSON: {exc}") from None
    except RecursionError:
        raise MalformedDelivery(f"{what} is nested too deeply") from None
    except _NonFinite as exc:
        raise MalformedDelivery(
            f"{what} holds the non-finite number {exc.args[0]}, which JSON does not allow"
        ) from None
    except ValueError as exc:  # e.g. an integer longer than Python's digit limit
        raise MalformedDelivery(f"{what} is not usable JSON: {exc}") from None
    # The surrogate scan only runs when the text may hold one: a `\\ud` escape; a NUL
    # byte, which means UTF-16 or UTF-32 (valid UTF-8 JSON holds none), where the escape is
    # spelt in other bytes; or the UTF-8-style bytes of a surrogate (ED A0..ED BF), which
    # json.loads decodes rather than refuses.
    if b"\\ud" in raw or b"\\uD" in raw or b"\x00" in raw or _ENCODED_SURROGATE.search(raw):
        reject_lone_surrogates(value, what)
    return value


_ENCODED_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")


def reject_lone_surrogates(value: Any, what: str) -> None:
    """MalformedDelivery if a string in `value` (dict keys included, at any depth) holds a
    lone UTF-16 surrogate: it is no text, and no UTF-8 encoder downstream can write it.

    Walks dicts and lists with an explicit stack, so no depth is too deep for it.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise MalformedDelivery(
                    f"{what} holds a lone UTF-16 surrogate (not valid Unicode)"
                ) from None
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def derived_id(provider: str, *parts: str | int | None) -> str:
    """An event id built from the parts that identify one change (type, bucket, key, marker).

    Deterministic: the same parts give the same id on every run and machine.
    """
    try:
        # For strings, None and 64-bit integers, orjson writes exactly the bytes of
        # `_COMPACT_JSON` encoded in UTF-8 (tests/normalizers/test_base.py holds it to that).
        material = orjson.dumps([provider, *parts])
    except orjson.JSONEncodeError:  # an integer beyond 64 bits, a lone surrogate
        material = _COMPACT_JSON.encode([provider, *parts]).encode("utf-8", "surrogatepass")
    return f"{provider}:{hashlib.sha256(material).hexdigest()[:32]}"


def record_hash_id(provider: str, record: Any) -> str:
    """The last-resort id: a stable hash of the provider's record (keys sorted)."""
    try:
        material = _SORTED_COMPACT_JSON.encode(record)
    except RecursionError:  # parsed near the recursion limit, dumped from deeper in the stack
        raise MalformedDelivery("the record is nested too deeply to hash") from None
    digest = hashlib.sha256(material.encode("utf-8", errors="surrogatepass")).hexdigest()
    return f"{provider}:h:{digest[:32]}"


# The id material's JSON. The encoders are built once: `json.dumps` with options builds one
# on every call.
_COMPACT_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_SORTED_COMPACT_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def change_id(
    provider: str,
    kind: str,
    bucket: str | None,
    key: str,
    version: str | int | None,
    time: datetime | None,
    etag: str | None,
    record: Any,
) -> str:
    """The id of one change, for providers that send no event id.

    `derived_id(provider, kind, bucket, key, version)` when there is a version (or another
    per-write marker); without one, `derived_id(provider, kind, bucket, key, None, time,
    etag)` with the time in RFC 3339 UTC (`format_time`); with neither time nor etag,
    `record_hash_id(provider, record)`.
    """
    if version is not None:
        return derived_id(provider, kind, bucket, key, version)
    if time is not None or etag is not None:
        stamp = format_time(time) if time is not None else None
        return derived_id(provider, kind, bucket, key, None, stamp, etag)
    return record_hash_id(provider, record)


def parse_time(value: Any, what: str = "time") -> datetime | None:
    """An RFC 3339 / ISO 8601 timestamp (any fraction length, `Z` or offset) as UTC, or None.

    MalformedDelivery when it is no such time, or when its UTC form leaves datetime's range
    (year 1 with a positive offset, year 9999 with a negative one).
    """
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise MalformedDelivery(f"{what} is not a string: {value!r}")
    # Most times need no rewriting (`_iso_text`): fromisoformat reads them as they come, with
    # the same meaning. Not so a `.` in the first 11 characters: that is where the date ends,
    # and fromisoformat takes any character as the date-time separator, where `_iso_text`
    # reads the `.` as the start of a fraction (and so refuses the time).
    parsed = _from_iso(value) if "." not in value[:11] else None
    if parsed is None:
        parsed = _from_iso(_iso_text(value))
        if parsed is None:
            raise MalformedDelivery(f"{what} is not an RFC 3339 time: {value!r}")
    if parsed.tzinfo is UTC:
        return parsed
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except (OverflowError, ValueError):
        raise MalformedDelivery(f"{what} is out of range: {value!r}") from None


def _from_iso(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _iso_text(value: str) -> str:
    """`value` in the form `datetime.fromisoformat` reads: no surrounding spaces, `+00:00`
    for a `Z` or `z`, and exactly 6 fraction digits (Azure sends 7, more than
    fromisoformat is documented to read)."""
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    if "." in text:
        head, _, rest = text.partition(".")
        end = 0
        while end < len(rest) and rest[end].isdigit():
            end += 1
        text = f"{head}.{rest[:end][:6].ljust(6, '0')}{rest[end:]}"
    return text


def parse_epoch_millis(value: Any, what: str = "time") -> datetime | None:
    """Milliseconds since the Unix epoch as UTC, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MalformedDelivery(f"{what} is not a number of milliseconds: {value!r}")
    try:
        return datetime.fromtimestamp(value / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        raise MalformedDelivery(f"{what} is out of range: {value!r}") from None


def optional_int(value: Any, what: str) -> int | None:
    """A size-like field that providers send as a number or a decimal string, or None.

    Only ASCII digit strings of at most 30 digits are read: `"²"`, `"١٢"` and 5000-digit
    strings are MalformedDelivery like any other non-integer.
    """
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise MalformedDelivery(f"{what} is not an integer: {value!r}")
    if isinstance(value, int):
        return value
    if (
        isinstance(value, str)
        and value.isascii()
        and value.isdigit()
        and len(value) <= _MAX_INT_DIGITS
    ):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise MalformedDelivery(f"{what} is not an integer: {value!r}")


def strip_quotes(etag: str | None) -> str | None:
    """An ETag without one pair of surrounding double quotes (Azure, Supabase, S3 docs quote
    them); None for no ETag, an empty one, or `""` alone."""
    if etag is not None and len(etag) >= 2 and etag[0] == etag[-1] == '"':
        etag = etag[1:-1]
    return etag or None


def require_dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedDelivery(f"{what} is not a JSON object")
    return value


def require_str(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise MalformedDelivery(f"{what} is missing or not a string")
    return value


def optional_str(value: Any, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise MalformedDelivery(f"{what} is not a string: {value!r}")
    return value


def present(value: Any, what: str) -> str | None:
    """An optional string; `""` (a Go zero value, an unset column) counts as absent."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise MalformedDelivery(f"{what} is not a string: {value!r}")
    return value
