"""The canonical file event: the one shape every provider's notification becomes.

The field meanings are the product's contract (README, "Output records"; per provider:
docs/PROVIDERS.md).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, WithJsonSchema, field_serializer, field_validator

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
