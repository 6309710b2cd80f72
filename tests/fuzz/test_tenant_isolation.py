"""Tenant isolation, as a property: an event lands in exactly the instances whose bucket and
prefix contain it (the prefix on a path boundary), with the prefix stripped, and in no other.

Pure: the instance rules as the worker builds and applies them (streams.policies
`instance_rules`, streams.core.rules `apply_rules`) for events, and `streams.core.routing.route`
for whole raw deliveries (S3, whose keys are form-encoded on the wire, and GCS, whose keys are
raw), so that the decoding of `%2F`, `+` and unicode happens before the rules and cannot smuggle
a key into another tenant. The oracle below is written independently of `under_prefix`: path
segments.

Dot segments: an instance with a prefix hands its consumers the key relative to it, and they
join it to a root of theirs. A key that, read the way a consumer or SDK might read it (as is,
`\\` as a separator, percent-decoded until decoding changes nothing), resolves above that
root at some point, or to the root itself, or names a root of its own (`/`, `\\`, a drive),
is not the instance's (`prefix-escape`). The oracle joins each reading to a root with
`posixpath.join` and resolves it with `posixpath.normpath`, prefix by prefix, rather than
counting segments as streams.core.rules does.
"""

from __future__ import annotations

import json
import posixpath
import re
import urllib.parse
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.config import InstanceConfig, Settings
from streams.core.event import FileEvent
from streams.core.records import RawRecord, parse_keyed
from streams.core.routing import route
from streams.core.rules import Filtered, apply_rules
from streams.policies import instance_rules
from streams.stages.normalize import route_policy

# Pieces that make look-alike and traversal-shaped keys and prefixes.
SEGMENTS = [
    "tenant-a",
    "tenant-ab",
    "tenant-a ",
    "tenant-a\u200b",  # zero-width space
    "tenant-\u0430",  # Cyrillic a
    "\uff54enant-a",  # fullwidth t
    "TENANT-A",
    "tenant-a%2F",
    "%2F",
    "%2f..",
    "..",
    ".",
    "",
    "a+b",
    "a b",
    "日本",
    "e\u0301",  # e + combining acute (NFD)
    "\u00e9",  # é (NFC)
    "\\",
    "tenant-a\\x",
]

segment = st.sampled_from(SEGMENTS) | st.text(min_size=0, max_size=6)
path = st.lists(segment, min_size=1, max_size=5).map("/".join)
BUCKETS = ["uploads", "uploads-b", None]


ROOT = "/consumer-root"


def apply_instance(event: FileEvent, instance: InstanceConfig) -> FileEvent | Filtered:
    """The event as `instance` sees it: its rules as the worker builds them, applied."""
    return apply_rules(event, instance_rules(instance))


def readings(relative: str) -> list[str]:
    """The ways a consumer might read a relative key: as is, percent-decoded again and again,
    and each of those with backslashes as separators."""
    found = [relative]
    while (decoded := urllib.parse.unquote(found[-1])) != found[-1]:
        found.append(decoded)
    return found + [reading.replace("\\", "/") for reading in found]


def resolves_outside(reading: str) -> bool:
    """Whether joining `reading` to ROOT leaves ROOT on the way, or ends on ROOT itself: a
    reading naming a drive (Windows) or a root of its own (`join` keeps an absolute path)
    replaces ROOT."""
    if re.match(r"[A-Za-z]:", reading):
        return True
    parts = reading.split("/")
    for end in range(1, len(parts) + 1):
        here = posixpath.normpath(posixpath.join(ROOT, "/".join(parts[:end])))
        if here != ROOT and not here.startswith(ROOT + "/"):
            return True
    return posixpath.normpath(posixpath.join(ROOT, reading)) == ROOT


def oracle(key: str, bucket: str | None, instance: InstanceConfig) -> str | None:
    """The key the instance sees, or None when the event is not the instance's."""
    if instance.bucket is not None and bucket is not None and bucket != instance.bucket:
        return None
    if not instance.prefix:
        return key
    prefix_parts = instance.prefix.split("/")
    key_parts = key.split("/")
    if key_parts[: len(prefix_parts)] != prefix_parts:
        return None
    rest = "/".join(key_parts[len(prefix_parts) :])
    if len(key_parts) <= len(prefix_parts) or not rest:
        return None
    if any(resolves_outside(reading) for reading in readings(rest)):
        return None
    return rest


