r"""The per-instance rules: which events an instance keeps, and how their keys look to it.

Pure functions. A kept event comes back with its key relative to the instance prefix; a
dropped one comes back as a `Filtered` with the reason (every drop is counted upstream).
The checks, in order, each with its `Filtered` reason:

* `source`: an instance with `sources` keeps only events of those providers (the event's
  `provider`, which is the source the bridge authenticated). Bucket names are chosen by
  whoever writes the delivery, and Box and Cloudinary deliveries name no bucket, so without
  `sources` every authenticated source can write into every instance; with it, a credential of
  another provider cannot. `reconcile` (synthetic deliveries that `python -m connectors
  reconcile` writes to the raw topic directly, with the operator's Kafka credentials rather
  than a bridge's) is always kept: streams.core.routing offers it to the one instance its
  delivery names only, on a raw topic that reaches that instance.
* `bucket`: an instance keeps its own bucket, or every bucket (no bucket, or `"*"`);
  deliveries that name no bucket always pass.
* `prefix`: matched on a path boundary (`users` never matches `users-archive/x`), then
  stripped.
* `prefix-escape`: the key relative to the prefix is handed to consumers, who join it to a
  root of theirs (a download call of a client rooted at the prefix, a local directory). A
  key whose dot segments climb above that root, or come back to the root itself, in any
  reading a consumer or SDK might apply (as is; `\` as a separator; percent-decoded, as often
  as decoding changes it; each of these combined), addresses something outside the prefix:
  `tenant-a/../tenant-b/x`, `tenant-a/..%2Ftenant-b/x`, `tenant-a/%2e%2e/tenant-b/x`,
  `tenant-a/x\..\..\tenant-b\y`, `tenant-a/.`. So does a key that, in any of those
  readings, names a root of its own, which a join with the consumer's root keeps instead of
  it (`os.path.join`, `pathlib`, `ntpath`): it starts with `/` (`tenant-a//etc/cron.d/x` is
  `/etc/cron.d/x` to the instance), or `\` (the current drive's root on Windows, and a UNC
  path `\\server\share`), or names a drive (`C:`, `C:\x`, `c:/x`: an ASCII letter and a
  colon). Such an event is not the instance's: dropped and counted, absolute keys under the
  same reason as dot segments (one escape from the prefix, one alert). Dot segments that stay
  inside (`tenant-a/x/../y`, `tenant-a/./y`), and `/`, `\` or `C:` further in
  (`tenant-a/x//y`, `tenant-a/x/C:y`), are kept verbatim, and so is every key for an
  instance without a prefix: there is no root to climb out of, and the key is a real key of
  the bucket.
* Plugins translate what the instance's writer stores:
  `versioning` (`.versions`) and `softDelete` (`.trash`): their internal prefixes dropped;
  `dedup` (`.dedup`): its blob store dropped, and size/etag cleared on empty or unsized
  objects, which may be its pointers; `encryption`, `compression`: size cleared on every
  event (the stored size is not the caller's size).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import unquote

from streams.core.event import FileEvent

ALWAYS_ACCEPTED_SOURCES = frozenset({"reconcile"})
DROPPING_PLUGINS = ("dedup", "versioning", "softDelete")
SIZE_CHANGING_PLUGINS = ("encryption", "compression")


@dataclass(frozen=True, slots=True)
class InstanceRules:
    """One instance's rules, as `apply_rules` reads them: built once per settings from the
    instance's configuration (streams.policies `instance_rules`)."""

    name: str
    sources: frozenset[str] | None
    """The providers the instance keeps (`reconcile` always), None for every one."""
    bucket: str | None
    prefix: str
    dropped_prefixes: tuple[tuple[str, str], ...] = ()
    """(plugin, its prefix) of the plugins whose internal prefixes are dropped, in the order
    they are checked (dedup, versioning, softDelete)."""
    clears_unsized: bool = False
    """The `dedup` plugin: size and etag cleared on an event without a size."""
    clears_size: bool = False
    """An `encryption` or `compression` plugin: size cleared on every event."""


