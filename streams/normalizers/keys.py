"""Key decoding. Only S3 notification records and MinIO record keys are form-encoded;
every other provider sends keys raw, and decoding those would corrupt `+` and `%`."""

from __future__ import annotations

from urllib.parse import unquote_plus

from streams.normalizers.base import MalformedDelivery


def form_decode(key: str) -> str:
    """Decode an `application/x-www-form-urlencoded` key: `+` is a space, `%XX` is UTF-8."""
    try:
        return unquote_plus(key, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise MalformedDelivery(f"key is not valid percent-encoded UTF-8: {key!r}") from None
