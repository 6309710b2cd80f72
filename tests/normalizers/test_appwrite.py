"""Appwrite storage webhooks -> FileEvent. Fixture origins: fixtures/appwrite/ORIGINS.md."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from normalizer_support import (
    assert_malformed,
    assert_only_malformed_and_deterministic,
    fixture_bytes,
    load_fixture,
    mostly,
    set_fields,
    webhook_bodies,
)

from streams.core.delivery import Delivery
from streams.core.event import FileEvent
from streams.core.normalizers.appwrite import SOURCE, normalize
from streams.core.normalizers.base import derived_id, record_hash_id

BUCKET = "5e5ea5c16897e"
FILE = "5e5ea5c16897e"


def document(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = load_fixture(SOURCE, "docs_file_model.json")
    return set_fields(body, changes)


def php_json(body: dict[str, Any]) -> bytes:
    """Like PHP's json_encode: compact, `/` escaped as `\\/`, non-ASCII as \\u escapes."""
    return json.dumps(body, separators=(",", ":")).replace("/", "\\/").encode()


def events_header(action: str, bucket: str = BUCKET, file: str = FILE) -> str:
    """Built from the patterns WebhooksBase.php asserts, joined as Webhooks.php joins them."""
    names = [
        f"buckets.{bucket}.files.{file}.{action}",
        f"buckets.{bucket}.files.{file}",
        f"buckets.{bucket}.files.*.{action}",
        f"buckets.{bucket}.files.*",
        f"buckets.{bucket}",
        f"buckets.*.files.{file}.{action}",
        f"buckets.*.files.{file}",
        f"buckets.*.files.*.{action}",
        "buckets.*.files.*",
        "buckets.*",
    ]
    return ",".join(names)


def delivery(body: bytes, action: str | None = "create", **headers: str) -> Delivery:
    all_headers = {
        "x-appwrite-webhook-id": "6560f3d1a2b3c4d5e6f7",
        "x-appwrite-webhook-name": "storage",
        "x-appwrite-webhook-project-id": "demo",
        "x-appwrite-webhook-user-id": "",
        "x-appwrite-webhook-signature": "c2lnbmF0dXJl",
    }
    if action is not None:
        all_headers["x-appwrite-webhook-events"] = events_header(action)
    all_headers.update(headers)
    return Delivery(source=SOURCE, body=body, headers=all_headers)


def test_create_maps_every_field() -> None:
    [event] = normalize(delivery(fixture_bytes(SOURCE, "docs_file_model.json")))
    assert event == FileEvent(
        id=derived_id("appwrite", "create", BUCKET, FILE, "2020-10-15T06:38:00.000+00:00"),
        type="created",
        key=FILE,
        bucket=BUCKET,
        size=17890,
        etag="5d529fd02b544198ae075bd57c1762bb",
        version_id=None,
        time=datetime(2020, 10, 15, 6, 38, tzinfo=UTC),
        sequencer=None,
        provider="appwrite",
        version_only=None,
        raw=document(),
    )


def test_delete_has_no_time_and_the_key_is_gone() -> None:
    [event] = normalize(delivery(php_json(document()), "delete"))
    assert (event.type, event.key, event.bucket, event.version_only) == (
        "deleted",
        FILE,
        BUCKET,
        False,
    )
    assert event.time is None
    assert event.id == derived_id(
        "appwrite", "delete", BUCKET, FILE, "2020-10-15T06:38:00.000+00:00"
    )


def test_update_is_dropped() -> None:
    assert normalize(delivery(php_json(document(name="renamed.png")), "update")) == []


def test_events_other_than_file_events_are_dropped() -> None:
    bucket_delete = ",".join(
        ["buckets.*", "buckets.*.delete", f"buckets.{BUCKET}", f"buckets.{BUCKET}.delete"]
    )
    body = php_json({"$id": BUCKET, "name": "Test Bucket Updated", "enabled": True})
    assert normalize(delivery(body, None, **{"x-appwrite-webhook-events": bucket_delete})) == []
    users = "users.*,users.*.create,users.abc,users.abc.create"
    assert (
        normalize(delivery(php_json({"$id": "abc"}), None, **{"x-appwrite-webhook-events": users}))
        == []
    )


def test_the_constant_webhook_id_header_is_not_the_event_id() -> None:
    body = php_json(document())
    first = normalize(delivery(body))
    other_file = php_json(
        document(**{"$id": "other", "$updatedAt": "2020-10-15T06:39:00.000+00:00"})
    )
    second = normalize(
        delivery(other_file, **{"x-appwrite-webhook-events": events_header("create", file="other")})
    )
    assert first[0].id != second[0].id
    assert "6560f3d1a2b3c4d5e6f7" not in {first[0].id, second[0].id}


def test_redelivery_gets_the_same_id() -> None:
    body = php_json(document())
    assert (
        normalize(delivery(body))[0].id
        == normalize(delivery(body, **{"x-appwrite-webhook-signature": "x"}))[0].id
    )


def test_recreating_a_deleted_file_id_gives_a_new_event_id() -> None:
    first = normalize(delivery(php_json(document())))[0]
    again = normalize(
        delivery(
            php_json(
                document(
                    **{
                        "$createdAt": "2021-01-01T00:00:00.000+00:00",
                        "$updatedAt": "2021-01-01T00:00:00.000+00:00",
                    }
                )
            )
        )
    )[0]
    assert first.key == again.key and first.etag == again.etag and first.id != again.id


