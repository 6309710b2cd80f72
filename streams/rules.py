"""The per-instance rules: which events an instance keeps, and how their keys look to it.

Pure functions. A kept event comes back with its key relative to the instance prefix; a
dropped one comes back as a `Filtered` with the reason (every drop is counted upstream).

* Buckets: an instance keeps its own bucket, or every bucket (no bucket, or `"*"`);
  deliveries that name no bucket always pass.
* Prefix: matched on a path boundary (`users` never matches `users-archive/x`), then stripped.
* Plugins translate what the instance's writer stores:
  `versioning` (`.versions`) and `softDelete` (`.trash`): their internal prefixes dropped;
  `dedup` (`.dedup`): its blob store dropped, and size/etag cleared on empty or unsized
  objects, which may be its pointers; `encryption`, `compression`: size cleared on every
  event (the stored size is not the caller's size).
"""

from __future__ import annotations

from dataclasses import dataclass

from streams.config import InstanceConfig
from streams.event import FileEvent

DROPPING_PLUGINS = ("dedup", "versioning", "softDelete")
SIZE_CHANGING_PLUGINS = ("encryption", "compression")


@dataclass(frozen=True, slots=True)
class Filtered:
    """Why an instance does not keep an event: `bucket`, `prefix` or `plugin:<name>`."""

    reason: str


def under_prefix(key: str, prefix: str) -> str | None:
    """The key relative to `prefix` if it lies under it on a path boundary, else None."""
    if not prefix:
        return key
    head = prefix + "/"
    if not key.startswith(head) or len(key) == len(head):
        return None
    return key[len(head) :]


def apply_instance(event: FileEvent, instance: InstanceConfig) -> FileEvent | Filtered:
    """The event as `instance` sees it, or why the instance drops it."""
    if instance.bucket is not None and event.bucket is not None and event.bucket != instance.bucket:
        return Filtered("bucket")
    key = under_prefix(event.key, instance.prefix)
    if key is None:
        return Filtered("prefix")
    changes: dict[str, object] = {"key": key} if key != event.key else {}
    if instance.plugins:
        for name in DROPPING_PLUGINS:
            plugin = instance.plugin(name)
            # The plugin's prefix itself, its folder marker (`.versions/`) and everything below.
            if (
                plugin is not None
                and plugin.prefix
                and (key == plugin.prefix or key.startswith(plugin.prefix + "/"))
            ):
                return Filtered(f"plugin:{name}")
        if instance.plugin("dedup") is not None and not event.size:
            changes.update(size=None, etag=None)
        if any(instance.plugin(name) is not None for name in SIZE_CHANGING_PLUGINS):
            changes["size"] = None
    # Most instances change nothing: the event itself (frozen) serves, without a copy.
    return event.model_copy(update=changes) if changes else event
