"""Azure Event Grid blob events -> FileEvent (streams.core.normalizers.azure).

Fixtures are real or documented payloads (see fixtures/azure/ORIGINS.md); variants are built
from them in code, and each test says what it changed.
"""

from __future__ import annotations

import base64
import copy
import json
from datetime import UTC, datetime
from functools import partial
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from normalizer_support import (
    assert_malformed,
    assert_only_malformed_and_deterministic,
    deliver,
    encode,
    fixture_bytes,
    fixture_names,
    json_strategy,
    load_fixture,
    mostly,
    outcome_kinds,
    single,
)

from streams.core.delivery import Delivery
from streams.core.normalizers import normalize as registry_normalize
from streams.core.normalizers.azure import SOURCE, normalize

fixture = partial(load_fixture, SOURCE)
delivery = partial(deliver, SOURCE)


def raw_delivery(name: str) -> Delivery:
    """The fixture's bytes exactly as published."""
    return Delivery(source="azure", body=fixture_bytes(SOURCE, name))


def queue_delivery(document: Any) -> Delivery:
    """What Event Grid -> Storage Queue -> bridge hands over: base64 of the event JSON."""
    return Delivery(source="azure", body=base64.b64encode(encode(document)))


def first_event(name: str) -> dict[str, Any]:
    document = fixture(name)
    event: dict[str, Any] = document[0] if isinstance(document, list) else document
    return event


# --- BlobCreated / BlobDeleted, both schemas -------------------------------------------------


def test_blob_created_event_grid_schema() -> None:
    event = single(normalize(raw_delivery("eg_blob_created.json")))
    assert event.id == "beb21a5e-401e-002b-3749-928517060431"
    assert event.type == "created"
    assert (event.bucket, event.key) == ("gaocontainer", "Template1.xlsx")
    assert event.size == 17555
    assert event.etag == "0x8D96060BDA19D9D"
    assert event.sequencer == "0000000000000000000000000000B00D0000000005b058d3"
    assert event.time == datetime(2021, 8, 16, 2, 51, 26, 424822, tzinfo=UTC)  # 7 digits cut to 6
    assert event.version_id is None
    assert event.version_only is None
    assert event.provider == SOURCE == "azure"
    assert event.raw == fixture("eg_blob_created.json")


def test_registry_dispatches_to_azure() -> None:
    assert registry_normalize(raw_delivery("eg_blob_created.json")) == normalize(
        raw_delivery("eg_blob_created.json")
    )


@pytest.mark.parametrize(
    ("event_grid", "cloud_events"),
    [
        ("eg_blob_created.json", "ce_blob_created.json"),
        ("eg_blob_deleted.json", "ce_blob_deleted.json"),
        ("eg_blob_renamed.json", "ce_blob_renamed.json"),
    ],
)
def test_both_schemas_give_the_same_canonical_events(event_grid: str, cloud_events: str) -> None:
    from_event_grid = normalize(raw_delivery(event_grid))
    from_cloud_events = normalize(raw_delivery(cloud_events))
    assert [e.summary() for e in from_event_grid] == [e.summary() for e in from_cloud_events]
    assert [e.raw for e in from_cloud_events] == [fixture(cloud_events)] * len(from_cloud_events)


def test_blob_deleted_passes_size_and_etag_through_and_does_not_claim_version_only() -> None:
    event = single(normalize(raw_delivery("eg_blob_deleted.json")))
    assert event.id == "3626e710-c01e-005c-794a-92005606d96d"
    assert (event.type, event.bucket, event.key) == ("deleted", "gaocontainer", "Template1.xlsx")
    assert (event.size, event.etag) == (17555, "0x8D96061B33FE1D2")
    assert event.version_only is None
    assert event.time == datetime(2021, 8, 16, 2, 58, 18, 503829, tzinfo=UTC)


def test_real_create_then_delete_sequencers_order_as_strings() -> None:
    created = single(normalize(raw_delivery("eg_blob_created.json")))
    deleted = single(normalize(raw_delivery("eg_blob_deleted.json")))
    assert created.sequencer is not None and deleted.sequencer is not None
    assert created.sequencer < deleted.sequencer


