"""Synthetic reconcile deliveries -> FileEvent (format: streams/core/normalizers/reconcile.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.core.delivery import Delivery
from streams.core.event import FileEvent
from streams.core.normalizers.base import MalformedDelivery, derived_id
from streams.core.normalizers.reconcile import SOURCE, normalize, reconcile_id

OBSERVED = datetime(2026, 11, 30, 1, 0, 0, 123456, tzinfo=UTC)
MODIFIED = datetime(2026, 11, 30, 0, 8, 7, tzinfo=UTC)


def body(**changes: Any) -> dict[str, Any]:
    """A created body as `connectors.reconcile` writes it; None removes a field."""
    data: dict[str, Any] = {
        "type": "created",
        "bucket": "uploads",
        "key": "tenant-a/photos/red flower+1.jpg",
        "etag": "9b2cf535f27731c974343645a3985328",
        "size": 1024,
        "last_modified": "2026-11-30T00:08:07Z",
        "observed_at": "2026-11-30T01:00:00.123456Z",
        "instance": "tenant-a",
        "reason": "not-in-stream",
    }
    data["id"] = reconcile_id("created", data["bucket"], data["key"], data["etag"], MODIFIED)
    for name, value in changes.items():
        if value is None:
            data.pop(name, None)
        else:
            data[name] = value
    return data


def deliver(data: Any) -> Delivery:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return Delivery(source=SOURCE, body=raw)


def test_a_bucketless_provider_s_drift_names_bucket_null() -> None:
    # Box and Cloudinary have no buckets: the body says so with null (absent stays malformed).
    data = {**body(), "bucket": None, "key": "1002"}
    data["id"] = reconcile_id("created", None, "1002", data["etag"], MODIFIED)
    [event] = normalize(deliver(data))
    assert (event.bucket, event.key, event.id) == (None, "1002", data["id"])
    assert reconcile_id("created", None, "k", None, None) != reconcile_id(
        "created", "uploads", "k", None, None
    )


def test_created_maps_every_field() -> None:
    data = body()
    [event] = normalize(deliver(data))
    assert event == FileEvent(
        id=data["id"],
        type="created",
        key="tenant-a/photos/red flower+1.jpg",  # raw: listings are not form-encoded
        bucket="uploads",
        size=1024,
        etag="9b2cf535f27731c974343645a3985328",
        version_id=None,
        time=OBSERVED,
        sequencer=None,
        provider="reconcile",
        version_only=None,
        raw=data,
    )


def test_deleted_says_the_live_key_is_gone() -> None:
    data = body(type="deleted", size=None, reason="not-listed")
    data["size"] = None
    [event] = normalize(deliver(data))
    assert (event.type, event.version_only, event.size, event.time) == (
        "deleted",
        False,
        None,
        OBSERVED,
    )


def test_the_id_rule_is_the_spec_fallback_from_key_etag_and_last_modified() -> None:
    expected = derived_id(
        "reconcile",
        "created",
        "uploads",
        "tenant-a/photos/red flower+1.jpg",
        "9b2cf535f27731c974343645a3985328",
        "2026-11-30T00:08:07Z",
    )
    [event] = normalize(deliver(body(id=None)))
    assert event.id == expected
    assert body()["id"] == expected
    # quoted or not, the same ETag gives the same id
    assert reconcile_id("created", "uploads", "k", '"abc"', MODIFIED) == reconcile_id(
        "created", "uploads", "k", "abc", MODIFIED
    )
    # ...and it tells drifts of one key apart: by type, by ETag, by last-modified
    ids = {
        reconcile_id("created", "uploads", "k", "abc", MODIFIED),
        reconcile_id("deleted", "uploads", "k", "abc", MODIFIED),
        reconcile_id("created", "uploads", "k", "abd", MODIFIED),
        reconcile_id("created", "uploads", "k", "abc", OBSERVED),
        reconcile_id("created", "uploads", "k", None, None),
    }
    assert len(ids) == 5
    assert all(event_id.startswith("reconcile:") for event_id in ids)


def test_a_given_id_is_taken_as_is_and_an_empty_one_is_derived() -> None:
    [given_id] = normalize(deliver(body(id="reconcile:given")))
    assert given_id.id == "reconcile:given"
    [empty] = normalize(deliver(body(id="")))
    assert empty.id == body()["id"]


def test_time_falls_back_to_last_modified_and_etag_quotes_are_stripped() -> None:
    [event] = normalize(deliver(body(observed_at=None, etag='"abc"')))
    assert event.time == MODIFIED
    assert event.etag == "abc"
    [bare] = normalize(deliver(body(observed_at=None, last_modified=None, etag=None, size=None)))
    assert (bare.time, bare.etag, bare.size) == (None, None, None)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"not json", "not JSON"),
        ([1, 2], "body is not a JSON object"),
        (body(type="updated"), "neither 'created' nor 'deleted'"),
        (body(type=None), "type is missing"),
        (body(bucket=None), "bucket is missing"),
        (body(key=""), "key is missing"),
        (body(size="big"), "size is not an integer"),
        (body(last_modified="yesterday"), "last_modified is not an RFC 3339 time"),
        (body(observed_at=12), "observed_at is not a string"),
        (body(etag=5), "etag is not a string"),
        (body(id=7), "id is not a string"),
    ],
)
def test_malformed_bodies_say_why(data: Any, reason: str) -> None:
    with pytest.raises(MalformedDelivery, match=reason):
        normalize(deliver(data))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            name: JSON | st.sampled_from(["created", "deleted", "2026-11-30T00:08:07Z"])
            for name in ("type", "bucket", "key", "etag", "size", "last_modified", "id")
        },
    )
)
def test_any_body_gives_events_or_malformed_and_the_same_every_time(data: Any) -> None:
    raw = json.dumps(data).encode()
    try:
        first = normalize(deliver(raw))
    except MalformedDelivery:
        with pytest.raises(MalformedDelivery):
            normalize(deliver(raw))
        return
    assert normalize(deliver(raw)) == first
    assert len(first) == 1
