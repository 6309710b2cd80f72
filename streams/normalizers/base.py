"""What every normalizer shares: its signature, its one error, and the value helpers.

A normalizer is a pure function `Delivery -> list[FileEvent]`. It does no I/O, reads no
clock, and raises nothing but `MalformedDelivery`.

Offered here:
* reading: `load_json` (the body, or a JSON string inside it, with every check a normalizer
  needs: JSON at all, not nested too deeply, no NaN/Infinity, no over-long integers, no
  lone UTF-16 surrogates) and `reject_lone_surrogates` (the last check, for text that did
  not come through `load_json`, such as Pub/Sub attributes);
* ids: `derived_id`, `record_hash_id`, and `change_id`, the version / time+etag / record
  hash fallback chain of providers that send no event id;
* times: `parse_time` (RFC 3339 / ISO 8601) and `parse_epoch_millis`, both giving UTC;
* values: `require_dict`, `require_str`, `optional_str`, `present` (`""` counts as absent),
  `optional_int` (sizes) and `strip_quotes` (ETags).
Key decoding lives in `streams.normalizers.keys`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from streams.delivery import Delivery
from streams.event import FileEvent, format_time

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
    integers longer than Python converts, and lone UTF-16 surrogates (`"\\ud800"`) in any
    string or object key at any depth, which no UTF-8 encoder downstream (ids, the output
    topic) can write. The surrogate scan only runs when the text may hold one (a `\\ud`
    escape, a UTF-16/32 body), so a normal UTF-8 body costs one parse and a byte search.
    """
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
    if isinstance(body, str):
        try:
            raw = body.encode("utf-8")
        except UnicodeEncodeError:  # a surrogate character in the text itself
            raise MalformedDelivery(
                f"{what} holds a lone UTF-16 surrogate (not valid Unicode)"
            ) from None
    else:
        raw = body
    # A NUL byte means UTF-16 or UTF-32 (json.loads reads those too), where the escape
    # is spelt in other bytes; valid UTF-8 JSON holds no NUL.
    if b"\\ud" in raw or b"\\uD" in raw or b"\x00" in raw:
        reject_lone_surrogates(value, what)
    return value


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
    material = json.dumps([provider, *parts], ensure_ascii=False, separators=(",", ":"))
    digest = hashlib.sha256(material.encode("utf-8", errors="surrogatepass")).hexdigest()
    return f"{provider}:{digest[:32]}"


def record_hash_id(provider: str, record: Any) -> str:
    """The last-resort id: a stable hash of the provider's record (keys sorted)."""
    try:
        material = json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:  # parsed near the recursion limit, dumped from deeper in the stack
        raise MalformedDelivery("the record is nested too deeply to hash") from None
    digest = hashlib.sha256(material.encode("utf-8", errors="surrogatepass")).hexdigest()
    return f"{provider}:h:{digest[:32]}"


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
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    # Python 3.11 accepts at most 6 fraction digits; Azure sends 7.
    if "." in text:
        head, _, rest = text.partition(".")
        end = 0
        while end < len(rest) and rest[end].isdigit():
            end += 1
        text = f"{head}.{rest[:end][:6].ljust(6, '0')}{rest[end:]}"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise MalformedDelivery(f"{what} is not an RFC 3339 time: {value!r}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except (OverflowError, ValueError):
        raise MalformedDelivery(f"{what} is out of range: {value!r}") from None


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
    return optional_str(value, what) or None
