"""GCS Pub/Sub notifications -> FileEvent (streams.core.normalizers.gcs).

Fixtures are real or documented payloads (see fixtures/gcs/ORIGINS.md); variants are built
from them in code, and each test says what it changed.
"""

from __future__ import annotations

import base64
import copy
import json
import unicodedata
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from normalizer_support import (
    assert_malformed,
    assert_only_malformed_and_deterministic,
    deliver,
    fixture_bytes,
    fixture_names,
    json_strategy,
    load_fixture,
    outcome,
    outcome_kinds,
    set_fields,
    single,
)

from streams.core.delivery import Delivery
from streams.core.normalizers import normalize as registry_normalize
from streams.core.normalizers.base import derived_id
from streams.core.normalizers.gcs import SOURCE, normalize

fixture = partial(load_fixture, SOURCE)


def push_delivery(envelope: dict[str, Any]) -> Delivery:
    return deliver(SOURCE, envelope)


def pull_delivery(attributes: dict[str, str], resource: dict[str, Any] | None) -> Delivery:
    body = json.dumps(resource).encode() if resource is not None else b""
    return Delivery(source="gcs", body=body, attributes=attributes)


def unwrap(envelope: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any] | None]:
    """(attributes, object resource) of a push envelope, as a pull subscriber receives them."""
    message = envelope["message"]
    data = message.get("data")
    resource = json.loads(base64.b64decode(data)) if data else None
    return dict(message["attributes"]), resource