def test_documented_blob_deleted_without_etag_and_size() -> None:
    event = single(normalize(raw_delivery("doc_ce_blob_deleted.json")))
    assert (event.type, event.key, event.bucket) == (
        "deleted",
        "file-to-delete.txt",
        "testcontainer",
    )
    assert (event.size, event.etag) == (None, None)
    assert event.sequencer == "0000000000000281000000000002F5CA"


def test_quoted_etag_is_unquoted_and_bucket_comes_from_subject_not_url() -> None:
    event = single(normalize(raw_delivery("doc_eg_blob_created.json")))
    assert event.etag == "0x8D4BCC2E4835CD0"
    assert event.bucket == "test-container"  # url says testcontainer (doc inconsistency)
    assert event.size == 524288


def test_cloud_events_subject_without_leading_slash() -> None:
    event = single(normalize(raw_delivery("ce_sample_blob_created.json")))
    assert (event.bucket, event.key) == ("{storage-container}", "{new-file}")
    assert event.id == "9aeb0fdf-c01e-0131-0922-9eb54906e209"


def test_version_id_is_taken_when_present() -> None:
    # Variant: a versionId added to data (Event Grid's schema has none today).
    event = first_event("eg_blob_created.json")
    event["data"]["versionId"] = "2021-08-16T02:51:26.4248221Z"
    assert single(normalize(delivery(event))).version_id == "2021-08-16T02:51:26.4248221Z"


# --- ADLS and SFTP ----------------------------------------------------------------------------


def test_adls_create_file_is_dropped_and_flush_with_close_is_created() -> None:
    assert normalize(raw_delivery("doc_eg_adls_create_file.json")) == []
    # Variant: the same event with api FlushWithClose (the doc has no example of it).
    document = fixture("doc_eg_adls_create_file.json")
    document[0]["data"]["api"] = "FlushWithClose"
    event = single(normalize(delivery(document)))
    assert (event.type, event.bucket, event.key) == ("created", "my-file-system", "new-file.txt")


def test_adls_delete_file_is_deleted() -> None:
    event = single(normalize(raw_delivery("doc_ce_adls_delete_file.json")))
    assert (event.type, event.key) == ("deleted", "file-to-delete.txt")


def test_sftp_commit_is_created_and_sftp_create_is_dropped() -> None:
    event = single(normalize(raw_delivery("doc_ce_sftp_commit.json")))
    assert (event.type, event.key, event.etag) == ("created", "new-file.txt", "0x8D4BCC2E4835CD0")
    # Variant: the empty blob SFTP creates when the file is opened.
    document = fixture("doc_ce_sftp_commit.json")
    document[0]["data"]["api"] = "SftpCreate"
    assert normalize(delivery(document)) == []


# --- renames ----------------------------------------------------------------------------------


def test_blob_renamed_is_a_delete_of_the_old_name_and_a_create_of_the_new() -> None:
    deleted, created = normalize(raw_delivery("eg_blob_renamed.json"))
    event_id = "707665f1-a01f-0037-799a-9490a106020e"
    assert (deleted.id, deleted.type) == (f"{event_id}:deleted", "deleted")
    assert (deleted.bucket, deleted.key) == ("gaocontainer", "metrics.txt")
    assert deleted.version_only is False
    assert (created.id, created.type) == (f"{event_id}:created", "created")
    assert (created.bucket, created.key) == ("gaocontainer", "newname")
    assert created.version_only is None
    for event in (deleted, created):
        assert event.sequencer == "0000000000000000000000000000010200000000000364db"
        assert (event.size, event.etag) == (None, None)
        assert event.time == datetime(2021, 8, 19, 1, 37, 38, 932478, tzinfo=UTC)
        assert event.raw == fixture("eg_blob_renamed.json")


def test_sftp_rename_with_blob_endpoint_urls() -> None:
    deleted, created = normalize(raw_delivery("doc_ce_sftp_rename.json"))
    assert (deleted.type, deleted.key) == ("deleted", "my-original-file.txt")
    assert (created.type, created.key) == ("created", "my-renamed-file.txt")


