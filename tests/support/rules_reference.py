"""The instance rules read from the configuration on every call: what routing did before
`InstanceRules` (streams.policies builds them once per start). Tests hold the policy, the
indexed router and tenant isolation to it, so that they are checked against a reading that
shares none of the code under test."""

from __future__ import annotations

from streams.config import InstanceConfig
from streams.core.event import FileEvent
from streams.core.rules import (
    ALWAYS_ACCEPTED_SOURCES,
    DROPPING_PLUGINS,
    SIZE_CHANGING_PLUGINS,
    Filtered,
    accepts_source,
    escapes_root,
    under_prefix,
)


def apply_instance(event: FileEvent, instance: InstanceConfig) -> FileEvent | Filtered:
    """The event as `instance` sees it, or why the instance drops it."""
    if instance.sources is not None and not accepts_source(instance, event.provider):
        return Filtered("source")
    if event.provider in ALWAYS_ACCEPTED_SOURCES and event.raw is not None:
        named = event.raw.get("instance")  # routing offers it to that instance only, too
        if isinstance(named, str) and named != instance.name:
            return Filtered("instance")
    if instance.bucket is not None and event.bucket is not None and event.bucket != instance.bucket:
        return Filtered("bucket")
    key = under_prefix(event.key, instance.prefix)
    if key is None:
        return Filtered("prefix")
    if instance.prefix and escapes_root(key):
        return Filtered("prefix-escape")
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
