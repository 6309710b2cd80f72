"""Supabase Database Webhooks on storage.objects -> FileEvent.

No real storage.objects webhook body is public (fixtures/supabase/ORIGINS.md), so every
payload here is built from the documented shape: the envelope of `webhooks.sql`, the row
columns of the `supabase/storage` migrations and the metadata keys of its `ObjectMetadata`,
rendered as `jsonb::text` renders them (keys by length then bytes, `", "` and `": "`).
"""

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
    mostly,
    webhook_bodies,
)

from streams.core.delivery import Delivery
from streams.core.event import FileEvent
from streams.core.normalizers.base import derived_id, record_hash_id
from streams.core.normalizers.supabase import SOURCE, normalize

V1 = "6d1d2a1e-5f1c-4e0b-9d0a-3a0f6c1b2e11"
V2 = "b3c8f9e2-7a4d-4c61-8e52-0f9d4a7b6c22"


def jsonb_text(value: Any) -> str:
    """What `jsonb::text` sends: keys ordered by length then bytes, `", "` and `": "`."""
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: (len(kv[0].encode()), kv[0].encode()))
        inner = ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {jsonb_text(v)}" for k, v in items)
        return "{" + inner + "}"
    if isinstance(value, list):
        return "[" + ", ".join(jsonb_text(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def row(
    name: Any = "folder/cat.png",
    bucket: str = "avatars",
    version: Any = V1,
    updated_at: Any = "2024-05-01T10:00:00.123456+00:00",
    etag: str = '"c4ca4238a0b923820dcc509a6f75849b"',
    size: int = 1024,
    **columns: Any,
) -> dict[str, Any]:
    """A storage.objects row as to_jsonb renders it (timestamptz as ISO 8601 with offset)."""
    record: dict[str, Any] = {
        "id": "8a1a5a4e-0b8f-4c47-9a56-2f1f0e3c9d77",
        "bucket_id": bucket,
        "name": name,
        "owner": "d8c7bce9-cfeb-497b-bd61-e66ce2cbdaa2",
        "owner_id": "d8c7bce9-cfeb-497b-bd61-e66ce2cbdaa2",
        "created_at": "2024-05-01T10:00:00.123456+00:00",
        "updated_at": updated_at,
        "last_accessed_at": "2024-05-01T10:00:00.123456+00:00",
        "metadata": {
            "eTag": etag,
            "size": size,
            "mimetype": "image/png",
            "cacheControl": "max-age=3600",
            "lastModified": "2024-05-01T10:00:01.000Z",
            "contentLength": size,
            "httpStatusCode": 200,
        },
        "version": version,
        "user_metadata": None,
        "path_tokens": name.split("/") if isinstance(name, str) else None,
    }
    record.update(columns)
    return record


def payload(op: str, record: dict[str, Any] | None, old: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "type": op,
        "table": "objects",
        "record": record,
        "schema": "storage",
        "old_record": old,
    }


def delivery(body: dict[str, Any] | bytes, headers: dict[str, str] | None = None) -> Delivery:
    raw = body if isinstance(body, bytes) else jsonb_text(body).encode()
    return Delivery(source=SOURCE, body=raw, headers=headers or {})


def test_wire_text_is_what_postgres_sends() -> None:
    text = jsonb_text(payload("INSERT", {"name": "a"}, None))
    assert text == (
        '{"type": "INSERT", "table": "objects", "record": {"name": "a"}, '
        '"schema": "storage", "old_record": null}'
    )


def test_insert_maps_every_field() -> None:
    body = payload("INSERT", row(), None)
    [event] = normalize(delivery(body))
    assert event == FileEvent(
        id=derived_id("supabase", "INSERT", "avatars", "folder/cat.png", V1),
        type="created",
        key="folder/cat.png",
        bucket="avatars",
        size=1024,
        etag="c4ca4238a0b923820dcc509a6f75849b",  # one pair of literal quotes stripped
        version_id=V1,
        time=datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC),
        sequencer=None,
        provider="supabase",
        version_only=None,
        raw=body,
    )


def test_overwrite_is_an_update_with_a_new_version() -> None:
    old = row()
    new = row(version=V2, updated_at="2024-05-02T08:00:00+00:00", etag='"abc"', size=2048)
    [event] = normalize(delivery(payload("UPDATE", new, old)))
    assert (event.type, event.key, event.version_id, event.size, event.etag) == (
        "created",
        "folder/cat.png",
        V2,
        2048,
        "abc",
    )
    assert event.id == derived_id("supabase", "UPDATE", "avatars", "folder/cat.png", V2)
    assert event.time == datetime(2024, 5, 2, 8, 0, tzinfo=UTC)


def test_metadata_only_update_is_dropped() -> None:
    old = row()
    new = row(
        updated_at="2024-05-03T00:00:00+00:00",
        last_accessed_at="2024-05-03T00:00:00+00:00",
        user_metadata={"label": "x"},
    )
    assert normalize(delivery(payload("UPDATE", new, old))) == []


def test_move_is_deleted_old_plus_created_new() -> None:
    old = row(name="folder/cat.png")
    new = row(name="archive/cat 2024.png", version=V2, updated_at="2024-05-04T00:00:00+00:00")
    body = payload("UPDATE", new, old)
    deleted, created = normalize(delivery(body))
    base = derived_id("supabase", "UPDATE", "avatars", "archive/cat 2024.png", V2)
    assert (deleted.id, deleted.type, deleted.key, deleted.version_id, deleted.version_only) == (
        f"{base}:deleted",
        "deleted",
        "folder/cat.png",
        V1,
        False,
    )
    assert (created.id, created.type, created.key, created.version_id, created.version_only) == (
        f"{base}:created",
        "created",
        "archive/cat 2024.png",
        V2,
        None,
    )
    assert deleted.time == created.time == datetime(2024, 5, 4, tzinfo=UTC)
    assert deleted.raw == created.raw == body


def test_move_across_buckets() -> None:
    old = row(bucket="inbox")
    new = row(bucket="done", version=V2)
    deleted, created = normalize(delivery(payload("UPDATE", new, old)))
    assert (deleted.bucket, created.bucket) == ("inbox", "done")
    assert deleted.key == created.key == "folder/cat.png"


def test_delete_uses_the_old_record_and_has_no_time() -> None:
    body = payload("DELETE", None, row())
    [event] = normalize(delivery(body))
    assert event == FileEvent(
        id=derived_id("supabase", "DELETE", "avatars", "folder/cat.png", V1),
        type="deleted",
        key="folder/cat.png",
        bucket="avatars",
        size=1024,
        etag="c4ca4238a0b923820dcc509a6f75849b",
        version_id=V1,
        time=None,
        provider="supabase",
        version_only=False,
        raw=body,
    )


def test_rows_without_a_version_fall_back_to_time_and_etag() -> None:
    legacy = row(version=None)
    [event] = normalize(delivery(payload("INSERT", legacy, None)))
    assert event.id == derived_id(
        "supabase",
        "INSERT",
        "avatars",
        "folder/cat.png",
        None,
        "2024-05-01T10:00:00.123456Z",
        "c4ca4238a0b923820dcc509a6f75849b",
    )
    same = row(version=None, updated_at="2024-05-02T00:00:00+00:00")
    assert normalize(delivery(payload("UPDATE", same, legacy))) == []
    rewritten = row(version=None, etag='"ffff"')
    [event] = normalize(delivery(payload("UPDATE", rewritten, legacy)))
    assert (event.type, event.etag) == ("created", "ffff")
    bare = row(version=None, metadata=None, updated_at=None)
    body = payload("INSERT", bare, None)
    [event] = normalize(delivery(body))
    assert event.id == record_hash_id("supabase", body)


def test_row_still_being_uploaded_has_no_metadata() -> None:
    [event] = normalize(delivery(payload("INSERT", row(metadata=None), None)))
    assert (event.size, event.etag) == (None, None)


def test_versioning_columns_are_read_defensively() -> None:
    marker = row(version=V2, is_delete_marker=True, is_versioned=True, metadata=None)
    [event] = normalize(delivery(payload("INSERT", marker, None)))
    assert (event.type, event.version_only) == ("deleted", False)

    archived = row(archived_at="2024-05-05T00:00:00+00:00", is_versioned=True)
    assert normalize(delivery(payload("UPDATE", archived, row(is_versioned=True)))) == []

    [event] = normalize(delivery(payload("DELETE", None, archived)))
    assert (event.type, event.version_only) == ("deleted", True)

    assert normalize(delivery(payload("DELETE", None, marker))) == []

    [event] = normalize(delivery(payload("DELETE", None, row(is_versioned=True))))
    assert event.version_only is None


@pytest.mark.parametrize(
    "name", ["my file.png", "a+b.png", "100%25 done.txt", "%E2%9C%93", "dossier/été/日本語 😀.png"]
)
def test_keys_are_kept_raw(name: str) -> None:
    [event] = normalize(delivery(payload("INSERT", row(name=name), None)))
    assert event.key == name


def test_redelivery_with_max_retries_gets_the_same_ids() -> None:
    bodies = [
        payload("INSERT", row(), None),
        payload("UPDATE", row(version=V2), row()),
        payload("UPDATE", row(name="b.png", version=V2), row()),
        payload("DELETE", None, row()),
        payload("INSERT", row(version=None), None),
    ]
    for body in bodies:
        first = normalize(delivery(body, {"authorization": "Bearer a"}))
        again = normalize(delivery(body))
        assert [e.id for e in first] == [e.id for e in again]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\xc3\x28", "not JSON"),
        (b"null", "body is not a JSON object"),
        ({**payload("INSERT", row(), None), "table": "profiles"}, "not a storage.objects webhook"),
        ({**payload("INSERT", row(), None), "schema": "public"}, "not a storage.objects webhook"),
        ({**payload("INSERT", row(), None), "type": "TRUNCATE"}, "is not INSERT, UPDATE or DELETE"),
        ({**payload("INSERT", row(), None), "type": None}, "type is missing"),
        (payload("INSERT", None, None), "record is not a JSON object"),
        (payload("UPDATE", row(), None), "old_record is not a JSON object"),
        (payload("DELETE", row(), None), "old_record is not a JSON object"),
        (payload("INSERT", row(name=None), None), "record.name is missing"),
        (payload("INSERT", row(bucket_id=""), None), "record.bucket_id is missing"),
        (payload("INSERT", row(metadata=[1]), None), "record.metadata is not a JSON object"),
        (
            payload("INSERT", row(metadata={"size": "1 KB"}), None),
            "record.metadata.size is not an integer",
        ),
        (
            payload("INSERT", row(metadata={"eTag": 5}), None),
            "record.metadata.eTag is not a string",
        ),
        (payload("INSERT", row(version=7), None), "record.version is not a string"),
        (payload("INSERT", row(updated_at="now"), None), "record.updated_at is not an RFC 3339"),
        (
            payload("INSERT", row(updated_at="0001-01-01T00:00:00+05:00"), None),
            "updated_at is out of range",
        ),
        (payload("UPDATE", row(), row(name=3)), "old_record.name is missing"),
    ],
)
def test_malformed_deliveries_say_why(body: dict[str, Any] | bytes, message: str) -> None:
    assert_malformed(SOURCE, delivery(body), message)


