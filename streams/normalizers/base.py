"""What every normalizer shares: its signature, its one error, and id/time helpers.

A normalizer is a pure function `Delivery -> list[FileEvent]`. It does no I/O, reads no
clock, and raises nothing but `MalformedDelivery`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from streams.delivery import Delivery
from streams.event import FileEvent

Normalizer = Callable[[Delivery], list[FileEvent]]

MAX_JSON_DEPTH = 64


class MalformedDelivery(ValueError):
    """The delivery cannot be read as this source's notification; the message says why."""


def _reject_constant(name: str) -> Any:
    raise MalformedDelivery(f"JSON constant {name} is not allowed")


def _has_lone_surrogate(value: Any, depth: int = 0) -> bool:
    if depth > MAX_JSON_DEPTH:
        return False
    if isinstance(value, str):
        return any("\ud800" <= char <= "\udfff" for char in value)
    if isinstance(value, dict):
        return any(
            _has_lone_surrogate(key, depth + 1) or _has_lone_surrogate(item, depth + 1)
            for key, item in value.items()
        )
    if isinstance(value, list):
        return any(_has_lone_surrogate(item, depth + 1) for item in value)
    return False


def load_json(body: bytes | str, what: str = "body") -> Any:
    """Parse JSON, turning every failure into MalformedDelivery.

    Also refused: NaN/Infinity, and lone UTF-16 surrogate escapes (`"\\ud800"`), which no
    UTF-8 encoder downstream (ids, the output topic) can write.
    """
    try:
        value = json.loads(body, parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedDelivery(f"{what} is not JSON: {exc}") from None
    except RecursionError:
        raise MalformedDelivery(f"{what} is nested too deeply") from None
    except ValueError as exc:  # e.g. an integer longer than Python's digit limit
        raise MalformedDelivery(f"{what} is not usable JSON: {exc}") from None
    raw = body if isinstance(body, bytes) else body.encode("utf-8", errors="surrogatepass")
    if b"\\ud" in raw.lower() and _has_lone_surrogate(value):
        raise MalformedDelivery(f"{what} holds a lone UTF-16 surrogate escape")
    return value


def derived_id(provider: str, *parts: str | int | None) -> str:
    """An event id built from the parts that identify one change (type, bucket, key, marker).

    Deterministic: the same parts give the same id on every run and machine.
    """
    material = json.dumps([provider, *parts], ensure_ascii=False, separators=(",", ":"))
    digest = hashlib.sha256(material.encode("utf-8", errors="surrogatepass")).hexdigest()
    return f"{provider}:{digest[:32]}"


def record_hash_id(provider: str, record: Any) -> str:
    """The last-resort id: a stable hash of the provider's record (keys sorted)."""
    material = json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    digest = hashlib.sha256(material.encode("utf-8", errors="surrogatepass")).hexdigest()
    return f"{provider}:h:{digest[:32]}"


def parse_time(value: Any, what: str = "time") -> datetime | None:
    """An RFC 3339 / ISO 8601 timestamp (any fraction length, `Z` or offset) as UTC, or None."""
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
        digits = ""
        while rest and rest[0].isdigit():
            digits, rest = digits + rest[0], rest[1:]
        text = f"{head}.{digits[:6].ljust(6, '0')}{rest}"
    try:
        parsed = datetime.fromisoformat(text)
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.astimezone(UTC)
    except (ValueError, OverflowError):
        raise MalformedDelivery(f"{what} is not an RFC 3339 time: {value!r}") from None


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
    """A size-like field that providers send as a number or a decimal string."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise MalformedDelivery(f"{what} is not an integer: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 30:
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise MalformedDelivery(f"{what} is not an integer: {value!r}")


def strip_quotes(etag: str | None) -> str | None:
    """An ETag without one pair of surrounding double quotes (Azure, Supabase quote them)."""
    if etag is not None and len(etag) >= 2 and etag[0] == etag[-1] == '"':
        return etag[1:-1]
    return etag


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
