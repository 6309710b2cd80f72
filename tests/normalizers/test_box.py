"""Box V2 webhooks -> FileEvent. Fixture origins: fixtures/box/ORIGINS.md."""

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
from streams.core.normalizers.box import SOURCE, normalize

fixture = partial(fixture_bytes, SOURCE)
delivery = partial(deliver, SOURCE)


def docs_body(**changes: Any) -> dict[str, Any]:
    """The documented FILE.UPLOADED body with top-level fields changed (None removes one).

    FILE.RESTORED, FILE.COPIED, FILE.DELETED and a body without `id` have no public
    payload: they are built this way (see ORIGINS.md).
    """
    body: dict[str, Any] = load_fixture(SOURCE, "docs_file_uploaded.json")
    return set_fields(body, changes)


def test_documented_upload_maps_every_field() -> None:
    [event] = normalize(delivery(fixture("docs_file_uploaded.json")))
    assert event == FileEvent(
        id="eb0c4e06-751f-442c-86f8-fd5bb404dbec",
        type="created",
        key="73835521473",
        bucket=None,
        size=26458,
        etag="2c61623e86bee78e6ab444af456bccc7a1164095",
        version_id="78096737033",
        time=datetime(2016, 7, 11, 17, 10, 32, tzinfo=UTC),
        sequencer=None,
        provider="box",
        version_only=None,
        raw=docs_body(),
    )


def test_real_upload_capture() -> None:
    [event] = normalize(delivery(fixture("capture_2025_file_uploaded.json")))
    assert (event.id, event.type, event.key) == (
        "06d58ee4-9bf9-4a7b-8f71-184a26a4c06f",
        "created",
        "1859497976800",
    )
    assert event.version_id == "2050398896800"
    assert event.time == datetime(2025, 5, 12, 3, 22, 42, tzinfo=UTC)
    assert event.raw is not None and event.raw["source"]["name"] == "4444.jpg"  # path kept


def test_real_trash_body_carries_only_the_file_id() -> None:
    [event] = normalize(delivery(fixture("capture_2025_file_trashed.json")))
    assert event.type == "deleted"
    assert event.version_only is False
    assert (event.id, event.key) == ("1f00344e-e4ea-4391-a612-f79c5a8d4f57", "1859597022426")
    assert (event.size, event.etag, event.version_id) == (None, None, None)
    assert event.time == datetime(2025, 5, 12, 5, 35, 32, tzinfo=UTC)


@pytest.mark.parametrize(
    ("trigger", "kind"),
    [("FILE.RESTORED", "created"), ("FILE.COPIED", "created"), ("FILE.DELETED", "deleted")],
)
def test_built_trigger_kinds(trigger: str, kind: str) -> None:
    [event] = normalize(delivery(encode(docs_body(trigger=trigger, id=f"id-{trigger}"))))
    assert (event.type, event.id, event.key) == (kind, f"id-{trigger}", "73835521473")
    assert event.version_only == (False if kind == "deleted" else None)


def test_rename_and_move_are_dropped_because_the_key_is_the_file_id() -> None:
    assert normalize(delivery(fixture("capture_2025_file_renamed.json"))) == []
    assert normalize(delivery(encode(docs_body(trigger="FILE.MOVED")))) == []


@pytest.mark.parametrize(
    "body",
    [
        fixture("capture_2025_folder_moved.json"),
        fixture("issue764_folder_trashed.json"),
        encode(docs_body(trigger="FILE.PREVIEWED")),
        encode(docs_body(trigger="FILE.DOWNLOADED")),
        encode(docs_body(trigger="FILE.LOCKED")),
        encode(docs_body(trigger="COMMENT.CREATED", source={"id": "5", "type": "comment"})),
        encode(docs_body(trigger="WEBHOOK.DELETED")),
    ],
)
def test_other_triggers_are_dropped(body: bytes) -> None:
    assert normalize(delivery(body)) == []


def test_the_delivery_id_header_never_becomes_the_event_id() -> None:
    body = fixture("docs_file_uploaded.json")
    first = normalize(
        delivery(
            body,
            {
                "box-delivery-id": "673a081b-bb4b-4d45-b4f1-4131a29c1d07",
                "box-delivery-timestamp": "2016-07-11T10:10:33-07:00",
            },
        )
    )
    retry = normalize(
        delivery(
            body,
            {
                "box-delivery-id": "0f46a6ca-86bf-44ab-8cf5-f08e1e02876b",
                "box-delivery-timestamp": "2016-07-11T10:15:40-07:00",
            },
        )
    )
    assert (
        [e.id for e in first] == [e.id for e in retry] == ["eb0c4e06-751f-442c-86f8-fd5bb404dbec"]
    )


