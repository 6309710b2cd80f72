"""Cloudinary notifications -> FileEvent. Fixture origins: fixtures/cloudinary/ORIGINS.md."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from normalizer_support import (
    assert_malformed,
    assert_only_malformed_and_deterministic,
    deliver,
    encode,
    fixture_bytes,
    fixture_names,
    load_fixture,
    mostly,
    set_fields,
    webhook_bodies,
)

from streams.core.event import FileEvent
from streams.core.normalizers.base import derived_id, record_hash_id
from streams.core.normalizers.cloudinary import SOURCE, normalize
from streams.core.ordering import mark_for, order_token, staleness

fixture = partial(fixture_bytes, SOURCE)
load = partial(load_fixture, SOURCE)
delivery = partial(deliver, SOURCE)


def rename_body(**changes: Any) -> dict[str, Any]:
    """Built: no real rename body is public. Fields as the notifications page and the
    api-evangelist AsyncAPI describe them; values in the style of the real captures."""
    body: dict[str, Any] = {
        "notification_type": "rename",
        "timestamp": "2023-06-03T21:40:11+00:00",
        "request_id": "c6b5e1f0a9d24e3b8f7a6c5d4e3f2a1b",
        "resource_type": "image",
        "type": "upload",
        "asset_id": "71c80fc5649a6f1f75a2a25242a1b619",
        "from_public_id": "folder/old name",
        "to_public_id": "folder/new+name",
        "notification_context": {
            "triggered_at": "2023-06-03T21:40:10.512345Z",
            "triggered_by": {"source": "ui", "id": "redacted@example.com"},
        },
    }
    return set_fields(body, changes)


def test_upload_maps_every_field() -> None:
    [event] = normalize(delivery(fixture("jackdbd_image_uploaded.json")))
    assert event == FileEvent(
        id="71763d4cacf19521f5691a02c8b143b1",
        type="created",
        key="image/upload/sample",
        bucket=None,
        size=380250,
        etag="0b40494da087cba7092d29c58aede2e2",
        version_id="3144395a27aa6c02df1ca8aaf9aa6e7a",  # the provider's, not `version`
        time=datetime(2022, 11, 17, 9, 7, 50, 766353, tzinfo=UTC),  # triggered_at
        sequencer=None,
        provider="cloudinary",
        version_only=None,
        raw=load("jackdbd_image_uploaded.json"),
    )


def test_2021_upload_without_context_uses_timestamp() -> None:
    [event] = normalize(delivery(fixture("comment_2021_upload.json")))
    assert event.key == "image/upload/PM/totem/aaaa"
    assert event.id == "a1e5ca1e429f000125097f846b7327f3"
    assert event.time == datetime(2021, 4, 15, 16, 45, 47, tzinfo=UTC)


def test_delete_without_request_id_derives_its_id() -> None:
    [event] = normalize(delivery(fixture("jackdbd_image_deleted.json")))
    assert event == FileEvent(
        id=derived_id(
            "cloudinary", "delete", None, "image/upload/kbwtr9kcadzuj2dcwebc", "1685815655"
        ),
        type="deleted",
        key="image/upload/kbwtr9kcadzuj2dcwebc",
        version_id=None,  # a delete notification carries no version_id
        time=datetime(2023, 6, 3, 21, 32, 2, 988895, tzinfo=UTC),
        provider="cloudinary",
        version_only=False,
        raw=load("jackdbd_image_deleted.json")["resources"][0],
    )


def test_bare_2021_delete_has_no_time() -> None:
    [event] = normalize(delivery(fixture("comment_2021_delete.json")))
    assert (event.type, event.key, event.time) == ("deleted", "image/upload/PM/totem/aaaa", None)


def test_upload_then_delete_of_the_same_asset_share_key_and_raw_version() -> None:
    [created] = normalize(delivery(fixture("comment_2021_upload.json")))
    [deleted] = normalize(delivery(fixture("comment_2021_delete.json")))
    assert created.key == deleted.key
    assert created.raw is not None and deleted.raw is not None
    assert created.raw["version"] == deleted.raw["version"]
    assert created.id != deleted.id


def test_version_id_is_the_providers_version_id() -> None:
    """`version_id` names the stored version (a hash); `version` is its upload time."""
    [event] = normalize(delivery(fixture("comment_2021_upload.json")))
    assert event.version_id == "44896e4bad670eedb860bb758b3495b1"
    [event] = normalize(delivery(upload_with(version_id=None)))
    assert event.version_id is None  # not `version` in its place
    [event] = normalize(delivery(upload_with(version_id="")))
    assert event.version_id is None
    _, created = normalize(delivery(encode(rename_body(version=1685826817, version_id="ab12"))))
    assert created.version_id == "ab12"
    body = load("jackdbd_image_deleted.json")
    body["resources"][0]["version_id"] = "cd34"
    [deleted] = normalize(delivery(encode(body)))
    assert deleted.version_id == "cd34"


def test_ordering_stays_on_the_event_time() -> None:
    """A re-upload's `version_id` is a hash, no later or earlier than the last: nothing
    orders by it, the event time does (no sequencer)."""
    first = load("jackdbd_image_uploaded.json")
    second = set_fields(
        load("jackdbd_image_uploaded.json"),
        {
            "request_id": "r2",
            "version": 1608120999,
            "version_id": "0000000000000000000000000000000",
            "notification_context": {"triggered_at": "2022-11-17T09:09:00Z"},
        },
    )
    [a] = normalize(delivery(encode(first)))
    [b] = normalize(delivery(encode(second)))
    assert b.version_id is not None and a.version_id is not None and b.version_id < a.version_id
    assert (order_token(a), order_token(b)) == (None, None)
    assert staleness(a, mark_for(b)) is not None  # the earlier upload, late: stale
    assert staleness(b, mark_for(a)) is None


def test_bulk_delete_gives_one_event_per_resource_in_order() -> None:
    events = normalize(delivery(fixture("jackdbd_bulk_delete.json")))
    assert [e.key for e in events] == [
        "image/upload/csbsy1gedwzdqad42zvy",
        "image/upload/pvf2vvzwmdevthrvjytq",
        "image/upload/btqd1mdjcjlgekz3awgo",
        "image/upload/f9siudnton73gohaji0j",
    ]
    assert len({e.id for e in events}) == 4
    assert {e.type for e in events} == {"deleted"}


def test_a_reupload_deleted_again_gets_a_new_id() -> None:
    first = load("comment_2021_delete.json")
    second = load("comment_2021_delete.json")
    second["resources"][0]["version"] = 1618600000
    [a] = normalize(delivery(encode(first)))
    [b] = normalize(delivery(encode(second)))
    assert a.key == b.key and a.id != b.id


def test_delete_fallback_ids() -> None:
    body = load("jackdbd_image_deleted.json")
    del body["resources"][0]["version"]
    [event] = normalize(delivery(encode(body)))
    assert event.id == derived_id(
        "cloudinary",
        "delete",
        None,
        "image/upload/kbwtr9kcadzuj2dcwebc",
        None,
        "2023-06-03T21:32:02.988895Z",
        None,
    )
    del body["notification_context"]
    [event] = normalize(delivery(encode(body)))
    assert event.id == record_hash_id("cloudinary", body["resources"][0])


def test_upload_without_request_id_derives_from_version() -> None:
    body = load("jackdbd_image_uploaded.json")
    del body["request_id"]
    [event] = normalize(delivery(encode(body)))
    assert event.id == derived_id("cloudinary", "upload", None, "image/upload/sample", "1608120578")


def test_rename_is_deleted_old_plus_created_new() -> None:
    deleted, created = normalize(delivery(encode(rename_body())))
    assert (deleted.type, deleted.key, deleted.id, deleted.version_only) == (
        "deleted",
        "image/upload/folder/old name",
        "c6b5e1f0a9d24e3b8f7a6c5d4e3f2a1b:deleted",
        False,
    )
    assert (created.type, created.key, created.id, created.version_only) == (
        "created",
        "image/upload/folder/new+name",
        "c6b5e1f0a9d24e3b8f7a6c5d4e3f2a1b:created",
        None,
    )
    assert deleted.time == created.time == datetime(2023, 6, 3, 21, 40, 10, 512345, tzinfo=UTC)


def test_rename_without_request_id_still_pairs_its_ids() -> None:
    deleted, created = normalize(delivery(encode(rename_body(request_id=None))))
    base = derived_id(
        "cloudinary",
        "rename",
        None,
        "image/upload/folder/new+name",
        "image/upload/folder/old name",
        "2023-06-03T21:40:10.512345Z",
    )
    assert (deleted.id, created.id) == (f"{base}:deleted", f"{base}:created")


def test_rename_to_itself_is_nothing() -> None:
    assert normalize(delivery(encode(rename_body(to_public_id="folder/old name")))) == []


@pytest.mark.parametrize(
    "kind",
    [
        "eager",
        "moderation",
        "resource_tags_changed",
        "resource_context_changed",
        "resource_metadata_changed",
        "resource_display_name_changed",
        "access_control_changed",
        "move",
        "create_folder",
        "delete_folder",
        "move_or_rename_asset_folder",
        "multi",
        "explode",
        "something_new",
    ],
)
def test_kinds_that_change_no_content_are_dropped(kind: str) -> None:
    body = {"notification_type": kind, "public_id": "sample", "resources": "whatever"}
    assert normalize(delivery(encode(body))) == []


def test_redelivery_gets_the_same_ids() -> None:
    bodies = [fixture(name) for name in fixture_names(SOURCE)] + [encode(rename_body())]
    for body in bodies:
        headers = {"x-cld-timestamp": "1700000000", "x-cld-signature": "ab" * 20}
        assert [e.id for e in normalize(delivery(body, headers))] == [
            e.id for e in normalize(delivery(body))
        ]


@pytest.mark.parametrize(
    "public_id", ["my photo", "a+b", "100%25", "dossier/été/日本", "raw/file name.pdf", "😀"]
)
def test_public_ids_are_kept_raw(public_id: str) -> None:
    body = load("jackdbd_image_uploaded.json")
    body["public_id"] = public_id
    [event] = normalize(delivery(encode(body)))
    assert event.key == f"image/upload/{public_id}"
    assert event.key.split("/", 2) == ["image", "upload", public_id]


def test_resource_and_delivery_type_keep_same_public_ids_apart() -> None:
    image = load("jackdbd_image_uploaded.json")
    video = dict(image, resource_type="video", request_id="r2")
    private = dict(image, type="private", request_id="r3")
    keys = {normalize(delivery(encode(b)))[0].key for b in (image, video, private)}
    assert keys == {"image/upload/sample", "video/upload/sample", "image/private/sample"}


def upload_with(**changes: Any) -> bytes:
    return encode(set_fields(load("jackdbd_image_uploaded.json"), changes))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"public_id=sample", "not JSON"),
        (b"[]", "body is not a JSON object"),
        (b"{}", "notification_type is missing"),
        (upload_with(public_id=None), "public_id is missing"),
        (upload_with(resource_type=None), "resource_type is missing"),
        (upload_with(type=5), "type is missing"),
        (upload_with(resource_type="image/x"), "contains '/'"),
        (upload_with(version=1.5), "version is not an integer"),
        (upload_with(version_id=5), "version_id is not a string"),
        (upload_with(bytes="many"), "bytes is not an integer"),
        (upload_with(request_id=1), "request_id is not a string"),
        (upload_with(etag=[]), "etag is not a string"),
        (upload_with(timestamp="soon", notification_context=None), "timestamp is not an RFC 3339"),
        (upload_with(notification_context="ui"), "notification_context is not a JSON object"),
        (
            upload_with(notification_context={"triggered_at": "9999-12-31T23:59:59-01:00"}),
            "triggered_at is out of range",
        ),
        (b'{"notification_type": "delete"}', "resources is missing or not a list"),
        (
            b'{"notification_type": "delete", "resources": [1]}',
            r"resources\[0\] is not a JSON object",
        ),
        (
            b'{"notification_type": "delete", "resources": [{"type": "upload", "public_id": "x"}]}',
            r"resources\[0\]\.resource_type is missing",
        ),
        (encode(rename_body(to_public_id=None)), "to_public_id is missing"),
        (encode(rename_body(from_public_id="")), "from_public_id is missing"),
    ],
)
def test_malformed_deliveries_say_why(body: bytes, message: str) -> None:
    assert_malformed(SOURCE, body, message)


# --- properties ------------------------------------------------------------------------

headers = st.dictionaries(
    st.sampled_from(["x-cld-timestamp", "x-cld-signature"]) | st.text(max_size=20).map(str.lower),
    st.text(max_size=40),
    max_size=3,
)
identity = {
    "resource_type": mostly(st.sampled_from(["image", "video", "raw", "a/b"])),
    "type": mostly(st.sampled_from(["upload", "private"])),
    "public_id": mostly(st.text(min_size=1, max_size=10)),
}
versions = mostly(st.none() | st.integers(0, 2**34))
resources = st.fixed_dictionaries({**identity, "version": versions})
notifications = st.fixed_dictionaries(
    {
        "notification_type": mostly(st.sampled_from(["upload", "delete", "rename", "eager"])),
        **identity,
        "version": versions,
    },
    optional={
        "version_id": mostly(st.none() | st.text(alphabet="0123456789abcdef", max_size=32)),
        "request_id": mostly(st.text(alphabet="0123456789abcdef", max_size=8)),
        "bytes": mostly(st.integers(0, 2**40)),
        "etag": mostly(st.text(max_size=8)),
        "timestamp": mostly(st.sampled_from(["2022-11-17T09:07:51+00:00"])),
        "notification_context": mostly(
            st.fixed_dictionaries(
                {}, optional={"triggered_at": mostly(st.just("2023-06-03T21:32:02.988895Z"))}
            )
        ),
        "resources": mostly(st.lists(mostly(resources), max_size=4)),
        "from_public_id": mostly(st.text(min_size=1, max_size=8)),
        "to_public_id": mostly(st.text(min_size=1, max_size=8)),
    },
)
bodies = webhook_bodies(notifications)


@settings(max_examples=300, deadline=None)
@given(body=bodies, extra_headers=headers)
def test_any_input_gives_events_or_malformed_and_stable_ids(
    body: bytes, extra_headers: dict[str, str]
) -> None:
    assert_only_malformed_and_deterministic(
        SOURCE, delivery(body, extra_headers), again=delivery(body)
    )