@st.composite
def tenants(draw: st.DrawFn) -> list[InstanceConfig]:
    count = draw(st.integers(min_value=1, max_value=5))
    return [
        InstanceConfig(
            name=f"t{index}",
            prefix=draw(path | st.sampled_from(["tenant-a", "tenant-ab", "tenant-a/x", ""])),
            bucket=draw(st.sampled_from(BUCKETS)),
        )
        for index in range(count)
    ]


@st.composite
def keys_for(draw: st.DrawFn, instances: list[InstanceConfig]) -> str:
    """Often under one of the prefixes (or a look-alike of one), else anything."""
    choice = draw(st.integers(min_value=0, max_value=4))
    prefix = draw(st.sampled_from([instance.prefix for instance in instances]))
    if choice == 0:
        return draw(path)
    if choice == 1:
        return f"{prefix}/{draw(path)}"
    if choice == 2:  # a look-alike: the prefix with something glued on, or cut short
        glue = draw(st.sampled_from(["b", "-", " ", "%2F", "\u200b", "", "/"]))
        return f"{prefix}{glue}{draw(path)}" if draw(st.booleans()) else prefix[:-1] + glue
    if choice == 3:
        return f"{draw(st.sampled_from(['', '/', '//', '../', './']))}{prefix}/{draw(path)}"
    # under the prefix, then dot segments in their encoded and backslashed spellings
    dots = st.sampled_from(["..", ".", "%2e%2e", "%2E.", ".%2e", "%252e%252e", "..\\", "\\.."])
    rest = draw(st.lists(dots | segment, min_size=1, max_size=5))
    separator = draw(st.sampled_from(["/", "%2F", "\\", "%5C"]))
    return f"{prefix}/{separator.join(rest)}"


def file_event(key: str, bucket: str | None) -> FileEvent:
    return FileEvent(
        id="x:1",
        type="created",
        key=key,
        bucket=bucket,
        time=datetime(2026, 11, 30, tzinfo=UTC),
        provider="s3",
    )


LOOK_ALIKES = {
    "tenant-a/x": {"a": "x"},
    "tenant-ab/x": {"ab": "x"},
    "tenant-abx": {},
    "tenant-a": {},
    "tenant-a/": {},
    "tenant-a%2Fx": {},
    "tenant-a\u200b/x": {},
    "tenant-\u0430/x": {},
    "TENANT-A/x": {},
    # a root of its own after the prefix: a join keeps it instead of the consumer's root
    "tenant-a//x": {},
    "tenant-a/\\x": {},
    "tenant-a/C:x": {},
    "tenant-a/c:\\x": {},
    "tenant-a/\\\\server\\share\\x": {},
    "tenant-a/%2Fx": {},
    "tenant-a/x//y": {"a": "x//y"},
    "tenant-a/x/C:y": {"a": "x/C:y"},
    # dot segments that climb out of the prefix, in the readings a consumer might apply
    "tenant-a/../tenant-ab/x": {},
    "tenant-a/x/../../tenant-ab/x": {},
    "tenant-a/..%2Ftenant-ab/x": {},
    "tenant-a/%2e%2e/tenant-ab/x": {},
    "tenant-a/%2E%2E%2Ftenant-ab%2Fx": {},
    "tenant-a/%252e%252e/tenant-ab/x": {},
    "tenant-a/..\\tenant-ab\\x": {},
    "tenant-a/x%5C..%5C..%5Ctenant-ab%5Cx": {},
    "tenant-a/.": {},
    "tenant-a/x/..": {},
    "tenant-a/%2e/": {},
    # ... and dot segments that stay inside: kept verbatim
    "tenant-a/x/../y": {"a": "x/../y"},
    "tenant-a/./y": {"a": "./y"},
    "tenant-a/..y/x": {"a": "..y/x"},
    "tenant-a/x.../y": {"a": "x.../y"},
    "../tenant-a/x": {},
    "/tenant-a/x": {},
    "x/tenant-a/y": {},
}


@pytest.mark.parametrize(("key", "expected"), LOOK_ALIKES.items())
def test_look_alike_prefixes_never_share_keys(key: str, expected: dict[str, str]) -> None:
    instances = [
        InstanceConfig(name="a", prefix="tenant-a"),
        InstanceConfig(name="ab", prefix="tenant-ab"),
    ]
    got = {}
    for instance in instances:
        result = apply_instance(file_event(key, "uploads"), instance)
        if isinstance(result, FileEvent):
            got[instance.name] = result.key
    assert got == expected


