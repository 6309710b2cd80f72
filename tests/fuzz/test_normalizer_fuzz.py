"""Every normalizer, through the registry, against hostile bodies: only events or
`MalformedDelivery` may come out, never another exception, a hang or a crash.

Beyond each source's own property tests (tests/normalizers), this covers the shapes a fuzzer
finds first: 100,000-deep nesting (bare and inside a valid envelope), 5 MB bodies, UTF-16/32
and BOM-prefixed bodies, invalid UTF-8, NUL bytes, and random bytes with random headers and
attributes.
"""

from __future__ import annotations

import base64
import codecs
import json
import time
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.core.delivery import Delivery
from streams.core.event import FileEvent
from streams.core.normalizers import SOURCES, MalformedDelivery, normalize

DEEP = 100_000
FIVE_MB = 5 * 1024 * 1024
# Generous: a 5 MB body must be decided in seconds on a loaded 2-core CI machine, not minutes.
SLOW_S = 20.0


def outcome(delivery: Delivery) -> str:
    """ "events" or "malformed"; anything else escaping fails the test."""
    started = time.monotonic()
    try:
        events = normalize(delivery)
    except MalformedDelivery as exc:
        assert str(exc), "a malformed delivery says why"
        result = "malformed"
    else:
        for event in events:
            assert isinstance(event, FileEvent)
            event.model_dump_json()  # every event must be writable to the output topic
        result = "events"
    assert time.monotonic() - started < SLOW_S, f"{delivery.source} took too long"
    return result


