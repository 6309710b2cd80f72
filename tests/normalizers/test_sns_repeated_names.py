"""An SNS envelope naming a field twice is refused without a second parse
(streams.core.normalizers.s3 `refuse_repeated_names`): it decides as `json` with every
object's pairs decided before, on arbitrary envelopes, repeats spelt with escapes, names
inside strings, and texts that are not UTF-8."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.core.normalizers.base import MalformedDelivery, load_json
from streams.core.normalizers.s3 import _RepeatedName, _unique_names, refuse_repeated_names


def _by_json(text: bytes | str) -> bool:
    """The previous decision: a second parse by `json` with every object's pairs."""
    try:
        json.loads(text, object_pairs_hook=_unique_names)
    except _RepeatedName:
        return True
    except (ValueError, RecursionError):
        return False
    return False


def _refused(text: bytes | str) -> bool:
    try:
        refuse_repeated_names(text, load_json(text), "SNS")
    except MalformedDelivery as refused:
        assert str(refused) == "SNS message names a field twice"
        return True
    return False


def _object(pairs: list[tuple[str, Any]], escape: bool, colon: str = ": ") -> str:
    """A JSON object of `pairs` as written, repeats kept; names \\u-escaped when `escape`."""

    def name(text: str) -> str:
        if escape and text.isalnum():
            return '"' + "".join(f"\\u{ord(c):04x}" if c.isalpha() else c for c in text) + '"'
        return json.dumps(text)

    return "{" + ", ".join(f"{name(k)}{colon}{v}" for k, v in pairs) + "}"


NAMES = st.sampled_from(["Type", "Message", "MessageId", "a", "b", 'q"uote', "back\\slash", ""])
SCALARS = st.sampled_from(
    [
        '"Notification"',
        '"{\\"Records\\": [], \\"Message\\": \\"x\\"}"',
        "1",
        "null",
        '"a:b"',
        '"\\""',
    ]
)


@st.composite
def envelopes(draw: st.DrawFn) -> str:
    inner = [(draw(NAMES), draw(SCALARS)) for _ in range(draw(st.integers(0, 3)))]
    pairs: list[tuple[str, Any]] = [
        (draw(NAMES), draw(SCALARS)) for _ in range(draw(st.integers(0, 5)))
    ]
    if draw(st.booleans()):
        pairs.append(("MessageAttributes", _object(inner, draw(st.booleans()))))
    if draw(st.booleans()):
        pairs.append(("list", "[" + ", ".join([_object(inner, False), "2"]) + "]"))
    return _object(pairs, draw(st.booleans()), draw(st.sampled_from([": ", ":", " : ", "\n:\t"])))


@settings(max_examples=600, deadline=None)
@given(envelopes(), st.sampled_from(["utf-8", "utf-16", "utf-32-le", "utf-8-sig", "str"]))
def test_repeated_names_are_refused_as_before(text: str, encoding: str) -> None:
    body: bytes | str = text if encoding == "str" else text.encode(encoding)
    assert _refused(body) == _by_json(body)


@pytest.mark.parametrize(
    ("text", "repeated"),
    [
        ('{"Type": "Notification", "Message": "a", "Message": "b"}', True),
        ('{"Type": "Notification", "Message": "a", "Mess\\u0061ge": "b"}', True),
        ('{"Type": "Notification", "Message": "{\\"Message\\": 1, \\"Message\\": 2}"}', False),
        ('{"Type": "Notification", "MessageAttributes": {"k": {"Type": "S", "Type": "N"}}}', True),
        ('{"Type": "Notification", "MessageAttributes": {"k": {"Type": "S"}, "j": {}}}', False),
        ('{"Type": "Notification", "Message": "a\\\\", "Subject": "x:"}', False),
        ('{"Type" : "Notification" ,\n "Type"\t:\r"x"}', True),
    ],
)
def test_envelopes(text: str, repeated: bool) -> None:
    assert _refused(text) == _refused(text.encode()) == _by_json(text) == repeated
