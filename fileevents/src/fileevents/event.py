"""The canonical file event: the contract between the stream that writes an instance's topic
and every consumer that reads it.

`FileEvent` is the one shape every provider's notification becomes; `scope` is the namespace
its id and ordering token belong to (what the stream dedupes and orders in, and what a
consumer's dedupe ids are scoped by); `format_time` is how its time is written; `printable`
is how a value from a record is put into a log line. The stream imports these from here
(`streams.core.event` re-exports them), so writer and readers cannot disagree. Pure: no I/O,
nothing of Kafka. The field meanings are documented in the storage-events README ("Output
records") and per provider in its docs/PROVIDERS.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, WithJsonSchema, field_serializer, field_validator

UTC = timezone.utc
"""`datetime.UTC` (Python 3.11+), spelled so that 3.10 has it too."""

EventType = Literal["created", "deleted"]
Rfc3339 = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]
"""What `time` is written as (format_time), for the JSON Schema of the written event."""


class FileEvent(BaseModel):
    """One change to one object, as downstream consumers see it."""

    # The attribute docstrings below are also the descriptions of the published JSON Schema
    # (streams.core.schema, schemas/file-event/): write them for consumers in any language.
    # Every output carries every field, so the schema of what is written requires them all.
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        use_attribute_docstrings=True,
        json_schema_serialization_defaults_required=True,
    )

    id: str
    """Same every time a given change is delivered, however it arrives: deduplicate on it."""
    type: EventType
    """`created` (new content under the key) or `deleted` (see version_only)."""
    key: str
    """The object key to pass to a download call: decoded where the provider encodes it,
    the instance prefix stripped."""
    bucket: str | None = None
    """The bucket or container; null for providers without one (Box, Cloudinary)."""
    size: int | None = None
    """The object's size in bytes, as the provider gives it; null when it does not."""
    etag: str | None = None
    """The provider's entity tag, one pair of quotes stripped; null when it gives none."""
    version_id: str | None = None
    """The provider's identifier of the stored version (S3 version id, GCS generation, Azure
    versionId, B2 file id, Cloudinary version_id, ...); null when the provider names none."""
    time: datetime | None = None
    """The provider's event time, RFC 3339 in UTC (`Z`); null when the provider gives none."""
    sequencer: str | None = None
    """The provider's per-key ordering token, verbatim (S3/MinIO sequencer, Azure sequencer,
    ...); null when it has none. Compare tokens only between events of one key and provider."""
    provider: str
    """Which source the change came from: s3, eventbridge, gcs, azure, minio, supabase, b2,
    box, cloudinary, appwrite, reconcile."""
    version_only: bool | None = None
    """On `deleted`: true when only a noncurrent version went (the key still exists), false
    when the live object is gone, null when the provider does not tell. Null on `created`."""
    raw: dict[str, Any] | None = None
    """The provider's own record, for the fields only it has."""

    @field_validator("time")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("event time must carry a timezone")
        return value.astimezone(UTC)

    @field_serializer("time", return_type=Rfc3339 | None)
    def _rfc3339(self, value: datetime | None) -> str | None:
        return format_time(value) if value is not None else None

    def summary(self) -> dict[str, Any]:
        """The event without `raw`, as the CLI prints it."""
        return self.model_dump(mode="json", exclude={"raw"})

    @classmethod
    def from_checked(
        cls,
        *,
        id: str,
        type: EventType,
        key: str,
        bucket: str | None,
        size: int | None,
        etag: str | None,
        version_id: str | None,
        time: datetime | None,
        sequencer: str | None,
        provider: str,
        version_only: bool | None,
        raw: dict[str, Any] | None,
    ) -> FileEvent:
        """The event `FileEvent(...)` would build from these values, without validating them:
        for the normalizers' hot path, where validation costs more than all the rest of an
        S3 record's reading.

        The caller vouches for what validation would otherwise check or convert: every value
        exactly of its field's type (`str`, not a subclass; `int`, not a `bool`), `type` one
        of EventType, `time` aware and in UTC (tzinfo `datetime.UTC`), and `raw` a dict with
        `str` keys that no other event holds (validation would have copied it). Every field
        is given, so the fields set are all of them, as for `FileEvent(**all_fields)`.
        tests/normalizers hold every normalizer that uses this to `FileEvent(...)`'s result.
        """
        event = _new(cls)
        # What `model_construct` stores in pydantic's four instance slots, without its
        # per-field loop over aliases and defaults, which costs more than validating.
        _set_dict(
            event,
            {
                "id": id,
                "type": type,
                "key": key,
                "bucket": bucket,
                "size": size,
                "etag": etag,
                "version_id": version_id,
                "time": time,
                "sequencer": sequencer,
                "provider": provider,
                "version_only": version_only,
                "raw": raw,
            },
        )
        _set_fields_set(event, set(_FIELD_NAMES))
        _set_extra(event, None)  # extra="forbid": there is none
        _set_private(event, None)  # no private attributes
        return event