def deep_array(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def deep_object(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


def sns_with(message: str) -> bytes:
    return json.dumps({"Type": "Notification", "MessageId": "m", "Message": message}).encode()


def push_with(data: bytes) -> bytes:
    return json.dumps(
        {
            "message": {
                "data": base64.b64encode(data).decode(),
                "attributes": {"eventType": "OBJECT_FINALIZE", "payloadFormat": "JSON_API_V1"},
                "messageId": "1",
            },
            "subscription": "projects/p/subscriptions/s",
        }
    ).encode()


S3_RECORD = {
    "eventVersion": "2.1",
    "eventSource": "aws:s3",
    "eventTime": "2026-11-30T00:00:00.000Z",
    "eventName": "ObjectCreated:Put",
    "s3": {"bucket": {"name": "b"}, "object": {"key": "k", "size": 1, "sequencer": "0A"}},
}

HOSTILE: dict[str, Callable[[], bytes]] = {
    "deep array": lambda: deep_array(DEEP),
    "deep object": lambda: deep_object(DEEP),
    "deep inside Records": lambda: b'{"Records":' + deep_array(DEEP) + b"}",
    "deep inside an SNS Message": lambda: sns_with(deep_array(DEEP).decode()),
    "SNS in SNS in SNS ... (12 levels)": lambda: _nested_sns(12),
    "deep inside base64 (queue / push data)": lambda: base64.b64encode(deep_array(DEEP)),
    "deep inside a push envelope": lambda: push_with(deep_object(DEEP)),
    "5 MB string": lambda: json.dumps({"Records": [], "x": "a" * FIVE_MB}).encode(),
    "5 MB of records": lambda: (
        json.dumps({"Records": [S3_RECORD] * 12_000}).encode()[:FIVE_MB] + b"]}"
    ),
    "5 MB array of numbers": lambda: b"[" + b"1," * (FIVE_MB // 2) + b"1]",
    "5 MB random-ish bytes": lambda: bytes(range(256)) * (FIVE_MB // 256),
    "5 MB base64": lambda: base64.b64encode(b"\x00\xff" * (FIVE_MB // 2)),
    "huge number": lambda: b'{"Records": [' + b"9" * 100_000 + b"]}",
    "huge exponent": lambda: b'{"Records": [1e999999999]}',
    "UTF-16 LE with BOM": lambda: codecs.BOM_UTF16_LE + json.dumps(S3_RECORD).encode("utf-16-le"),
    "UTF-16 BE without BOM": lambda: json.dumps({"Records": [S3_RECORD]}).encode("utf-16-be"),
    "UTF-32": lambda: json.dumps({"Records": [S3_RECORD]}).encode("utf-32"),
    "UTF-8 with BOM": lambda: codecs.BOM_UTF8 + json.dumps({"Records": [S3_RECORD]}).encode(),
    "latin-1 key": lambda: json.dumps({"Records": [S3_RECORD]}).encode().replace(b'"k"', b'"\xe9"'),
    "invalid UTF-8": lambda: b'{"Records": [{"s3": "\xc3\x28\xa0\xa1\xf0\x28\x8c\xbc"}]}',
    "lone surrogate escape": lambda: b'{"Records": [{"eventName": "\\ud800"}]}',
    "NUL bytes": lambda: b"\x00" * 1000,
    "empty": lambda: b"",
    "whitespace": lambda: b" \n\t" * 1000,
    "NaN and Infinity": lambda: b'{"Records": [NaN, Infinity, -Infinity]}',
    "duplicate keys": lambda: b'{"Records": [], "Records": {"a": 1}}',
}


def _nested_sns(levels: int) -> bytes:
    body = json.dumps({"Records": [S3_RECORD]})
    for _ in range(levels):
        body = sns_with(body).decode()
    return body.encode()


@pytest.fixture(scope="module")
def hostile_bodies() -> dict[str, bytes]:
    return {name: build() for name, build in HOSTILE.items()}


@pytest.mark.parametrize("source", SOURCES)
def test_hostile_bodies_are_events_or_malformed(
    source: str, hostile_bodies: dict[str, bytes]
) -> None:
    for name, body in hostile_bodies.items():
        try:
            outcome(Delivery(source=source, body=body))
        except AssertionError as exc:
            raise AssertionError(f"{source} / {name}: {exc}") from exc
        except BaseException as exc:  # RecursionError, MemoryError, ...: the stream's crash
            raise AssertionError(f"{source} / {name}: {type(exc).__name__}: {exc}") from exc


@pytest.mark.parametrize("source", SOURCES)
def test_hostile_headers_and_attributes(source: str) -> None:
    body = json.dumps({"Records": [S3_RECORD]}).encode()
    huge = "x" * 1_000_000
    for headers, attributes in [
        ({"content-type": "text/plain; charset=utf-16"}, {}),
        ({"x": huge, "ce-id": huge, "ce-type": "\x00"}, {"eventType": huge}),
        ({}, {"eventType": "OBJECT_FINALIZE", "objectGeneration": "9" * 10_000}),
        ({}, {"eventType": "OBJECT_FINALIZE", "objectGeneration": "\ud800"}),
        ({}, {"payloadFormat": "NONE", "eventType": "OBJECT_DELETE", "objectId": "..%2F.."}),
    ]:
        outcome(Delivery(source=source, body=body, headers=headers, attributes=attributes))


text_maps = st.dictionaries(
    st.sampled_from(
        [
            "eventType",
            "payloadFormat",
            "bucketId",
            "objectId",
            "objectGeneration",
            "eventTime",
            "overwroteGeneration",
            "content-type",
            "x-amz-sns-message-type",
            "aeg-event-type",
        ]
    )
    | st.text(max_size=10),
    st.text(max_size=30),
    max_size=6,
)


@settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    source=st.sampled_from(SOURCES),
    body=st.binary(max_size=2000)
    | st.text(max_size=500).map(lambda text: text.encode("utf-8", "surrogatepass"))
    | st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda children: (
            st.lists(children, max_size=5)
            | st.dictionaries(st.text(max_size=10), children, max_size=5)
        ),
        max_leaves=30,
    ).map(lambda value: json.dumps(value).encode()),
    headers=text_maps,
    attributes=text_maps,
)
def test_random_deliveries_are_events_or_malformed(
    source: str, body: bytes, headers: dict[str, str], attributes: dict[str, str]
) -> None:
    outcome(Delivery(source=source, body=body, headers=headers, attributes=attributes))


def test_an_unknown_source_is_malformed() -> None:
    for source in ["", "S3", "s3 ", "../s3", "s3/../gcs", "__init__", "base", "keys", "\x00"]:
        assert outcome(Delivery(source=source, body=b"{}")) == "malformed", source
