"""Provider normalizers, one module per source, looked up by source name.

Each module `streams.normalizers.<name>` defines `SOURCE` (its name) and
`normalize(delivery) -> list[FileEvent]`. Adding a provider means adding one module, one
line in `SOURCES`, and its tests.
"""

from __future__ import annotations

import importlib
from functools import cache

from streams.delivery import Delivery
from streams.event import FileEvent
from streams.normalizers.base import MalformedDelivery, Normalizer

SOURCES: tuple[str, ...] = (
    "s3",
    "eventbridge",
    "gcs",
    "azure",
    "minio",
    "supabase",
    "b2",
    "box",
    "cloudinary",
    "appwrite",
    "reconcile",  # synthetic deliveries of `python -m connectors reconcile`
)


class UnknownSource(MalformedDelivery):
    """The delivery names a source no normalizer is registered for."""


@cache
def normalizer_for(source: str) -> Normalizer:
    """The normalizer registered for `source`; UnknownSource if there is none."""
    if source not in SOURCES:
        raise UnknownSource(f"unknown source {source!r} (known: {', '.join(SOURCES)})")
    module = importlib.import_module(f"{__name__}.{source}")
    normalize: Normalizer = module.normalize
    return normalize


def normalize(delivery: Delivery) -> list[FileEvent]:
    """Every canonical event in one delivery, with full provider keys (no instance rules)."""
    return normalizer_for(delivery.source)(delivery)


__all__ = ["SOURCES", "MalformedDelivery", "UnknownSource", "normalize", "normalizer_for"]
