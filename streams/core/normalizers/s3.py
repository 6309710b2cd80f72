"""Amazon S3 event notifications (via SQS, SNS or Lambda) -> canonical events.

Format
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/notification-content-structure.html
    (mirror `awsdocs/amazon-s3-userguide:doc_source/notification-content-structure.md`),
    event kinds: `doc_source/notification-how-to-event-types-and-destinations.md`, lifecycle:
    `doc_source/lifecycle-configure-notification.md`; SDK test data
    `aws/aws-lambda-go:events/testdata/s3-event.json`,
    `aws-powertools/powertools-lambda-python:tests/events/s3Event.json`.

Accepted bodies (nested at most three deep, so every wrapper of one change gives one id)
    * the S3 JSON `{"Records": [...]}` (S3 -> SQS, or SNS raw delivery);
    * an SNS envelope `{"Type": "Notification", "Message": "<S3 JSON>"}` (SNS -> SQS/HTTP);
      other SNS types (subscription confirmations) are MalformedDelivery: the bridge owns them;
    * Lambda events whose records wrap one: `Records[].Sns.Message` (SNS) or
      `Records[].body` with `eventSource` `aws:sqs` (SQS).

SNS envelopes: only what was signed is read (issue 13), and an envelope naming a field twice
(in any of its objects) is MalformedDelivery, as the bridge refuses it (issue 23). SNS signs
`Message`, `MessageId`, `Subject`, `Timestamp`, `TopicArn` and `Type` of a Notification
(https://docs.aws.amazon.com/sns/latest/dg/sns-verify-signature-of-message.html); the payload
of an envelope is its `Message` and nothing else. A body is an envelope when it carries any
SNS field (`Type`, `Message`, `MessageId`, `TopicArn`, `Signature`, ...), and that is decided
before `Records` is looked at: an envelope carrying a field SNS does not send
(`SNS_NOTIFICATION_FIELDS`, from
https://docs.aws.amazon.com/sns/latest/dg/http-notification-json.html plus the
`MessageAttributes` SNS adds when the publisher set some), such as `Records` or `Event`, is
MalformedDelivery: someone added unsigned content to a signed message. The same holds for a
Lambda record's `Sns` object (Lambda's spelling `SigningCertUrl`/`UnsubscribeUrl`), for a
Lambda SNS record carrying anything beside `EventSource`, `EventVersion`,
`EventSubscriptionArn` and `Sns`, and for a `Records` array that mixes wrapped messages
(SNS or SQS) with bare S3 records, which no AWS service sends. (FIFO topics add
`SequenceNumber`; S3 cannot publish to FIFO topics, so it is not accepted.)

Kinds (record `eventName`; an `s3:` prefix, as in some SDK test data and S3-compatible
servers, is tolerated)
    * created: `ObjectCreated:*` (Put, Post, Copy, CompleteMultipartUpload, future ones);
    * deleted: `ObjectRemoved:Delete`, `ObjectRemoved:DeleteMarkerCreated`,
      `LifecycleExpiration:Delete`, `LifecycleExpiration:DeleteMarkerCreated`;
    * dropped on purpose (no content change): restore, replication, tagging, ACL, lifecycle
      transition, Intelligent-Tiering, `ReducedRedundancyLostObject`, unknown kinds;
    * `s3:TestEvent` (sent when a configuration is saved): no events (§11 #19: dropped and
      counted by the stream, not dead-lettered; lifecycle expirations are deletions).

Id: S3 has no event id. `derived_id(provider, eventName, bucket, key, sequencer)`: duplicates
share the sequencer. Without one: `derived_id(provider, eventName, bucket, key, versionId,
eventTime, eTag)`; with none of those either: `record_hash_id(provider, record)`. Transport
ids (SQS/SNS MessageId, x-amz-request-id) are never used. `key` in the id is the decoded key.

Key: form-encoded (`red+flower.jpg`): `+` is a space, then %XX is UTF-8 (`form_decode`).

Fields: `version_only` is True for `*:Delete` carrying a versionId (one version went; the key
may live on), False for unversioned deletes and delete markers. `versionId` `"null"` stays
`"null"` (§11 #16) and counts as a version. Go zero values (`""`, seen in SDK-marshalled
samples) count as absent. One pair of quotes is stripped from eTags (§11 #15); size/eTag on
deletes are passed through as given (S3 sends none, §11 #14). `time` is `eventTime` in UTC.

The record parsing here is shared by `minio` (same record shape, its own kinds); the value
helpers (`present`, `strip_quotes`, `optional_int`, `parse_time`, `load_json`) are `base`'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Any, Literal

from streams.core.delivery import Delivery
from streams.core.event import FileEvent
from streams.core.normalizers.base import (
    MalformedDelivery,
    derived_id,
    load_json,
    optional_int,
    optional_str,
    parse_time,
    present,
    record_hash_id,
    require_dict,
    require_str,
    strip_quotes,
)
from streams.core.normalizers.keys import form_decode

SOURCE = "s3"

Kind = Literal["created", "deleted", "version_delete"]
"""created; deleted (the live object is gone); version_delete (one version went, if the
record names one, else the live object is gone)."""

Classify = Callable[[str], Kind | None]

_MAX_NESTING = 3
_DELETE_MARKERS = {"ObjectRemoved:DeleteMarkerCreated", "LifecycleExpiration:DeleteMarkerCreated"}
_VERSION_DELETES = {"ObjectRemoved:Delete", "LifecycleExpiration:Delete"}
_EVENT_SOURCES = frozenset({"aws:s3"})

SNS_NOTIFICATION = "Notification"
SNS_NOTIFICATION_FIELDS = frozenset(
    {
        "Type",
        "MessageId",
        "TopicArn",
        "Subject",
        "Message",
        "Timestamp",
        "SignatureVersion",
        "Signature",
        "SigningCertURL",
        "UnsubscribeURL",
        "MessageAttributes",
    }
)
"""Every top-level field of an SNS Notification as SNS delivers it over HTTP(S) or to SQS."""
SNS_CONFIRMATION_FIELDS = frozenset(
    {
        "Type",
        "MessageId",
        "Token",
        "TopicArn",
        "Message",
        "SubscribeURL",
        "Timestamp",
        "SignatureVersion",
        "Signature",
        "SigningCertURL",
    }
)
"""Every field of a SubscriptionConfirmation / UnsubscribeConfirmation (http-subscription-
confirmation-json.html, http-unsubscribe-confirmation-json.html)."""
SNS_MARKERS = SNS_NOTIFICATION_FIELDS | SNS_CONFIRMATION_FIELDS
"""A body with any of these at its top level is an SNS message, whatever else it carries."""
_LAMBDA_SNS_FIELDS = SNS_NOTIFICATION_FIELDS | {"SigningCertUrl", "UnsubscribeUrl"}
_LAMBDA_SNS_RECORD_FIELDS = frozenset(
    {"EventSource", "EventVersion", "EventSubscriptionArn", "Sns"}
)


def normalize(delivery: Delivery) -> list[FileEvent]:
    """Every created/deleted event in one S3 notification delivery, in record order."""
    return _events(load_json(delivery.body), 0, delivery.body)


def classify(event_name: str) -> Kind | None:
    """AWS's kind for a record `eventName`; None drops it."""
    name = event_name.removeprefix("s3:")
    if name.startswith("ObjectCreated:"):
        return "created"
    if name in _VERSION_DELETES:
        return "version_delete"
    if name in _DELETE_MARKERS:
        return "deleted"
    return None