def renamed(
    old: str, new: str, encode: bool, fields: tuple[str, str] = ("sourceUrl", "destinationUrl")
) -> dict[str, Any]:
    """Variant of the real rename: other names, URLs raw or percent-encoded, in `fields` only."""
    event = first_event("eg_blob_renamed.json")
    event["subject"] = f"/blobServices/default/containers/gaocontainer/blobs/{new}"
    data = event["data"]
    for name in ("sourceUrl", "destinationUrl", "sourceBlobUrl", "destinationBlobUrl"):
        data.pop(name)

    def url(path: str) -> str:
        return "https://jolovdfs.dfs.core.windows.net/gaocontainer/" + (
            quote(path, safe="/") if encode else path
        )

    data[fields[0]], data[fields[1]] = url(old), url(new)
    return event


@pytest.mark.parametrize("encode", [False, True], ids=["raw URLs", "percent-encoded URLs"])
@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("old dir/a+b%.txt", "new dir/c+d%.txt"),
        ("données/ré sumé.pdf", "données/résumé 2.pdf"),
        ("100%25 literal.txt", "x y.txt"),
    ],
)
def test_rename_source_url_is_read_the_way_the_destination_matches_the_subject(
    old: str, new: str, encode: bool
) -> None:
    deleted, created = normalize(delivery(renamed(old, new, encode)))
    assert (deleted.key, created.key) == (old, new)


def test_rename_falls_back_to_the_blob_endpoint_urls() -> None:
    event = renamed("a b.txt", "c d.txt", True, ("sourceBlobUrl", "destinationBlobUrl"))
    event["data"]["sourceUrl"] = 42  # unusable dfs pair
    deleted, _ = normalize(delivery(event))
    assert deleted.key == "a b.txt"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("old%20name.txt", "old name.txt"),  # looks percent-encoded: decoded
        ("100%.txt", "100%.txt"),  # not a valid escape: raw
        ("a b%20c.txt", "a b%20c.txt"),  # a raw space: the URL is not encoded
    ],
)
def test_rename_with_an_escape_free_destination_judges_the_source_itself(
    source: str, expected: str
) -> None:
    event = renamed("placeholder", "plain.txt", False)
    event["data"]["sourceUrl"] = f"https://jolovdfs.dfs.core.windows.net/gaocontainer/{source}"
    deleted, _ = normalize(delivery(event))
    assert deleted.key == expected


def test_rename_whose_urls_do_not_match_the_subject_is_malformed() -> None:
    event = renamed("old.txt", "new.txt", False)
    event["data"]["destinationUrl"] = "https://jolovdfs.dfs.core.windows.net/gaocontainer/other"
    assert_malformed(SOURCE, event, "old key is unknown")


# --- dropped kinds ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "eg_subscription_validation.json",
        "eg_blob_tier_changed.json",
        "eg_directory_created.json",
        "eg_directory_renamed.json",
        "eg_directory_deleted.json",
        "doc_eg_async_operation_initiated.json",
        "doc_ce_blob_inventory_policy_completed.json",
    ],
)
def test_events_that_are_not_a_committed_blob_change_are_dropped(name: str) -> None:
    assert normalize(raw_delivery(name)) == []


# --- batches, order, queue bodies ----------------------------------------------------------


def test_sdk_batch_mixing_accounts_and_services() -> None:
    events = normalize(raw_delivery("sdk_multiple_events_same_batch.json"))
    assert [(e.type, e.key) for e in events] == [
        ("created", "file1.txt"),
        ("deleted", "testfile.txt"),
        ("deleted", "testfile.txt"),  # a duplicate: same id, for dedupe to drop
    ]
    assert events[1].id == events[2].id == "4c2359fe-001e-00ba-0e04-58586806d298"
    assert {e.bucket for e in events} == {"testcontainer"}
    # The account is not in the bucket; it stays in raw.
    assert events[0].raw is not None and events[0].raw["topic"].endswith("/myaccount")
    assert events[1].raw is not None and events[1].raw["topic"].endswith("/xstoretestaccount")


def test_array_delivery_keeps_array_order() -> None:
    batch = [
        first_event("eg_blob_deleted.json"),
        first_event("eg_subscription_validation.json"),
        first_event("eg_blob_renamed.json"),
        first_event("ce_blob_created.json"),
    ]
    events = normalize(delivery(batch))
    assert [e.id for e in events] == [
        "3626e710-c01e-005c-794a-92005606d96d",
        "707665f1-a01f-0037-799a-9490a106020e:deleted",
        "707665f1-a01f-0037-799a-9490a106020e:created",
        "beb21a5e-401e-002b-3749-928517060431",
    ]


