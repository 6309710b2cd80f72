"""What a bridge hands to the stream: the provider's bytes plus what it knew about them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(slots=True)  # not frozen: built per record (streams.core.records)
class Delivery:
    """One notification exactly as a provider delivered it.

    `headers` holds HTTP headers with lower-case names; `attributes` holds Pub/Sub (or queue)
    message attributes with their names as the provider spells them.
    """

    source: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    attributes: Mapping[str, str] = field(default_factory=dict)
