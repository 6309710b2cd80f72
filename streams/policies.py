"""The settings as the functional core takes them: small frozen policy objects, built once per
`Settings` (kept on them: `Settings.derived`), so that streams.core never reads the settings
module and its decisions are tested with a policy alone.

* `emit_policy`: stage two's (streams.core.emitting `EmitPolicy`: per instance its TTL, topics,
  reconciled source and deleted-mark grace; the dead-letter topic, the clock-skew bound);
* `instance_rules`: one instance's filters and key rules (streams.core.rules `InstanceRules`).
"""

from __future__ import annotations

from streams.config import InstanceConfig, Settings
from streams.core.emitting import EmitPolicy, InstancePolicy
from streams.core.rules import DROPPING_PLUGINS, SIZE_CHANGING_PLUGINS, InstanceRules


def emit_policy(settings: Settings) -> EmitPolicy:
    """Stage two's policy of `settings` (use `settings.emit_policy()`, which builds it once)."""
    chosen = settings.stream.deleted_mark_grace_s
    longest = max(instance.dedupe_ttl for instance in settings.instances)
    return EmitPolicy(
        instances={
            instance.name: InstancePolicy(
                name=instance.name,
                dedupe_ttl=instance.dedupe_ttl,
                output_topic=instance.output_topic,
                stale_output_topic=instance.stale_output_topic,
                reconciled_source=instance.reconciled_source,
                deleted_mark_grace=chosen if chosen is not None else instance.dedupe_ttl,
            )
            for instance in settings.instances
        },
        dead_letter_topic=settings.stream.dead_letter_topic,
        max_clock_skew_s=settings.stream.max_clock_skew_s,
        longest_ttl=longest,
        other_grace=chosen if chosen is not None else longest,
    )


def instance_rules(instance: InstanceConfig) -> InstanceRules:
    """The rules of one instance (streams.core.rules `apply_rules`)."""
    return InstanceRules(
        name=instance.name,
        sources=frozenset(instance.sources) if instance.sources is not None else None,
        bucket=instance.bucket,
        prefix=instance.prefix,
        dropped_prefixes=tuple(
            (name, plugin.prefix)
            for name in DROPPING_PLUGINS
            if (plugin := instance.plugin(name)) is not None and plugin.prefix
        ),
        clears_unsized=instance.plugin("dedup") is not None,
        clears_size=any(instance.plugin(name) is not None for name in SIZE_CHANGING_PLUGINS),
    )