def test_empty_array_gives_nothing() -> None:
    assert normalize(Delivery(source="azure", body=b"[]")) == []


@pytest.mark.parametrize(
    "name",
    [
        "eg_blob_created.json",
        "ce_blob_deleted.json",
        "eg_blob_renamed.json",
        "doc_eg_blob_created.json",
    ],
)
def test_base64_storage_queue_body_gives_the_same_events(name: str) -> None:
    plain = normalize(raw_delivery(name))
    assert normalize(queue_delivery(fixture(name))) == plain
    encoded = base64.b64encode(fixture_bytes(SOURCE, name))
    assert normalize(Delivery(source="azure", body=encoded + b"\n")) == plain


def test_validation_event_through_a_queue_gives_nothing() -> None:
    assert normalize(queue_delivery(fixture("eg_subscription_validation.json"))) == []


# --- keys ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "dir with space/file name.txt",
        "a+b+c.txt",
        "100%25 sure%2Fnot a slash.txt",
        "tasklog_14💎.log",
        "日本語/ファイル.pdf",
        "nested/blobs/inside.txt",
        "question?hash#.txt",
    ],
)
def test_keys_are_kept_raw(key: str) -> None:
    # Variant: the real BlobCreated with the subject's blob path replaced by `key`.
    event = first_event("eg_blob_created.json")
    event["subject"] = f"/blobServices/default/containers/gaocontainer/blobs/{key}"
    assert single(normalize(delivery(event))).key == key


# --- malformed deliveries ----------------------------------------------------------------


def _created_with(**changes: Any) -> dict[str, Any]:
    event = first_event("eg_blob_created.json")
    for name, value in changes.items():
        if name.startswith("data_"):
            event["data"][name.removeprefix("data_")] = value
        elif value is None:
            event.pop(name)
        else:
            event[name] = value
    return event


MALFORMED: list[tuple[str, bytes, str]] = [
    ("empty body", b"  \n", "empty"),
    ("binary body", b"\x00\xff\xfe", "neither JSON nor base64"),
    ("text body", b"hello world", "neither JSON nor base64"),
    ("broken JSON", b'[{"id": ', "not JSON"),
    ("base64 of non-JSON", base64.b64encode(b"<xml/>"), "base64-decoded body is not JSON"),
    ("base64 of a number", base64.b64encode(b"42"), "neither an event object nor an array"),
    ("array of numbers", b"[1]", "event 0 is not a JSON object"),
    ("no type at all", b'{"id": "x", "subject": "s"}', "neither eventType"),
    ("type not a string", json.dumps(_created_with(eventType=7)).encode(), "eventType"),
    ("no id", json.dumps(_created_with(id=None)).encode(), "id"),
    ("id not a string", json.dumps(_created_with(id=5)).encode(), "id"),
    ("subject missing", json.dumps(_created_with(subject=None)).encode(), "subject"),
    (
        "subject not a blob path",
        json.dumps(_created_with(subject="/blobServices/default/containers/c")).encode(),
        "not a blob path",
    ),
    (
        "subject with empty blob name",
        json.dumps(_created_with(subject="/blobServices/default/containers/c/blobs/")).encode(),
        "not a blob path",
    ),
    ("data missing", json.dumps(_created_with(data=None)).encode(), "data"),
    ("data not an object", json.dumps(_created_with(data="x")).encode(), "data"),
    ("api not a string", json.dumps(_created_with(data_api=1)).encode(), "data.api"),
    (
        "contentLength not a number",
        json.dumps(_created_with(data_contentLength="big")).encode(),
        "contentLength",
    ),
    ("sequencer not a string", json.dumps(_created_with(data_sequencer=3)).encode(), "sequencer"),
    ("bad eventTime", json.dumps(_created_with(eventTime="noon")).encode(), "eventTime"),
    (
        "eventTime out of range",
        json.dumps(_created_with(eventTime="9999-12-31T23:59:59-01:00")).encode(),
        "out of range",
    ),
    (
        "lone surrogate",
        json.dumps(
            _created_with(subject="/blobServices/default/containers/c/blobs/\ud800")
        ).encode(),
        "Unicode",
    ),
    ("NaN", json.dumps(_created_with(data_contentLength=float("nan"))).encode(), "non-finite"),
    ("integer too long", b'{"eventType": ' + b"1" * 5000 + b"}", "JSON"),
]