class Instance(Protocol):
    """What `accepts_source` and `open_instances_warning` read of an instance's
    configuration (streams.config InstanceConfig) when given it rather than its rules."""

    @property
    def name(self) -> str: ...
    @property
    def sources(self) -> Collection[str] | None: ...
    @property
    def bucket(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Filtered:
    """Why an instance does not keep an event: `source`, `instance`, `bucket`, `prefix`,
    `prefix-escape` or `plugin:<name>`."""

    reason: str


def under_prefix(key: str, prefix: str) -> str | None:
    """The key relative to `prefix` if it lies under it on a path boundary, else None."""
    if not prefix:
        return key
    head = prefix + "/"
    if not key.startswith(head) or len(key) == len(head):
        return None
    return key[len(head) :]


def _leaves_root(path: str) -> bool:
    """True when `path`'s dot segments, resolved like a file path, go above its root at some
    point or end on the root itself."""
    depth = 0
    for segment in path.split("/"):
        if segment == "..":
            depth -= 1
            if depth < 0:
                return True
        elif segment and segment != ".":
            depth += 1
    return depth == 0


DRIVE_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


def names_a_root(path: str) -> bool:
    """True when `path` names a root of its own, which a join keeps instead of the root it is
    joined to: it starts with `/` or `\\` (a POSIX root, the current drive's root, a UNC
    path), or with a drive (`C:`)."""
    first = path[:1]
    return first in ("/", "\\") or (path[1:2] == ":" and first in DRIVE_LETTERS)


def escapes_root(relative: str) -> bool:
    """True when a consumer resolving `relative` under its root could leave that root (the
    readings are in the module docstring)."""
    if names_a_root(relative):
        return True
    if "." not in relative and "%" not in relative:
        # No other reading, and no dot segment (the common case): only nothing ends on the
        # root (separators alone start with one).
        return not relative
    reading = relative
    while True:
        if (
            names_a_root(reading)
            or _leaves_root(reading)
            or ("\\" in reading and _leaves_root(reading.replace("\\", "/")))
        ):
            return True
        if "%" not in reading:
            return False
        decoded = unquote(reading)  # every change shortens it, so this ends
        if decoded == reading:
            return False
        reading = decoded


def accepts_source(instance: Instance | InstanceRules, provider: str) -> bool:
    return (
        instance.sources is None
        or provider in instance.sources
        or provider in ALWAYS_ACCEPTED_SOURCES
    )


def apply_rules(event: FileEvent, rules: InstanceRules) -> FileEvent | Filtered:
    """The event as the instance of `rules` sees it, or why the instance drops it."""
    if rules.sources is not None and not accepts_source(rules, event.provider):
        return Filtered("source")
    if event.provider in ALWAYS_ACCEPTED_SOURCES and event.raw is not None:
        named = event.raw.get("instance")  # routing offers it to that instance only, too
        if isinstance(named, str) and named != rules.name:
            return Filtered("instance")
    if rules.bucket is not None and event.bucket is not None and event.bucket != rules.bucket:
        return Filtered("bucket")
    key = under_prefix(event.key, rules.prefix)
    if key is None:
        return Filtered("prefix")
    if rules.prefix and escapes_root(key):
        return Filtered("prefix-escape")
    changes: dict[str, object] = {"key": key} if key != event.key else {}
    for name, prefix in rules.dropped_prefixes:
        # The plugin's prefix itself, its folder marker (`.versions/`) and everything below.
        if key == prefix or key.startswith(prefix + "/"):
            return Filtered(f"plugin:{name}")
    if rules.clears_unsized and not event.size:
        changes.update(size=None, etag=None)
    if rules.clears_size:
        changes["size"] = None
    # Most instances change nothing: the event itself (frozen) serves, without a copy.
    return event.model_copy(update=changes) if changes else event


NAMED_AT_MOST = 20
"""How many instances a start-up line names; the others are counted."""
BUCKETLESS_SOURCES = ("box", "cloudinary")
"""Sources whose deliveries name no bucket: they pass every bucket filter."""


def open_instances_warning(instances: Sequence[Instance | InstanceRules]) -> str | None:
    """One start-up line naming the instances bound to a bucket that accept every source, or
    None. Said once per start: it is a configuration choice, not an event."""
    names = [i.name for i in instances if i.bucket is not None and i.sources is None]
    if not names:
        return None
    named = ", ".join(names[:NAMED_AT_MOST])
    if len(names) > NAMED_AT_MOST:  # one line, at 10,000 instances too
        named += f" and {len(names) - NAMED_AT_MOST:,} more"
    return (
        f"instance(s) {named} take one bucket but set no `sources`: every "
        "authenticated source can write into them by naming that bucket, and "
        f"{' and '.join(BUCKETLESS_SOURCES)} deliveries (which name no bucket) pass the "
        'bucket filter; list the sources each accepts, e.g. sources = ["s3"]'
    )
