"""The canonical file event, as the stream writes it: the contract lives in the fileevents
distribution (`fileevents.event`), which every consumer installs; the stream imports it from
there, so what is written and what is read are one model.

The field meanings are the product's contract (README, "Output records"; per provider:
docs/PROVIDERS.md).
"""

from __future__ import annotations

from fileevents.event import EventType, FileEvent, Rfc3339, format_time

__all__ = ["EventType", "FileEvent", "Rfc3339", "format_time"]