# FileEvent is frozen (its own __setattr__ refuses), so from_checked fills the slots the way
# pydantic does: object's own __new__ and the slots' descriptors.
_new = object.__new__
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__
_FIELD_NAMES = frozenset(FileEvent.model_fields)


def format_time(value: datetime) -> str:
    """RFC 3339 in UTC with a `Z`, microseconds only when present."""
    value = value.astimezone(UTC)
    spec = "microseconds" if value.microsecond else "seconds"
    return value.isoformat(timespec=spec).replace("+00:00", "Z")


AWS_PARTITIONS = (
    ("cn-", "aws-cn"),
    ("us-gov-", "aws-us-gov"),
    ("us-isob-", "aws-iso-b"),
    ("us-isof-", "aws-iso-f"),
    ("us-iso-", "aws-iso"),
    ("eu-isoe-", "aws-iso-e"),
    ("eusc-", "aws-eusc"),
)
"""Region prefix -> partition (botocore's `partitions.json` regionRegex); others are `aws`."""
_AWS_PARTITION_HEADS = tuple(head for head, _ in AWS_PARTITIONS)
"""The prefixes alone: one `startswith` tells a region of the `aws` partition (most) from
the others, where looking each prefix up cost ~0.5 µs per call, twice per event."""
AWS_REGION_FIELD = {"s3": "awsRegion", "eventbridge": "region"}
"""The field of an AWS provider's raw record that names its region."""
STORAGE_ACCOUNT = re.compile(
    r"/providers/Microsoft\.Storage/storageAccounts/([A-Za-z0-9]{3,24})(?:/|$)", re.IGNORECASE
)
"""An Azure storage account in an Event Grid `topic` or a CloudEvents `source`."""


class Scoped(Protocol):
    """What `scope` reads of an event: a FileEvent, or the stream's own keyed event."""

    @property
    def provider(self) -> str: ...
    @property
    def raw(self) -> Mapping[str, Any] | None: ...


def scope(event: Scoped) -> str:
    """The namespace `event`'s id and ordering token belong to: the provider, narrowed to
    the Azure storage account (`azure@<account>`) and, outside the `aws` partition, the AWS
    partition (`s3@aws-cn`, ...). Ids and tokens of different scopes are different parties'
    and are never compared (the stream's streams.core.ordering says why, case by case)."""
    provider = event.provider
    if provider == "azure":
        raw = event.raw or {}
        origin = raw.get("topic") or raw.get("source")
        if isinstance(origin, str):
            found = STORAGE_ACCOUNT.search(origin)
            if found is not None:
                return f"azure@{found.group(1).lower()}"
        return provider
    region_field = AWS_REGION_FIELD.get(provider)
    if region_field is not None:
        region = (event.raw or {}).get(region_field)
        if isinstance(region, str) and region.startswith(_AWS_PARTITION_HEADS):
            for head, partition in AWS_PARTITIONS:
                if region.startswith(head):
                    return f"{provider}@{partition}"
    return provider


def printable(text: str) -> str:
    """`text` with every character that is not printable escaped as Python writes it: line
    breaks (`\\n`, `\\r`, U+2028, U+0085, ...), tabs, escape codes (`\\x1b`), lone surrogates,
    format characters. Printable text, backslashes and non-ASCII letters included, is kept as
    it is, so a reason or a key reads the same unless it holds such a character; the result
    is one line, whatever `text` is."""
    if text.isprintable():
        return text
    return "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in text
    )