def _events(body: Any, depth: int, text: bytes | str) -> list[FileEvent]:
    """The events of `body`, parsed from `text` (read again only for an SNS envelope)."""
    if not isinstance(body, dict):
        raise MalformedDelivery("S3 notification is not a JSON object")
    if not body.keys().isdisjoint(SNS_MARKERS):
        # Before Records: an envelope's payload is its signed Message, never a field beside it.
        refuse_repeated_names(text, body, "SNS")
        message = sns_payload(body, SNS_NOTIFICATION_FIELDS, "SNS", "SNS Message")
        return _events(_nested(message, "SNS Message", depth), depth + 1, message)
    if "Records" not in body:
        if body.get("Event") == "s3:TestEvent":
            return []  # sent once when a notification configuration is saved
        raise MalformedDelivery("S3 notification has no Records (and is no SNS envelope)")
    records = body["Records"]
    if not isinstance(records, list):
        raise MalformedDelivery("Records is not a JSON array")
    events: list[FileEvent] = []
    wrapped: bool | None = None
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise MalformedDelivery(f"{_record_name(index)} is not a JSON object")
        inner = _wrapped_message(record, index)
        if wrapped is not None and wrapped != (inner is not None):
            raise MalformedDelivery(
                f"{_record_name(index)}: Records mixes wrapped messages (Lambda SNS/SQS records) "
                "with bare S3 records"
            )
        wrapped = inner is not None
        if inner is None:
            events.extend(record_events(record, index, SOURCE, classify, _EVENT_SOURCES))
        else:
            events.extend(_events(_nested(inner, _record_name(index), depth), depth + 1, inner))
    return events


