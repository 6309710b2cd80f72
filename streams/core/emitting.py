"""Stage two, pure: keyed events become output, stale or nothing (duplicates), per batch.

Runs on the repartition topic, so every copy of one change and every change of one key is in
one partition and handled in order. For each event, in order:

1. Dedupe on (instance, scope, event.id): an id seen less than the instance's TTL ago is a
   duplicate. The expiry is written once, when the id is first handled, and never extended,
   so neither a redelivery nor a state restore gives an id a fresh lease.
2. Order per (instance, scope, bucket, key): an event older than the last one emitted for its
   key in its scope goes to the stale topic with the reason (see streams.core.ordering); a
   `deleted` that removed only a noncurrent version is emitted but does not move the key's
   mark, since the key lives on. An event time beyond `stream.max_clock_skew_s` ahead of the
   worker's clock is not recorded in the mark.
3. Otherwise it is emitted.

The scope (`streams.core.ordering.scope`) is the provider that issued the id and the token, as
Azure storage account or AWS partition where one endpoint receives several: one provider's
credential cannot make another provider's change a duplicate (a B2 `eventId` equal to an S3
change's derived id) or stale (a MinIO sequencer `"F" * 64`, a Supabase time of 9999-12-31),
and same-named buckets of two providers never order against each other.

State (the tables are co-partitioned with the repartition topic; the partition is the input
record's). One record per key holds all an event's decision reads (streams.core.keystate: the
key's mark, its recent ids, its ETag), so an event costs one read and each key a batch touched
one changelog record:

* `keys`: `<instance>|<scope>|<bucket>/<key>` -> the key's record. Dedupe is per key: an id
  names one change of one object, so an id seen under its key is a duplicate. A `reconcile`
  id is kept apart from the provider's ids under the same key (`id_scope`): a listing's id
  never takes a provider's.
* `seen`: ids a hot key's record could not keep (`keystate.RECENT_IDS`), read only for a key
  whose record says so (`spill_until`). Keys (`id_scope`): `<instance>/<id>` when the id is
  the provider's own derived id (`<provider>:...`) and the scope is the provider itself, else
  `<instance>|<scope>|<id>`. Instance names hold no `|` and scopes neither `|`, `/` nor `:`, so
  no two (instance, scope, id) share a key, and a key of the first form with the id `<p>:...`
  can only be written by provider `p`.
* `marks`: read only to move state written by older versions into `keys`
  (`migrated_mark`, at a partition's restore), then emptied.

State written by older versions (two tables; keys without scopes) is read for one window, the
longest dedupe TTL after a partition's first plan (`SEEN_UNTIL_KEY`, `LEGACY_UNTIL_KEY`): a
miss in a key's record also reads `seen` and the unscoped keys, under rules that let no
provider's delivery reach another's state (`legacy_id_readable`, `legacy_mark_applies`).
What each upgrade keeps, and why that is safe: docs/upgrading.md, "Per-key state" and "Provider
scopes in the stream's state".

Deleted keys' marks expire (streams.core.ordering `with_grace`): the mark a `deleted` event
leaves records `forget_at` = now + the grace (`stream.deleted_mark_grace_s`, else the
instance's `dedupe_ttl`: `deleted_mark_grace`). Past it, the plan reads the mark as none; once
the key's ids have expired too, a restore skips its record (`keystate.record_forget_at`) and
the worker's sweeper deletes it and tombstones it in the changelog (`key_revision`). A
deleted key's mark without `forget_at` is stamped by the sweeper with the sweep's time + the
grace. Live keys' records stay.

The plan holds the records to send and the state to record once Kafka acknowledged them:
a batch that fails to send records nothing, so its redelivery runs again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from streams.config import InstanceConfig, Settings
from streams.core.event import FileEvent
from streams.core.keystate import (
    FORGETTABLE_MARKER,
    KeyState,
    decode,
    encode,
    read_json,
    record_forget_at,
)
from streams.core.normalizers import SOURCES
from streams.core.ordering import (
    TOKEN_KINDS,
    Mark,
    bounded_mark,
    forgotten,
    mark_for,
    recorded_mark,
    scope,
    stale_reason,
    with_grace,
)
from streams.core.records import (
    KeyedEvent,
    OutRecord,
    RawRecord,
    dead_letter_record,
    keyed_output_record,
    keyed_stale_record,
    parse_keyed,
    partition_key,
)
from streams.engine.store import OFFSET_KEY, Revision

KEYS = "keys"
SEEN = "seen"
MARKS = "marks"
LEGACY_UNTIL_KEY = b"\x00legacy-keys-until"
"""In `keys` (in `marks` before per-key state): until when this partition also reads the keys
written before scopes (module docstring). Starts with NUL, as no instance name does; it never
expires (it is no key's record)."""
SEEN_UNTIL_KEY = b"\x00seen-ids-until"
"""In `keys`: until when a miss in a key's ids also reads `seen`, where ids were recorded
before per-key state (module docstring)."""
KEYS_SWEEP_SCAN = 50_000
"""Key records a sweep reads per partition (the next sweep resumes there): the table holds
every live key, and the sweep holds the emit stage up while it reads, 1.5-4 us a record
(BENCHMARKS.md, "Marks: bounded state"; a live key's record is skipped unparsed). Decisions do
not wait for it (a mark past its grace counts as none, an expired id as new), only the space
does: a partition of 2.5M keys is read through every 50 sweeps."""
SEEN_SWEEP_SCAN = 50_000
"""Dedupe ids a sweep reads per partition (the next sweep resumes there; `seen_revision`): the
table holds every id of the last TTL, millions per partition, and a read costs ~1.6 us an id.
Decisions do not wait for it (an id past its expiry counts as new, a restore skips it), only
the space does: a partition of 2M ids is read through every 40 sweeps (20 min at the default
30 s), so an id leaves the disk at most that long after its expiry."""
DELETED_MARKER = b"deleted"
"""In every stored mark of a deleted key (its `type`): marks without it are skipped unparsed."""
KNOWN_SOURCES = frozenset(SOURCES)
UNPREFIXED_ID_PROVIDERS = frozenset({"eventbridge", "azure", "b2", "box", "cloudinary"})
"""Providers whose event ids are their own (not `<provider>:...`)."""


@dataclass(slots=True)  # not frozen: built per record (streams.core.records)
class KeyedInput:
    """One record read from the repartition topic."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes
    headers: Mapping[str, bytes | None] = field(default_factory=dict)
    offset: int = -1


class StateReader(Protocol):
    """Read access to the co-partitioned state tables."""

    def get(self, table: str, partition: int, key: bytes) -> bytes | None: ...


class PendingState:
    """State as plans not applied yet will leave it: their writes, newest first, then `state`.

    Lets the next batch of a partition be planned while the previous one is still being
    written to Kafka."""

    def __init__(self, state: StateReader, pending: Sequence[EmitPlan]) -> None:
        self.state = state
        self.writes = [plan.writes for plan in reversed(pending)]

    def get(self, table: str, partition: int, key: bytes) -> bytes | None:
        for writes in self.writes:
            items = writes.get((table, partition))
            if items is not None and key in items:
                return items[key]
        return self.state.get(table, partition, key)


@dataclass(slots=True)
class EmitPlan:
    outputs: list[OutRecord] = field(default_factory=list)
    writes: dict[tuple[str, int], dict[bytes, bytes]] = field(default_factory=dict)
    """(table, partition) -> key -> value, to record after the outputs are acknowledged."""
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(instance, emitted|duplicate|stale|dead_letter) -> count"""
    received_at: list[tuple[str, bytes]] = field(default_factory=list)
    """(instance, received-at header) of every emitted event, for latency metrics."""

    def write(self, table: str, partition: int, key: bytes, value: bytes) -> None:
        self.writes.setdefault((table, partition), {})[key] = value


def seen_key(instance: str, event_id: str, scope: str | None = None) -> bytes:
    """The dedupe key of an id in `scope`; without a scope, the key of a provider's own
    derived id in its own scope, which is also the key before scopes (module docstring)."""
    if scope is None:
        return f"{instance}/{event_id}".encode()
    return f"{instance}|{scope}|{event_id}".encode()


def own_id(event_id: str, provider: str, scope: str) -> bool:
    """Whether `event_id` is `provider`'s derived id in the provider's own scope."""
    return (
        scope == provider
        and event_id.startswith(provider)
        and event_id[len(provider) : len(provider) + 1] == ":"
    )


def mark_key(instance: str, event: KeyedEvent | FileEvent, scope: str | None = None) -> bytes:
    """Ordering state is per object and scope: (instance, scope, bucket, key). Without a
    scope: the key before scopes, (instance, bucket, key) like the repartition key."""
    if scope is None:
        return partition_key(instance, event.bucket, event.key)
    return f"{instance}|{scope}|{event.bucket or ''}/{event.key}".encode()


def instance_scope(event: KeyedEvent, instance: InstanceConfig) -> str:
    """`streams.core.ordering.scope`, except that a `reconcile` event takes the scope of the
    instance's one source: it is a listing of that provider's bucket, ordered by time
    against the provider's own notifications."""
    if event.provider == "reconcile":
        return instance.reconciled_source or scope(event)
    return scope(event)


def id_scope(event: KeyedEvent, event_scope: str) -> str:
    """The scope of an event's id: its ordering scope, except that a `reconcile` id is
    always reconcile's own. Ordered against its provider's notifications, a listing's id
    must still never take one of theirs: a reconcile delivery naming a B2 `eventId` as its
    `id` would otherwise make that real change a duplicate."""
    return "reconcile" if event.provider == "reconcile" else event_scope


def id_key(instance: str, event_id: str, provider: str, scope: str) -> tuple[bytes, bool]:
    """The `seen` key of `provider`'s id in `scope`, and whether the id is the provider's own
    (whose key is the one before scopes: module docstring)."""
    own = own_id(event_id, provider, scope)
    return seen_key(instance, event_id, None if own else scope), own


def scoped_seen_key(instance: str, event: KeyedEvent, scope: str) -> tuple[bytes, bool]:
    """`id_key` of `event`'s id in `scope`."""
    return id_key(instance, event.id, event.provider, scope)


def spill_key(instance: str, entry: list[Any], event_scope: str) -> bytes:
    """The `seen` key of an id moved out of its key's record (`KeyState.remember`): the key
    a lookup of that id reads (`scoped_seen_key`), its provider being the scope's own, or
    reconcile's for a reconcile id (the entry's third element)."""
    if len(entry) > 2:
        return id_key(instance, entry[0], "reconcile", "reconcile")[0]
    return id_key(instance, entry[0], event_scope.partition("@")[0], event_scope)[0]


def unrecord(plan: EmitPlan, event: KeyedEvent, instance: InstanceConfig, partition: int) -> None:
    """Take `event`'s id back out of `plan`'s writes: its output was refused and replaced by
    a dead letter, whose replay after the fix must be no duplicate. Its key's mark stays (at
    worst an older event of the key is stale)."""
    event_scope = instance_scope(event, instance)
    ids_scope = id_scope(event, event_scope)
    writes = plan.writes.get((KEYS, partition), {})
    key = mark_key(instance.name, event, event_scope)
    stored = writes.get(key)
    if stored is not None:
        current = decode(stored)
        current.forget(event.id, ids_scope != event_scope)
        writes[key] = encode(current)
    plan.writes.get((SEEN, partition), {}).pop(dedupe_key(event, instance), None)


def dedupe_key(event: KeyedEvent, instance: InstanceConfig) -> bytes:
    """The `seen` key of `event` in `instance`: where its id is if it was spilled from its
    key's record, or recorded before per-key state."""
    event_scope = id_scope(event, instance_scope(event, instance))
    return scoped_seen_key(instance.name, event, event_scope)[0]


def legacy_id_readable(event_id: str, provider: str) -> bool:
    """Whether the pre-scope key of `event_id` may stand in for a scoped miss: not for an id
    `<p>:...` of another source `p`, whose old-form key `p` still writes."""
    head, colon, _ = event_id.partition(":")
    return not colon or head == provider or head not in KNOWN_SOURCES


def legacy_mark_applies(legacy: Mark, mark: Mark, provider: str, scope: str) -> bool:
    """Whether a mark written before scopes orders an event of `provider` in `scope` whose
    own mark is `mark`: same provider (by the id's prefix, else by the token kind), same kind."""
    if legacy.kind != mark.kind:
        return False
    owners = {provider, scope.partition("@")[0]}
    head, colon, _ = legacy.event_id.partition(":")
    if colon and head in KNOWN_SOURCES:
        return head in owners
    if legacy.kind is None:
        return not owners.isdisjoint(UNPREFIXED_ID_PROVIDERS)
    # Unprefixed with a token: S3, MinIO and GCS ids are always prefixed.
    issuers = TOKEN_KINDS[legacy.kind] & UNPREFIXED_ID_PROVIDERS
    return not owners.isdisjoint(issuers)


class InstanceTimes:
    """What the plan and the sweep look up by instance, built once per Settings
    (Settings.derived: `instance_times`), so that neither scans the instances per batch or
    per key (issue 33)."""

    def __init__(self, settings: Settings) -> None:
        self.instances: dict[str, InstanceConfig] = {
            instance.name: instance for instance in settings.instances
        }
        self.longest: float = max(instance.dedupe_ttl for instance in settings.instances)
        """The longest dedupe TTL."""
        chosen = settings.stream.deleted_mark_grace_s
        self.graces: dict[str, float] = {
            name: chosen if chosen is not None else instance.dedupe_ttl
            for name, instance in self.instances.items()
        }
        """Each instance's deleted-mark grace (`deleted_mark_grace`)."""
        self.other_grace: float = chosen if chosen is not None else self.longest
        """The grace of an instance no longer configured."""


def instance_times(settings: Settings) -> InstanceTimes:
    return settings.derived(InstanceTimes)


def deleted_mark_grace(settings: Settings, instance_name: str) -> float:
    """How long a deleted key's mark is kept: `stream.deleted_mark_grace_s`, else the
    instance's dedupe TTL (else, for an instance no longer configured, the longest)."""
    times = instance_times(settings)
    return times.graces.get(instance_name, times.other_grace)


def mark_instance(key: bytes) -> str:
    """The instance of a `marks` key of either form (`<instance>|...`, `<instance>/...`):
    instance names hold neither `|` nor `/`."""
    text = key.decode("utf-8", "replace")
    return text.split("|", 1)[0].split("/", 1)[0]


def mark_forget_at(stored: bytes) -> float | None:
    """When a stored mark is forgotten, None if never (a live key's, or not stamped yet): the
    restore's expiry reader for `marks`."""
    if DELETED_MARKER not in stored:
        return None
    mark = _read_mark(stored)
    return mark.forget_at if mark is not None and mark.type == "deleted" else None


def key_revision(
    key: bytes, stored: bytes, now: float, grace_of: Callable[[bytes], float]
) -> Revision | None:
    """What the sweep does to one `keys` record: None (keep it); delete one past its end
    (`streams.core.keystate`: a deleted key's past its grace whose ids expired, or one of ids
    alone); stamp a deleted key's mark written before marks expired (no `forget_at`, migrated
    from `marks`) with `now` + its grace (`grace_of(key)`), so that it goes a grace later."""
    if key.startswith(b"\x00"):
        return None  # a partition's marker, no key's record
    if FORGETTABLE_MARKER in stored:
        ends = record_forget_at(stored)
        return FORGET if ends is not None and ends <= now else None
    if DELETED_MARKER not in stored:
        return None
    current = decode(stored)
    mark = current.mark
    if mark is None or mark.type != "deleted" or mark.forget_at is not None:
        return None
    current.mark = with_grace(mark, now, grace_of(key))
    return Revision(encode(current))


def migrated_mark(key: bytes, stored: bytes) -> bytes | None:
    """The `keys` record of a `marks` entry (per-key state's upgrade: a key's mark becomes its
    record's; the pre-scope window's marker is copied as it is); None for an unreadable one."""
    if key == LEGACY_UNTIL_KEY:
        return stored
    mark = _read_mark(stored)
    return encode(KeyState(mark=mark)) if mark is not None else None


def encode_expiry(expires_at: float) -> bytes:
    return f"{expires_at:.3f}".encode()


def decode_expiry(value: bytes | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


FORGET = Revision(None)
"""The revision that deletes an entry: one object for every id a sweep forgets."""


def seen_revision(key: bytes, stored: bytes, now: float) -> Revision | None:
    """What the sweep does to one `seen` entry: delete it once its expiry has passed; keep
    it otherwise (and one without a readable expiry, which this stream never writes)."""
    expires_at = decode_expiry(stored)
    return FORGET if expires_at is not None and expires_at <= now else None


def plan_batch(
    inputs: Sequence[KeyedInput], settings: Settings, state: StateReader, now: float
) -> EmitPlan:
    """Decide every event of a batch; `now` (epoch seconds) ages dedupe entries, bounds the
    event times recorded in marks and closes the windows of earlier state layouts.

    One state read per event on the common path (its key's record, `streams.core.keystate`),
    and one record written per key the batch touched, however many of its events it held."""
    plan = EmitPlan()
    times = instance_times(settings)  # read only: shared by every batch
    instances = times.instances
    latest = now + settings.stream.max_clock_skew_s
    windows: dict[tuple[bytes, int], float] = {}
    graces = times.graces
    records: dict[tuple[int, bytes], KeyState] = {}
    """(partition, key) -> the key's state as this batch leaves it; written once at the end."""
    changed: set[tuple[int, bytes]] = set()
    longest = times.longest

    def lookup(table: str, partition: int, key: bytes) -> bytes | None:
        found = plan.writes.get((table, partition))
        if found is not None and key in found:
            return found[key]
        return state.get(table, partition, key)

    def window_open(marker: bytes, partition: int, tables: tuple[str, ...]) -> bool:
        """Whether `partition` still reads an earlier layout's state (module docstring):
        until `marker`'s time in `keys`, set on the partition's first plan to now + the
        longest TTL when any of `tables` had state, else to now. Read once per batch."""
        until = windows.get((marker, partition))
        if until is None:
            stored = lookup(KEYS, partition, marker)
            if stored is not None:
                until = decode_expiry(stored) or 0.0
            else:
                had_state = any(
                    state.get(table, partition, OFFSET_KEY) is not None for table in tables
                )
                until = now + longest if had_state else now
                plan.write(KEYS, partition, marker, encode_expiry(until))
            windows[(marker, partition)] = until
        return now < until

    for item in inputs:
        instance_name = "?"
        try:
            event = parse_keyed(item.value, item.headers)
            instance_name = event.instance
            instance = instances[instance_name]
        except (ValueError, KeyError) as exc:
            reason = f"unreadable keyed record: {exc}"
            if isinstance(exc, KeyError):
                reason = f"instance {exc} is no longer configured"
            raw = RawRecord(item.topic, item.value, item.headers)
            plan.outputs.append(
                dead_letter_record(settings.stream.dead_letter_topic, raw, item.key, reason, "emit")
            )
            plan.outcomes[(instance_name, "dead_letter")] += 1
            continue

        partition = item.partition
        event_scope = instance_scope(event, instance)
        ids_scope = id_scope(event, event_scope)
        reconciled = ids_scope != event_scope
        key_key = mark_key(instance.name, event, event_scope)
        found = records.get((partition, key_key))
        if found is None:
            found = records[(partition, key_key)] = decode(lookup(KEYS, partition, key_key))
        current = found

        # 1. Dedupe: the key's recent ids, then (a hot key's, or in the upgrade window) `seen`.
        if current.seen(event.id, reconciled, now):
            plan.outcomes[(instance.name, "duplicate")] += 1
            continue
        if current.spilled(now) or window_open(SEEN_UNTIL_KEY, partition, (SEEN, MARKS)):
            id_key, own = scoped_seen_key(instance.name, event, ids_scope)
            stored = lookup(SEEN, partition, id_key)
            if (
                stored is None
                and not own
                and window_open(LEGACY_UNTIL_KEY, partition, (SEEN, MARKS, KEYS))
                and legacy_id_readable(event.id, event.provider)
            ):
                stored = state.get(SEEN, partition, seen_key(instance.name, event.id))
            expires_at = decode_expiry(stored)
            if expires_at is not None and expires_at > now:
                plan.outcomes[(instance.name, "duplicate")] += 1
                continue
        changed.add((partition, key_key))
        for spilled in current.remember(event.id, reconciled, now + instance.dedupe_ttl, now):
            spilled_key = spill_key(instance.name, spilled, event_scope)
            plan.write(SEEN, partition, spilled_key, encode_expiry(spilled[1]))

        # 2. Order against the key's mark (or, in the pre-scope window, its old mark).
        mark = mark_for(event)
        last = current.mark
        if last is None and window_open(LEGACY_UNTIL_KEY, partition, (SEEN, MARKS, KEYS)):
            legacy = decode(state.get(KEYS, partition, mark_key(instance.name, event))).mark
            if legacy is not None and legacy_mark_applies(
                legacy, mark, event.provider, event_scope
            ):
                last = legacy
        if forgotten(last, now):
            last = None  # a deleted key past its grace: as if never seen
        last = bounded_mark(last, latest)
        stale_because = stale_reason(mark, event, last)
        if stale_because is not None:
            plan.outputs.append(
                keyed_stale_record(instance.stale_output_topic, event, stale_because)
            )
            plan.outcomes[(instance.name, "stale")] += 1
            continue

        # 3. Emit.
        if not _version_only(event):
            recorded = with_grace(recorded_mark(mark, last, latest), now, graces[instance.name])
            current.mark = recorded
            current.etag = event.etag
        plan.outputs.append(keyed_output_record(instance.output_topic, event))
        plan.outcomes[(instance.name, "emitted")] += 1
        received_at = item.headers.get("received-at")
        if received_at:
            plan.received_at.append((instance.name, received_at))
    for partition, key in changed:
        plan.write(KEYS, partition, key, encode(records[(partition, key)]))
    return plan


def _read_mark(stored: bytes | None) -> Mark | None:
    """The stored mark; an unreadable one counts as none (unknown order passes)."""
    if stored is None:
        return None
    try:
        data = read_json(stored)
        return Mark.from_json(data) if isinstance(data, dict) else None
    except (ValueError, TypeError):
        return None


def _version_only(event: KeyedEvent) -> bool:
    return event.type == "deleted" and event.version_only is True
