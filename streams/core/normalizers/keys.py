"""Key decoding. Only S3 notification records and MinIO record keys are form-encoded;
every other provider sends keys raw, and decoding those would corrupt `+` and `%`."""

from __future__ import annotations

from urllib.parse import unquote_plus, unquote_to_bytes

from streams.core.normalizers.base import MalformedDelivery


def form_decode(key: str) -> str:
    """Decode an `application/x-www-form-urlencoded` key: `+` is a space, `%XX` is UTF-8.

    Exactly `unquote_plus(key, errors="strict")`, the short way for the keys S3 sends: with
    no `%`, only the `+`s change; an ASCII key (S3 escapes everything else) is one run of
    unquote_plus's split into ASCII and non-ASCII runs, which it decodes as done here.
    """
    spaced = key.replace("+", " ")
    if "%" not in spaced:
        return spaced
    try:
        if spaced.isascii():
            return unquote_to_bytes(spaced).decode("utf-8")
        return unquote_plus(key, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise MalformedDelivery(f"key is not valid percent-encoded UTF-8: {key!r}") from None