def test_redelivery_gets_the_same_ids() -> None:
    for name in fixture_names(SOURCE):
        body = fixture(name)
        assert [e.id for e in normalize(delivery(body))] == [
            e.id for e in normalize(delivery(body))
        ], name


def test_body_without_id_derives_one() -> None:
    # §11 #22: the box-python-sdk signature vector's body has no id.
    [event] = normalize(delivery(encode(docs_body(id=None))))
    assert event.id == derived_id("box", "FILE.UPLOADED", None, "73835521473", "78096737033")
    trashed = load_fixture(SOURCE, "capture_2025_file_trashed.json")
    del trashed["id"]
    [event] = normalize(delivery(encode(trashed)))
    assert event.id == derived_id(
        "box", "FILE.TRASHED", None, "1859597022426", None, "2025-05-12T05:35:32Z", None
    )
    del trashed["created_at"]
    [event] = normalize(delivery(encode(trashed)))
    assert event.id == record_hash_id("box", trashed)


@pytest.mark.parametrize("file_id", ["12 34", "a+b", "100%", "ünï/😀"])
def test_keys_are_kept_raw(file_id: str) -> None:
    body = docs_body()
    body["source"]["id"] = file_id
    [event] = normalize(delivery(encode(body)))
    assert event.key == file_id


def test_names_with_special_characters_stay_in_raw() -> None:
    body = docs_body()
    body["source"]["name"] = "my file+v2 100%.png"
    [event] = normalize(delivery(encode(body)))
    assert event.key == "73835521473"
    assert event.raw is not None and event.raw["source"]["name"] == "my file+v2 100%.png"


def bad(**source_changes: Any) -> bytes:
    body = docs_body()
    set_fields(body["source"], source_changes)
    return encode(body)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"<xml/>", "not JSON"),
        (b'"FILE.UPLOADED"', "body is not a JSON object"),
        (encode(docs_body(type="event")), "is not 'webhook_event'"),
        (encode(docs_body(trigger=None)), "trigger is missing"),
        (encode(docs_body(trigger=3)), "trigger is missing"),
        (encode(docs_body(source=None)), "source is not a JSON object"),
        (encode(docs_body(source=[1])), "source is not a JSON object"),
        (bad(type="folder"), "source.type is 'folder', not 'file'"),
        (bad(id=None), "source.id is missing"),
        (bad(id=73835521473), "source.id is missing"),
        (bad(size="big"), "source.size is not an integer"),
        (bad(file_version="78096737033"), "source.file_version is not a JSON object"),
        (bad(sha1=1), "source.sha1 is not a string"),
        (encode(docs_body(created_at="yesterday")), "created_at is not an RFC 3339 time"),
        (
            encode(docs_body(created_at="0001-01-01T00:00:00+01:00")),
            "created_at is out of range",
        ),
        (encode(docs_body(id=7)), "id is not a string"),
    ],
)
def test_malformed_deliveries_say_why(body: bytes, message: str) -> None:
    assert_malformed(SOURCE, body, message)


# --- properties ------------------------------------------------------------------------

headers = st.dictionaries(
    st.sampled_from(["box-delivery-id", "box-delivery-timestamp", "box-signature-primary"])
    | st.text(max_size=20).map(str.lower),
    st.text(max_size=40),
    max_size=4,
)
sources = st.fixed_dictionaries(
    {
        "id": mostly(st.text(min_size=1, max_size=8)),
        "type": mostly(st.sampled_from(["file", "file", "folder"])),
    },
    optional={
        "size": mostly(st.integers(0, 2**40)),
        "sha1": mostly(st.text(alphabet="0123456789abcdef", max_size=8)),
        "file_version": mostly(st.fixed_dictionaries({"id": mostly(st.text(max_size=8))})),
    },
)
box_bodies = st.fixed_dictionaries(
    {
        "trigger": mostly(
            st.sampled_from(
                ["FILE.UPLOADED", "FILE.TRASHED", "FILE.DELETED", "FILE.RENAMED", "FOLDER.CREATED"]
            )
        ),
        "source": mostly(sources),
    },
    optional={
        "type": mostly(st.just("webhook_event")),
        "id": mostly(st.text(max_size=8)),
        "created_at": mostly(
            st.sampled_from(["2016-07-11T10:10:32-07:00", "2025-05-11T22:35:32-07:00"])
        ),
    },
)
bodies = webhook_bodies(box_bodies)


@settings(max_examples=300, deadline=None)
@given(body=bodies, extra_headers=headers)
def test_any_input_gives_events_or_malformed_and_stable_ids(
    body: bytes, extra_headers: dict[str, str]
) -> None:
    assert_only_malformed_and_deterministic(
        SOURCE, delivery(body, extra_headers), again=delivery(body)
    )