def test_fallback_ids() -> None:
    body = document(**{"$updatedAt": None})
    [event] = normalize(delivery(php_json(body)))
    assert event.id == derived_id(
        "appwrite",
        "create",
        BUCKET,
        FILE,
        None,
        "2020-10-15T06:38:00Z",
        "5d529fd02b544198ae075bd57c1762bb",
    )
    bare = document(**{"$updatedAt": None, "$createdAt": None, "signature": None})
    [event] = normalize(delivery(php_json(bare)))
    assert event.id == record_hash_id("appwrite", bare)


def test_pre_1_0_integer_timestamps() -> None:
    # Appwrite 0.15 documented $createdAt/$updatedAt as Unix timestamps (integers).
    body = document(**{"$createdAt": 1602743880, "$updatedAt": 1602743880})
    [event] = normalize(delivery(php_json(body)))
    assert event.time == datetime(2020, 10, 15, 6, 38, tzinfo=UTC)
    assert event.id == derived_id("appwrite", "create", BUCKET, FILE, 1602743880)


@pytest.mark.parametrize("file_id", ["my.file-1", "a_b", "x.y.z"])
def test_file_ids_with_dots_are_read_from_the_body_not_split_from_events(file_id: str) -> None:
    body = php_json(document(**{"$id": file_id}))
    [event] = normalize(
        delivery(body, **{"x-appwrite-webhook-events": events_header("delete", file=file_id)})
    )
    assert (event.key, event.type) == (file_id, "deleted")


@pytest.mark.parametrize("name", ["my photo.png", "a+b.png", "100%.png", "été/日本.png"])
def test_names_stay_raw_in_raw_and_the_key_is_the_file_id(name: str) -> None:
    body = document(name=name, key=f"photos/2026/{name}")
    [event] = normalize(delivery(php_json(body)))
    assert event.key == FILE
    assert (
        event.raw is not None
        and event.raw["name"] == name
        and event.raw["key"] == f"photos/2026/{name}"
    )


@pytest.mark.parametrize(
    ("body", "action", "headers", "message"),
    [
        (b"\x00", "create", {}, "not JSON"),
        (b"[1]", "create", {}, "body is not a JSON object"),
        (php_json(document()), None, {}, "x-appwrite-webhook-events header is missing"),
        (php_json(document()), None, {"x-appwrite-webhook-events": " "}, "header is missing"),
        (
            php_json(document()),
            None,
            {"x-appwrite-webhook-events": "buckets.*.files.*.create,buckets.*.files.*.delete"},
            "names several file actions",
        ),
        (php_json(document(**{"$id": None})), "create", {}, r"\$id is missing"),
        (php_json(document(bucketId=12)), "delete", {}, "bucketId is missing"),
        (
            php_json(document(sizeOriginal="17890 bytes")),
            "create",
            {},
            "sizeOriginal is not an integer",
        ),
        (php_json(document(signature=False)), "create", {}, "signature is not a string"),
        (
            php_json(document(**{"$createdAt": "yesterday"})),
            "create",
            {},
            r"\$createdAt is not an RFC 3339",
        ),
        (
            php_json(document(**{"$createdAt": 10**20})),
            "create",
            {},
            r"\$createdAt is out of range",
        ),
        (php_json(document(**{"$updatedAt": [1]})), "create", {}, r"\$updatedAt is not a time"),
    ],
)
def test_malformed_deliveries_say_why(
    body: bytes, action: str | None, headers: dict[str, str], message: str
) -> None:
    assert_malformed(SOURCE, delivery(body, action, **headers), message)


# --- properties ------------------------------------------------------------------------

event_names = st.sampled_from(
    [
        "buckets.*.files.*.create",
        "buckets.*.files.*.delete",
        "buckets.*.files.*.update",
        "buckets.*",
        "users.*",
    ]
) | st.text(max_size=20)
headers = st.fixed_dictionaries(
    {},
    optional={
        "x-appwrite-webhook-events": st.lists(event_names, max_size=3).map(",".join),
        "x-appwrite-webhook-id": st.text(max_size=10),
    },
)
documents = st.fixed_dictionaries(
    {
        "$id": mostly(st.text(min_size=1, max_size=8)),
        "bucketId": mostly(st.text(min_size=1, max_size=8)),
    },
    optional={
        "$createdAt": mostly(st.sampled_from(["2020-10-15T06:38:00.000+00:00", 1602743880])),
        "$updatedAt": mostly(st.sampled_from(["2020-10-15T06:38:00.000+00:00", 1602743880])),
        "signature": mostly(st.text(alphabet="0123456789abcdef", max_size=8)),
        "sizeOriginal": mostly(st.integers(0, 2**40)),
    },
)
bodies = webhook_bodies(documents)


@settings(max_examples=300, deadline=None)
@given(body=bodies, delivered_headers=headers)
def test_any_input_gives_events_or_malformed_and_stable_ids(
    body: bytes, delivered_headers: dict[str, str]
) -> None:
    assert_only_malformed_and_deterministic(
        SOURCE, Delivery(source=SOURCE, body=body, headers=delivered_headers)
    )