# --- properties ------------------------------------------------------------------------

headers = st.dictionaries(st.text(max_size=20).map(str.lower), st.text(max_size=30), max_size=3)
rows = st.fixed_dictionaries(
    {
        "bucket_id": mostly(st.sampled_from(["avatars", "docs"])),
        "name": mostly(st.sampled_from(["a.png", "b/c d.png"]) | st.text(min_size=1, max_size=8)),
        "version": mostly(st.sampled_from([V1, V2, None])),
        "updated_at": mostly(st.sampled_from(["2024-05-01T10:00:00+00:00", None])),
        "metadata": mostly(
            st.none()
            | st.fixed_dictionaries(
                {},
                optional={
                    "eTag": mostly(st.sampled_from(['"a"', '"b"', "c"])),
                    "size": mostly(st.integers(0, 2**40)),
                },
            )
        ),
    },
    optional={
        "archived_at": mostly(st.none() | st.just("2024-05-05T00:00:00+00:00")),
        "is_delete_marker": mostly(st.booleans()),
        "is_versioned": mostly(st.booleans()),
    },
)
payloads = st.fixed_dictionaries(
    {
        "type": mostly(st.sampled_from(["INSERT", "UPDATE", "DELETE"])),
        "schema": mostly(st.just("storage")),
        "table": mostly(st.just("objects")),
        "record": mostly(rows),
        "old_record": mostly(rows),
    }
)
bodies = webhook_bodies(payloads, lambda v: jsonb_text(v).encode())


@settings(max_examples=300, deadline=None)
@given(body=bodies, extra_headers=headers)
def test_any_input_gives_events_or_malformed_and_stable_ids(
    body: bytes, extra_headers: dict[str, str]
) -> None:
    assert_only_malformed_and_deterministic(
        SOURCE, delivery(body, extra_headers), again=delivery(body)
    )