@pytest.mark.parametrize(
    ("body", "message"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED]
)
def test_malformed_deliveries_raise_malformed_delivery_with_a_clear_message(
    body: bytes, message: str
) -> None:
    assert_malformed(SOURCE, body, message)


def test_one_bad_event_makes_the_whole_batch_malformed() -> None:
    batch = [first_event("eg_blob_created.json"), _created_with(subject="nowhere")]
    assert_malformed(SOURCE, batch, "event 1 subject")


# --- properties ---------------------------------------------------------------------------

EVENT_TYPES = [
    "Microsoft.Storage.BlobCreated",
    "Microsoft.Storage.BlobDeleted",
    "Microsoft.Storage.BlobRenamed",
    "Microsoft.Storage.DirectoryDeleted",
    "Microsoft.EventGrid.SubscriptionValidationEvent",
]
json_values = json_strategy(max_text=20, max_key=10, max_leaves=20)

names = st.text(min_size=1, max_size=12)
subjects = mostly(
    st.builds("/blobServices/default/containers/{}/blobs/{}".format, names, names),
    st.text(max_size=30) | json_values,
)
urls = mostly(
    st.builds("https://acct.blob.core.windows.net/{}/{}".format, names, names),
    st.text(max_size=30) | json_values,
)
near_valid_data = st.fixed_dictionaries(
    {},
    optional={
        "api": mostly(
            st.sampled_from(["PutBlob", "CreateFile", "FlushWithClose", "SftpCreate"]), json_values
        ),
        "eTag": mostly(st.text(max_size=12), json_values),
        "contentLength": mostly(st.integers(min_value=0), st.text(max_size=5) | json_values),
        "sequencer": mostly(st.text(max_size=48), json_values),
        "sourceUrl": urls,
        "destinationUrl": urls,
        "sourceBlobUrl": urls,
        "destinationBlobUrl": urls,
        "versionId": mostly(st.text(max_size=10), json_values),
    },
)
timestamps = st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat())


def near_valid_event(cloud_events: bool) -> st.SearchStrategy[dict[str, Any]]:
    type_field, time_field = ("type", "time") if cloud_events else ("eventType", "eventTime")
    required: dict[str, st.SearchStrategy[Any]] = {
        type_field: mostly(st.sampled_from(EVENT_TYPES), json_values),
        "id": mostly(st.text(min_size=1, max_size=12), json_values),
        "subject": subjects,
        "data": mostly(near_valid_data, json_values),
    }
    if cloud_events:
        required["specversion"] = st.just("1.0")
    return st.fixed_dictionaries(
        required, optional={time_field: mostly(timestamps, st.text(max_size=10) | json_values)}
    )


near_valid_events = near_valid_event(False) | near_valid_event(True)


PROPERTY_SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@PROPERTY_SETTINGS
@given(body=st.binary(max_size=200))
def test_arbitrary_bytes(body: bytes) -> None:
    assert_only_malformed_and_deterministic(SOURCE, body)


@PROPERTY_SETTINGS
@given(document=json_values)
def test_arbitrary_json_structures(document: Any) -> None:
    assert_only_malformed_and_deterministic(SOURCE, document)


@PROPERTY_SETTINGS
@given(events=st.lists(near_valid_events, max_size=4), as_array=st.booleans())
def test_near_valid_events_plain_and_through_a_queue(
    events: list[dict[str, Any]], as_array: bool
) -> None:
    document: Any = events if as_array or not events else events[0]
    text = json.dumps(document).encode()
    result = assert_only_malformed_and_deterministic(SOURCE, text)
    assert assert_only_malformed_and_deterministic(SOURCE, base64.b64encode(text)) == result


def test_property_strategies_reach_the_mapping_code() -> None:
    """Guard for the property above: its examples must not all stop at validation."""
    kinds = outcome_kinds(SOURCE, near_valid_events, examples=200)
    assert kinds == {"malformed", "events", "none"}


def test_normalizing_a_fixture_twice_gives_the_same_events() -> None:
    for name in fixture_names(SOURCE):
        body = fixture_bytes(SOURCE, name)
        assert normalize(Delivery("azure", body)) == normalize(Delivery("azure", copy.copy(body)))