@pytest.mark.parametrize("key", [key for key, expected in LOOK_ALIKES.items() if not expected])
def test_an_instance_without_a_prefix_gets_every_key_verbatim(key: str) -> None:
    result = apply_instance(file_event(key, "uploads"), InstanceConfig(name="all"))
    assert isinstance(result, FileEvent) and result.key == key


ESCAPES = [  # under the prefix on a path boundary, with something after it
    key
    for key, expected in LOOK_ALIKES.items()
    if not expected and key.startswith("tenant-a/") and key != "tenant-a/"
]


@pytest.mark.parametrize("key", ESCAPES)
def test_a_key_climbing_out_of_the_prefix_is_counted_as_prefix_escape(key: str) -> None:
    result = apply_instance(file_event(key, "uploads"), InstanceConfig(name="a", prefix="tenant-a"))
    assert result == Filtered("prefix-escape")


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), instances=tenants())
def test_an_event_lands_in_exactly_the_instances_that_contain_its_key(
    data: st.DataObject, instances: list[InstanceConfig]
) -> None:
    key = data.draw(keys_for(instances))
    bucket = data.draw(st.sampled_from(BUCKETS))
    event = file_event(key, bucket)
    for instance in instances:
        expected = oracle(key, bucket, instance)
        result = apply_instance(event, instance)
        if expected is None:
            assert isinstance(result, Filtered), (key, instance.prefix, result)
        else:
            assert isinstance(result, FileEvent), (key, instance.prefix, result)
            assert result.key == expected
            # the instance's view never reaches outside its prefix
            if instance.prefix:
                assert f"{instance.prefix}/{result.key}" == key


def _settings(instances: list[InstanceConfig]) -> Settings:
    return Settings.model_validate(
        {"instances": [instance.model_dump(exclude_none=True) for instance in instances]}
    )


def _s3_delivery(key: str, bucket: str) -> RawRecord:
    record = {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "eventTime": "2026-11-30T00:00:00.000Z",
        "eventName": "ObjectCreated:Put",
        "s3": {
            "bucket": {"name": bucket},
            "object": {
                # what S3 sends: the key form-encoded
                "key": urllib.parse.quote_plus(key, safe="/"),
                "size": 1,
                "sequencer": "00AA",
            },
        },
    }
    body = json.dumps({"Records": [record]}).encode()
    return RawRecord("files.raw", body, {"source": b"s3"})


def _gcs_delivery(key: str, bucket: str) -> RawRecord:
    resource = {"name": key, "bucket": bucket, "generation": "7", "metageneration": "1"}
    headers = {
        "source": b"gcs",
        "attribute.eventType": b"OBJECT_FINALIZE",
        "attribute.payloadFormat": b"JSON_API_V1",
        "attribute.bucketId": bucket.encode(),
        "attribute.objectId": key.encode(),
        "attribute.objectGeneration": b"7",
        "attribute.eventTime": b"2026-11-30T00:00:00Z",
    }
    return RawRecord("files.raw", json.dumps(resource).encode(), headers)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), instances=tenants(), source=st.sampled_from(["s3", "gcs"]))
def test_a_delivery_is_routed_to_exactly_the_instances_that_contain_its_key(
    data: st.DataObject, instances: list[InstanceConfig], source: str
) -> None:
    key = data.draw(keys_for(instances).filter(lambda k: k and "\x00" not in k))
    bucket = data.draw(st.sampled_from(["uploads", "uploads-b"]))
    raw = _s3_delivery(key, bucket) if source == "s3" else _gcs_delivery(key, bucket)
    routed = route(raw, None, route_policy(_settings(instances)))
    if routed.dead_letter_reason is not None:
        # a key the provider cannot send (e.g. lone surrogates): nobody gets anything
        assert all(record.topic == "files.dead-letter" for record in routed.records)
        return
    got: dict[str, str] = {}
    for record in routed.records:
        event = parse_keyed(record.value or b"", dict(record.headers))
        assert event.instance not in got, "one event reached an instance twice"
        got[event.instance] = event.key
    expected = {
        instance.name: seen
        for instance in instances
        if (seen := oracle(key, bucket, instance)) is not None
    }
    assert got == expected