class _RepeatedName(ValueError):
    """A JSON object names one field twice."""


def _unique_names(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise _RepeatedName
    return result


def refuse_repeated_names(text: bytes | str, parsed: Any, what: str) -> None:
    """MalformedDelivery when an object of the envelope `text` (`parsed` is load_json's
    reading of it) names a field twice, the bridge's rule (connectors.webhook_auth.s3): the
    signature covers one reading of the message, and a parser that keeps the other
    (`Message` given twice: the first signed, the last read here) must never decide what it
    says.

    Without a second parse: every name of every object in the text is a JSON string followed
    by `:`, so the text names as many fields as the reading holds (the members of all its
    objects, `_members`) exactly when no object names one twice. `_names_in_text` counts
    those names with a few byte counts; only a text where it cannot (one holding an escaped
    backslash, or not in UTF-8: UTF-16/32 or a BOM, which load_json reads too), or where the
    two counts differ, is read again by `json` with every object's pairs, which decides as
    before."""
    names = _names_in_text(text)
    if names is not None and names == _members(parsed):
        return
    try:
        json.loads(text, object_pairs_hook=_unique_names)
    except _RepeatedName:
        raise MalformedDelivery(f"{what} message names a field twice") from None
    except (ValueError, RecursionError):
        return  # load_json read it: its own reading stands, and refused what it refuses


_BOM = b"\xef\xbb\xbf"
_WHITESPACE = b" \t\n\r"


def _names_in_text(text: bytes | str) -> int | None:
    """How many object member names the JSON `text` spells (repeats counted), or None when
    this count cannot tell (see refuse_repeated_names).

    A name ends with a closing quote, JSON whitespace and `:`; with the whitespace deleted,
    `":`. Inside a string a quote is escaped, `\\"`: so without an escaped backslash
    (`\\\\`, after which a quote closes the string) in the text, the names are the `":`
    not preceded by a backslash. Deleting whitespace inside a string (a space) only joins
    an escaped quote to what follows, which the subtraction discounts."""
    raw = text.encode("utf-8") if isinstance(text, str) else text
    if b"\\\\" in raw or b"\x00" in raw or raw.startswith(_BOM):
        return None
    compact = raw.translate(None, _WHITESPACE)
    return compact.count(b'":') - compact.count(b'\\":')


def _members(value: Any) -> int:
    """How many members the objects of a parsed JSON value hold, at any depth."""
    count = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is dict:
            count += len(item)
            stack.extend(inner for inner in item.values() if type(inner) in _CONTAINERS)
        elif type(item) is list:
            stack.extend(inner for inner in item if type(inner) in _CONTAINERS)
    return count


_CONTAINERS = (dict, list)


def sns_payload(
    envelope: dict[str, Any], fields: AbstractSet[str], what: str, message_name: str
) -> str:
    """The `Message` of an SNS Notification that carries nothing SNS does not send."""
    kind = envelope.get("Type")
    if kind != SNS_NOTIFICATION:
        text = repr(kind)
        shown = text if len(text) <= 64 else text[:64] + "..."
        raise MalformedDelivery(f"{what} message of Type {shown} is not a notification")
    extra = sorted(name for name in envelope if name not in fields)
    if extra:
        shown = ", ".join(repr(name[:64]) for name in extra[:5])
        raise MalformedDelivery(
            f"{what} envelope carries fields SNS does not send (unsigned): {shown}"
        )
    return require_str(envelope.get("Message"), message_name)


def _wrapped_message(record: dict[str, Any], index: int) -> str | None:
    """The S3 JSON a Lambda SNS/SQS record carries, or None for a plain S3 record."""
    if "Sns" in record:
        what = _record_name(index)
        extra = sorted(name for name in record if name not in _LAMBDA_SNS_RECORD_FIELDS)
        if extra:
            shown = ", ".join(repr(name[:64]) for name in extra[:5])
            raise MalformedDelivery(f"{what} wraps an SNS message and also carries {shown}")
        sns = require_dict(record["Sns"], f"{what}.Sns")
        if "Type" not in sns:  # Lambda always sends it; tolerate its absence as before
            sns = {**sns, "Type": SNS_NOTIFICATION}
        return sns_payload(sns, _LAMBDA_SNS_FIELDS, f"{what}.Sns", f"{what}.Sns.Message")
    if record.get("eventSource") == "aws:sqs":
        return require_str(record.get("body"), f"{_record_name(index)}.body")
    return None


def _nested(text: str, what: str, depth: int) -> Any:
    if depth >= _MAX_NESTING:
        raise MalformedDelivery(f"{what}: more than {_MAX_NESTING} nested envelopes")
    return load_json(text, what)


def record_events(
    record: Any,
    index: int,
    provider: str,
    kind_of: Classify,
    event_sources: AbstractSet[str],
    placeholder_versions: frozenset[str] = frozenset(),
) -> list[FileEvent]:
    """The event (zero or one) for `Records[index]`, an S3-shaped record.

    `placeholder_versions` are versionId values that name no version (MinIO's legacy "1").
    """
    # The hot path of S3 and MinIO: each field is checked in line, and only a field that
    # fails goes to its base helper (require_dict, require_str, present, ...), which refuses
    # it in its own words; the record's name is only spelt out for that. A helper call for
    # every field, or the name for every record, cost more than the checks themselves.
    if not isinstance(record, dict):
        require_dict(record, _record_name(index))
    source = record.get("eventSource")
    if source is not None and (not isinstance(source, str) or source not in event_sources):
        what = _record_name(index)
        optional_str(source, f"{what}.eventSource")
        # Another provider's record: this delivery was routed to the wrong source.
        raise MalformedDelivery(
            f"{what}.eventSource {source!r} is not one of {sorted(event_sources)}"
        )
    name = record.get("eventName")
    if not isinstance(name, str) or not name:
        require_str(name, f"{_record_name(index)}.eventName")
    kind = kind_of(name)
    if kind is None:
        return []  # dropped before reading the object: bucket/metadata events lack one
    s3 = record.get("s3")
    if not isinstance(s3, dict):
        require_dict(s3, f"{_record_name(index)}.s3")
    bucket_info = s3.get("bucket")
    if not isinstance(bucket_info, dict):
        require_dict(bucket_info, f"{_record_name(index)}.s3.bucket")
    bucket = bucket_info.get("name")
    if not isinstance(bucket, str) or not bucket:
        require_str(bucket, f"{_record_name(index)}.s3.bucket.name")
    obj = s3.get("object")
    if not isinstance(obj, dict):
        require_dict(obj, f"{_record_name(index)}.s3.object")
    key = obj.get("key")
    if not isinstance(key, str) or not key:
        require_str(key, f"{_record_name(index)}.s3.object.key")
    key = form_decode(key)
    # Optional strings: "" (a Go zero value) counts as absent, and `present` refuses
    # anything else that is not a string.
    sequencer = obj.get("sequencer")
    if sequencer is not None and not isinstance(sequencer, str):
        present(sequencer, f"{_record_name(index)}.s3.object.sequencer")
    version = obj.get("versionId")
    if version is not None and not isinstance(version, str):
        present(version, f"{_record_name(index)}.s3.object.versionId")
    event_time = record.get("eventTime")
    if event_time is not None and not isinstance(event_time, str):
        present(event_time, f"{_record_name(index)}.eventTime")
    raw_etag = obj.get("eTag")
    if raw_etag is not None and not isinstance(raw_etag, str):
        present(raw_etag, f"{_record_name(index)}.s3.object.eTag")
    sequencer, event_time, raw_etag = sequencer or None, event_time or None, raw_etag or None
    if not version or version in placeholder_versions:
        version = None
    if sequencer is not None:
        event_id = derived_id(provider, name, bucket, key, sequencer)
    elif version is not None or event_time is not None or raw_etag is not None:
        event_id = derived_id(provider, name, bucket, key, version, event_time, raw_etag)
    else:
        event_id = record_hash_id(provider, record)
    size = obj.get("size")
    if size is not None and type(size) is not int:  # not a bool, a float, a string
        size = optional_int(size, f"{_record_name(index)}.s3.object.size")
    try:
        time = parse_time(event_time)
    except MalformedDelivery:
        parse_time(event_time, f"{_record_name(index)}.eventTime")  # refuses, naming it
        raise
    version_only = None if kind == "created" else kind == "version_delete" and version is not None
    # Every value below is already of its field's exact type, the time in UTC, and the
    # record is this event's own: FileEvent's validation would only repeat the checks.
    return [
        FileEvent.from_checked(
            id=event_id,
            type="created" if kind == "created" else "deleted",
            key=key,
            bucket=bucket,
            size=size,
            etag=strip_quotes(raw_etag),
            version_id=version,
            time=time,
            sequencer=sequencer,
            provider=provider,
            version_only=version_only,
            raw=record,
        )
    ]


def _record_name(index: int) -> str:
    return f"Records[{index}]"