def envelope_with(
    envelope: dict[str, Any],
    attributes: dict[str, str | None] | None = None,
    resource: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A copy of a push envelope with attributes changed (None removes one) and/or data replaced."""
    result = copy.deepcopy(envelope)
    message = result["message"]
    set_fields(message["attributes"], attributes or {})
    if resource is not None:
        message["data"] = base64.b64encode(json.dumps(resource).encode()).decode()
    return result


PUSH_FIXTURES = fixture_names(SOURCE, "push_*.json")


# --- mapped kinds ------------------------------------------------------------------------


def test_finalize_real_2025_push_delivery() -> None:
    delivery = Delivery(source="gcs", body=fixture_bytes(SOURCE, "push_finalize_2025_nfd.json"))
    event = single(normalize(delivery))
    key = "None/Care Plus - acesso dois carto\u0303es (dental e me\u0301dico).pdf"
    generation = "1736358966947877"
    assert event.id == derived_id(
        "gcs", "OBJECT_FINALIZE", "imag-easy-upload-dasa-gem-app", key, generation
    )
    assert event.type == "created"
    assert event.key == key  # NFD kept: NFC would name another object
    assert not unicodedata.is_normalized("NFC", event.key)
    assert event.bucket == "imag-easy-upload-dasa-gem-app"
    assert event.size == 1028818
    assert event.etag == "CKXgtZvZ5ooDEAE="
    assert event.version_id == generation
    assert event.sequencer == generation
    assert event.time == datetime(2025, 1, 8, 17, 56, 6, 952527, tzinfo=UTC)
    assert event.provider == SOURCE == "gcs"
    assert event.version_only is None
    assert event.raw is not None
    assert event.raw["generation"] == generation
    assert event.raw["metageneration"] == "1"
    assert event.raw["attributes"]["eventType"] == "OBJECT_FINALIZE"
    assert "messageId" not in json.dumps(event.raw)


def test_registry_dispatches_to_gcs() -> None:
    delivery = Delivery(source="gcs", body=fixture_bytes(SOURCE, "push_finalize_2017.json"))
    assert registry_normalize(delivery) == normalize(delivery)


@pytest.mark.parametrize("name", PUSH_FIXTURES)
def test_pull_and_push_of_one_change_give_the_same_event(name: str) -> None:
    envelope = fixture(name)
    attributes, resource = unwrap(envelope)
    assert normalize(push_delivery(envelope)) == normalize(pull_delivery(attributes, resource))


def test_push_attributes_are_merged_over_delivery_attributes() -> None:
    envelope = fixture("push_finalize_2017.json")
    delivery = Delivery(
        source="gcs",
        body=json.dumps(envelope).encode(),
        attributes={"eventType": "OBJECT_DELETE", "custom": "kept"},
    )
    event = single(normalize(delivery))
    assert event.type == "created"  # the envelope's eventType wins
    assert event.raw is not None
    assert event.raw["attributes"]["custom"] == "kept"


def test_two_deliveries_with_different_message_ids_give_the_same_id() -> None:
    first = fixture("push_finalize_2025_nfd.json")
    second = copy.deepcopy(first)
    for field in ("messageId", "message_id"):
        second["message"][field] = "99999999999999999"
    for field in ("publishTime", "publish_time"):
        second["message"][field] = "2025-01-08T17:58:00.000Z"
    second["message"]["deliveryAttempt"] = 5
    assert normalize(push_delivery(first)) == normalize(push_delivery(second))


def test_2017_finalize_without_event_time_takes_payload_updated_not_publish_time() -> None:
    event = single(normalize(push_delivery(fixture("push_finalize_2017.json"))))
    assert event.type == "created"
    assert event.key == "sample/one_class_svm.png"
    assert event.bucket == "sandbox-hara.appspot.com"
    assert event.size == 12242
    assert event.etag == "CJ3LmvmG29YCEAE="
    # publishTime is 03:28:28.241Z; the payload's `updated` is the object's own time.
    assert event.time == datetime(2017, 10, 6, 3, 28, 27, 777000, tzinfo=UTC)


def test_delete_is_deleted_and_does_not_say_whether_a_version_or_the_live_object_went() -> None:
    event = single(normalize(push_delivery(fixture("push_delete_2017.json"))))
    assert event.type == "deleted"
    assert event.key == "one_class_svm.png"
    assert event.version_id == event.sequencer == "1507260193176852"
    assert event.version_only is None
    assert event.size == 12242  # the metadata as it was before the delete
    # 2017 format: no eventTime and no timeDeleted; `updated` is not a deletion time.
    assert event.time is None


def test_overwrite_gives_only_the_finalize_of_the_new_generation() -> None:
    created = single(normalize(push_delivery(fixture("push_finalize_overwrote_2017.json"))))
    assert created.type == "created"
    assert created.sequencer == "1507260566514012"
    assert created.raw is not None
    assert created.raw["attributes"]["overwroteGeneration"] == "1507260507792797"
    assert normalize(push_delivery(fixture("push_delete_overwritten_2017.json"))) == []


def test_archive_caused_by_an_overwrite_is_skipped() -> None:
    # Variant: the versioning-on twin of the overwrite's DELETE (eventType changed to ARCHIVE).
    envelope = envelope_with(
        fixture("push_delete_overwritten_2017.json"), {"eventType": "OBJECT_ARCHIVE"}
    )
    assert normalize(push_delivery(envelope)) == []


def test_archive_of_the_live_version_is_a_delete_of_the_key() -> None:
    # Variant: versioning on, so deleting the live object gives ARCHIVE (eventType changed).
    envelope = envelope_with(fixture("push_delete_2017.json"), {"eventType": "OBJECT_ARCHIVE"})
    event = single(normalize(push_delivery(envelope)))
    assert event.type == "deleted"
    assert event.version_only is False
    assert event.version_id == "1507260193176852"


def test_archive_and_a_later_purge_of_the_same_generation_stay_distinct() -> None:
    delete = fixture("push_delete_2017.json")
    archive = envelope_with(delete, {"eventType": "OBJECT_ARCHIVE"})
    archived = single(normalize(push_delivery(archive)))
    purged = single(normalize(push_delivery(delete)))
    assert archived.id != purged.id
    assert archived.sequencer == purged.sequencer


def test_gsutil_mv_is_a_create_of_the_new_name_and_a_delete_of_the_old() -> None:
    created = single(normalize(push_delivery(fixture("push_finalize_rename_2017.json"))))
    deleted = single(normalize(push_delivery(fixture("push_delete_rename_2017.json"))))
    assert (created.type, created.key) == ("created", "sample/one_class_svm_change.png")
    assert (deleted.type, deleted.key) == ("deleted", "sample/one_class_svm.png")


@pytest.mark.parametrize("event_type", ["OBJECT_METADATA_UPDATE", "OBJECT_INITIALIZE", "BUCKET_X"])
def test_kinds_without_a_content_change_are_dropped(event_type: str) -> None:
    # Variant: the 2025 finalize with eventType changed (and a new metageneration).
    envelope = fixture("push_finalize_2025_nfd.json")
    _, resource = unwrap(envelope)
    assert resource is not None
    resource["metageneration"] = "2"
    changed = envelope_with(envelope, {"eventType": event_type}, resource)
    assert normalize(push_delivery(changed)) == []


# --- payloadFormat NONE and other payload shapes ---------------------------------------------


def test_payload_format_none_pull_gives_an_event_from_the_attributes_alone() -> None:
    attributes = fixture("doc_attributes.json") | {"payloadFormat": "NONE"}
    event = single(normalize(pull_delivery(attributes, None)))
    assert event.id == derived_id("gcs", "OBJECT_FINALIZE", "foo", "bar", "123456")
    assert (event.type, event.bucket, event.key) == ("created", "foo", "bar")
    assert event.sequencer == event.version_id == "123456"
    assert event.time == datetime(2021, 1, 15, 1, 30, 15, 10000, tzinfo=UTC)
    assert (event.size, event.etag) == (None, None)
    assert event.raw == {"attributes": attributes}


def test_payload_format_none_push_matches_pull() -> None:
    attributes = fixture("doc_attributes.json") | {"payloadFormat": "NONE"}
    for message in (
        {"attributes": attributes, "messageId": "1", "publishTime": "2021-01-15T01:30:16Z"},
        {"attributes": attributes, "data": "", "messageId": "2"},
    ):
        envelope = {"message": message, "subscription": "projects/p/subscriptions/s"}
        assert normalize(push_delivery(envelope)) == normalize(pull_delivery(attributes, None))


def test_payload_format_none_delete_has_no_time_without_event_time() -> None:
    attributes = fixture("doc_attributes.json") | {"payloadFormat": "NONE"}
    attributes |= {"eventType": "OBJECT_DELETE"}
    del attributes["eventTime"]
    event = single(normalize(pull_delivery(attributes, None)))
    assert (event.type, event.time, event.version_only) == ("deleted", None, None)


def test_numeric_payload_fields_and_time_deleted_fallback() -> None:
    # google-cloudevents test data: numbers where GCS sends strings; attributes built for it.
    resource = fixture("storage_object_data_complex.json")
    attributes = {
        "eventType": "OBJECT_DELETE",
        "bucketId": "sample-bucket",
        "objectId": "MyFile",
        "objectGeneration": "96883251",
        "payloadFormat": "JSON_API_V1",
    }
    event = single(normalize(pull_delivery(attributes, resource)))
    assert event.type == "deleted"
    assert event.size == 0
    assert event.sequencer == "96883251"
    assert event.time == datetime(2020, 5, 18, 9, 7, 51, 799000, tzinfo=UTC)
    assert event.raw is not None
    assert (event.raw["generation"], event.raw["metageneration"]) == (96883251, 1)


def test_payload_alone_names_the_object_when_attributes_lack_it() -> None:
    resource = fixture("storage_object_data_complex.json")
    event = single(normalize(pull_delivery({"eventType": "OBJECT_FINALIZE"}, resource)))
    assert (event.bucket, event.key, event.sequencer) == ("sample-bucket", "MyFile", "96883251")
    assert event.time == datetime(1970, 9, 15, 14, 5, 26, 975000, tzinfo=UTC)  # `updated`


def test_one_pair_of_etag_quotes_is_stripped() -> None:
    envelope = fixture("push_finalize_2017.json")
    _, resource = unwrap(envelope)
    assert resource is not None
    resource["etag"] = '"CJ3LmvmG29YCEAE="'
    event = single(normalize(push_delivery(envelope_with(envelope, resource=resource))))
    assert event.etag == "CJ3LmvmG29YCEAE="


@pytest.mark.parametrize(
    "key",
    [
        "dir with space/file name.txt",
        "a+b+c.txt",
        "100%25 sure%2Fnot a slash.txt",
        "%E2%82%AC literally",
        "日本語/ファイル 1.pdf",
        "emoji 💎.log",
        "trailing/",
    ],
)
def test_keys_are_kept_raw(key: str) -> None:
    # Variant: the 2017 finalize with objectId and payload name replaced by `key`.
    envelope = fixture("push_finalize_2017.json")
    _, resource = unwrap(envelope)
    assert resource is not None
    resource["name"] = key
    changed = envelope_with(envelope, {"objectId": key}, resource)
    event = single(normalize(push_delivery(changed)))
    assert event.key == key
    attributes, _ = unwrap(changed)
    assert single(normalize(pull_delivery(attributes, resource))).id == event.id


# --- malformed deliveries ----------------------------------------------------------------


def _finalize() -> tuple[dict[str, str], dict[str, Any]]:
    attributes, resource = unwrap(fixture("push_finalize_2017.json"))
    assert resource is not None
    return attributes, resource


def _malformed_cases() -> list[tuple[str, Delivery, str]]:
    attributes, resource = _finalize()
    good_data = base64.b64encode(json.dumps(resource).encode()).decode()
    cases: list[tuple[str, Delivery, str]] = [
        ("binary body", Delivery("gcs", b"\xff\xfe\x00garbage", attributes=attributes), "not JSON"),
        ("array body", Delivery("gcs", b"[1, 2]", attributes=attributes), "not a JSON object"),
        ("envelope message not an object", push_delivery({"message": "hi"}), "message"),
        (
            "envelope data not base64",
            push_delivery({"message": {"data": "not base64!", "attributes": attributes}}),
            "base64",
        ),
        (
            "envelope data not a string",
            push_delivery({"message": {"data": 12, "attributes": attributes}}),
            "base64 string",
        ),
        (
            "envelope data base64 of non-JSON",
            push_delivery(
                {"message": {"data": base64.b64encode(b"<xml/>").decode(), "attributes": {}}}
            ),
            "not JSON",
        ),
        (
            "envelope attributes not a map",
            push_delivery({"message": {"data": good_data, "attributes": ["eventType"]}}),
            "not a map",
        ),
        (
            "non-string attribute",
            push_delivery({"message": {"attributes": attributes | {"eventType": 7}}}),
            "not a string attribute",
        ),
        (
            "no eventType",
            pull_delivery({k: v for k, v in attributes.items() if k != "eventType"}, resource),
            "eventType",
        ),
        (
            "no object name anywhere",
            pull_delivery({"eventType": "OBJECT_FINALIZE", "bucketId": "b"}, None),
            "objectId",
        ),
        (
            "no generation anywhere",
            pull_delivery({"eventType": "OBJECT_FINALIZE", "bucketId": "b", "objectId": "k"}, None),
            "objectGeneration",
        ),
        (
            "generation not a number",
            pull_delivery(attributes | {"objectGeneration": "12a"}, None),
            "generation",
        ),
        (
            "attribute and payload name differ",
            pull_delivery(attributes | {"objectId": "other.png"}, resource),
            "differs",
        ),
        (
            "attribute and payload generation differ",
            pull_delivery(attributes | {"objectGeneration": "1"}, resource),
            "differs",
        ),
        (
            "payload name not a string",
            pull_delivery(attributes, resource | {"name": ["x"]}),
            "payload name",
        ),
        (
            "bad eventTime",
            pull_delivery(attributes | {"eventTime": "yesterday"}, resource),
            "eventTime",
        ),
        (
            "eventTime out of range",
            pull_delivery(attributes | {"eventTime": "0001-01-01T00:00:00+01:00"}, resource),
            "out of range",
        ),
        (
            "size not a number",
            pull_delivery(attributes, resource | {"size": "12 kB"}),
            "size",
        ),
        ("size in superscript digits", pull_delivery(attributes, resource | {"size": "²"}), "size"),
        ("size NaN", Delivery("gcs", b'{"size": NaN}', attributes=attributes), "non-finite"),
        (
            "integer too long",
            Delivery("gcs", b'{"size": ' + b"9" * 5000 + b"}", attributes=attributes),
            "JSON",
        ),
        (
            "lone surrogate in objectId",
            pull_delivery(attributes | {"objectId": "a\ud800"}, None),
            "Unicode",
        ),
        (
            "lone surrogate in payload",
            Delivery("gcs", b'{"name": "\\udc00"}', attributes=attributes),
            "Unicode",
        ),
    ]
    return cases


MALFORMED = _malformed_cases()


@pytest.mark.parametrize(
    ("delivery", "message"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED]
)
def test_malformed_deliveries_raise_malformed_delivery_with_a_clear_message(
    delivery: Delivery, message: str
) -> None:
    assert_malformed(SOURCE, delivery, message)


# --- properties ---------------------------------------------------------------------------

ATTRIBUTE_NAMES = [
    "eventType",
    "bucketId",
    "objectId",
    "objectGeneration",
    "eventTime",
    "payloadFormat",
    "overwroteGeneration",
    "overwrittenByGeneration",
    "notificationConfig",
]
EVENT_TYPES = [
    "OBJECT_FINALIZE",
    "OBJECT_ARCHIVE",
    "OBJECT_DELETE",
    "OBJECT_METADATA_UPDATE",
    "OBJECT_INITIALIZE",
]

json_values = json_strategy(max_text=20, max_key=10, max_leaves=20)
plausible_text = st.one_of(
    st.text(max_size=20),
    st.sampled_from([*EVENT_TYPES, "", "123", "2021-01-15T01:30:15.01Z", "0", "-1", "NONE"]),
    st.integers(min_value=0, max_value=2**70).map(str),
    st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()),
)
attributes_strategy = st.dictionaries(
    st.sampled_from(ATTRIBUTE_NAMES) | st.text(max_size=8), plausible_text, max_size=9
)
resource_strategy = st.dictionaries(
    st.sampled_from(
        ["name", "bucket", "generation", "metageneration", "size", "etag", "updated", "timeDeleted"]
    )
    | st.text(max_size=8),
    json_values | plausible_text,
    max_size=8,
)

# Near-valid messages: the right field names with mostly plausible values, so that the
# properties also run through the mapping code and not only the early rejections.
timestamps = st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat())
generations = st.integers(min_value=0, max_value=2**63).map(str)
near_valid_attributes = st.fixed_dictionaries(
    {
        "eventType": st.sampled_from(EVENT_TYPES) | st.text(max_size=5),
        "bucketId": st.sampled_from(["b", "bucket-1"]) | st.text(max_size=10),
        "objectId": st.text(min_size=1, max_size=20) | st.text(max_size=2),
        "objectGeneration": generations | st.text(max_size=5),
    },
    optional={
        "eventTime": timestamps | st.text(max_size=10),
        "overwroteGeneration": generations,
        "overwrittenByGeneration": generations,
        "payloadFormat": st.sampled_from(["JSON_API_V1", "NONE"]),
    },
)
near_valid_resource = st.fixed_dictionaries(
    {},
    optional={
        "name": st.text(min_size=1, max_size=20) | json_values,
        "bucket": st.sampled_from(["b", "bucket-1"]) | json_values,
        "generation": generations | st.integers() | json_values,
        "metageneration": st.integers(min_value=1, max_value=9).map(str),
        "size": st.integers(min_value=0).map(str) | st.integers() | json_values,
        "etag": st.text(max_size=12) | json_values,
        "updated": timestamps | json_values,
        "timeDeleted": timestamps | json_values,
    },
)


PROPERTY_SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@PROPERTY_SETTINGS
@given(body=st.binary(max_size=200), attributes=attributes_strategy)
def test_arbitrary_bytes_and_attributes(body: bytes, attributes: dict[str, str]) -> None:
    assert_only_malformed_and_deterministic(SOURCE, Delivery("gcs", body, attributes=attributes))


@PROPERTY_SETTINGS
@given(document=json_values, attributes=attributes_strategy)
def test_arbitrary_json_bodies(document: Any, attributes: dict[str, str]) -> None:
    assert_only_malformed_and_deterministic(
        SOURCE, Delivery("gcs", json.dumps(document).encode(), attributes=attributes)
    )


@PROPERTY_SETTINGS
@given(
    resource=resource_strategy,
    attributes=attributes_strategy,
    inner=st.one_of(attributes_strategy, json_values),
    data_kind=st.sampled_from(["resource", "bytes", "value", "json", "none"]),
    garbage_bytes=st.binary(max_size=30),
    garbage_value=json_values,
)
def test_push_envelopes_with_arbitrary_contents(
    resource: dict[str, Any],
    attributes: dict[str, str],
    inner: Any,
    data_kind: str,
    garbage_bytes: bytes,
    garbage_value: Any,
) -> None:
    message: dict[str, Any] = {"attributes": inner, "messageId": "1"}
    if data_kind == "resource":
        message["data"] = base64.b64encode(json.dumps(resource).encode()).decode()
    elif data_kind == "bytes":
        message["data"] = base64.b64encode(garbage_bytes).decode()
    elif data_kind == "value":
        message["data"] = garbage_value
    elif data_kind == "json":
        message["data"] = base64.b64encode(json.dumps(garbage_value).encode()).decode()
    envelope = {"message": message, "subscription": "projects/p/subscriptions/s"}
    assert_only_malformed_and_deterministic(
        SOURCE, Delivery("gcs", json.dumps(envelope).encode(), attributes=attributes)
    )


@PROPERTY_SETTINGS
@given(
    resource=st.one_of(resource_strategy, near_valid_resource),
    attributes=st.one_of(attributes_strategy, near_valid_attributes),
)
def test_pull_deliveries_with_plausible_fields(
    resource: dict[str, Any], attributes: dict[str, str]
) -> None:
    delivery = Delivery("gcs", json.dumps(resource).encode(), attributes=attributes)
    result = assert_only_malformed_and_deterministic(SOURCE, delivery)
    if result != "malformed":
        # Wrapping the same message in a push envelope gives the same ids.
        message = {"data": base64.b64encode(delivery.body).decode(), "attributes": attributes}
        assert outcome(SOURCE, push_delivery({"message": message})) == result


def test_property_strategies_reach_the_mapping_code() -> None:
    """Guard for the properties above: their examples must not all stop at validation."""
    deliveries = st.builds(pull_delivery, near_valid_attributes, near_valid_resource)
    assert outcome_kinds(SOURCE, deliveries, examples=200) == {"malformed", "events", "none"}
