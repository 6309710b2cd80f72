"""The canonical file event: the one shape every provider's notification becomes.

The field meanings are the product's contract (see DESIGN.md, "The canonical event").
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_serializer, field_validator

EventType = Literal["created", "deleted"]


class FileEvent(BaseModel):
    """One change to one object, as downstream consumers see it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    """Same every time a given change is delivered, however it arrives."""
    type: EventType
    key: str
    """Caller-facing key: decoded, instance prefix stripped."""
    bucket: str | None = None
    size: int | None = None
    etag: str | None = None
    version_id: str | None = None
    time: datetime | None = None
    """The provider's event time, UTC."""
    sequencer: str | None = None
    """The provider's per-key ordering token, verbatim (see streams.ordering)."""
    provider: str
    version_only: bool | None = None
    """On `deleted`: True when only a noncurrent version went (the key still exists),
    False when the live object is gone, None when the provider does not tell."""
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

    @field_serializer("time")
    def _rfc3339(self, value: datetime | None) -> str | None:
        return format_time(value) if value is not None else None

    def summary(self) -> dict[str, Any]:
        """The event without `raw`, as the CLI prints it."""
        return self.model_dump(mode="json", exclude={"raw"})


def format_time(value: datetime) -> str:
    """RFC 3339 in UTC with a `Z`, microseconds only when present."""
    value = value.astimezone(UTC)
    spec = "microseconds" if value.microsecond else "seconds"
    return value.isoformat(timespec=spec).replace("+00:00", "Z")
