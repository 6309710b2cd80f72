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
* `marks`: read only to move state written by older versions into `keys`, then emptied.

The plan reads the state through a `StateReads` (streams.core.state): the current layout by
itself, and, wrapped by streams.migrations (`UpgradeReads`, the default), for a window after an
upgrade also what earlier releases wrote (`seen` ids from before per-key state, keys from
before scopes). Each such window and move, and when it can be removed: streams.migrations.

The plan takes an `EmitPolicy` (built once from the settings by streams.policies), never the
settings themselves.

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

from streams.core.event import FileEvent
from streams.core.keystate import (
    FORGETTABLE_MARKER,
    Decoded,
    KeyState,
    decode,
    encode,
    record_forget_at,
)
from streams.core.ordering import (
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
from streams.core.state import (
    FORGET,
    KEYS,
    MARKS,
    SEEN,
    Revision,
    StateReader,
    StateReads,
    decode_expiry,
    encode_expiry,
    id_key,
    own_id,
    seen_key,
)
from streams.migrations import (
    LEGACY_UNTIL_KEY,
    SEEN_UNTIL_KEY,
    UpgradeReads,
    legacy_id_readable,
    legacy_mark_applies,
    mark_forget_at,
    migrated_mark,
    stamp_unended,
)
from streams.migrations.marks_move import DELETED_MARKER

__all__ = [
    "FORGET",
    "KEYS",
    "LEGACY_UNTIL_KEY",
    "MARKS",
    "SEEN",
    "SEEN_UNTIL_KEY",
    "StateReader",
    "decode_expiry",
    "encode_expiry",
    "id_key",
    "legacy_id_readable",
    "legacy_mark_applies",
    "mark_forget_at",
    "migrated_mark",
    "own_id",
    "seen_key",
]

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


@dataclass(frozen=True, slots=True)
class InstancePolicy:
    """What the plan needs of one instance (streams.policies builds it from its settings)."""

    name: str
    dedupe_ttl: float
    output_topic: str
    stale_output_topic: str
    reconciled_source: str | None
    """The provider a `reconcile` event of this instance is ordered against (`instance_scope`)."""
    deleted_mark_grace: float
    """How long a deleted key's mark is kept (`stream.deleted_mark_grace_s`, else the TTL)."""


@dataclass(frozen=True, slots=True)
class EmitPolicy:
    """What the plan and the sweep need of the settings, built once per settings
    (streams.policies `emit_policy`), so that neither scans the instances per batch or key."""

    instances: Mapping[str, InstancePolicy]
    dead_letter_topic: str
    max_clock_skew_s: float
    longest_ttl: float
    """The longest dedupe TTL: the upgrade windows' length."""
    other_grace: float
    """The deleted-mark grace of an instance no longer configured."""

    def grace(self, instance_name: str) -> float:
        """How long a deleted key's mark of `instance_name` is kept."""
        found = self.instances.get(instance_name)
        return found.deleted_mark_grace if found is not None else self.other_grace


class PolicySource(Protocol):
    """Something that holds an `EmitPolicy` (the settings: streams.config.Settings)."""

    def emit_policy(self) -> EmitPolicy: ...


def policy_of(source: EmitPolicy | PolicySource) -> EmitPolicy:
    return source if isinstance(source, EmitPolicy) else source.emit_policy()


class Scoping(Protocol):
    """What the scopes read of an instance: an InstancePolicy (or its settings)."""

    @property
    def name(self) -> str: ...
    @property
    def reconciled_source(self) -> str | None: ...


ReadsFactory = Callable[
    [StateReader, dict[tuple[str, int], dict[bytes, bytes]], float, float, Decoded | None],
    StateReads,
]
"""Builds one batch's reader: (state, the plan's writes, now, the longest TTL, the decoded
records kept across batches)."""


@dataclass(slots=True, init=False)  # per record: see streams.core.records.OutRecord
class KeyedInput:
    """One record read from the repartition topic."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes
    headers: Mapping[str, bytes | None]
    offset: int

    def __init__(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes,
        headers: Mapping[str, bytes | None] | None = None,
        offset: int = -1,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.key = key
        self.value = value
        self.headers = {} if headers is None else headers
        self.offset = offset


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


def mark_key(instance: str, event: KeyedEvent | FileEvent, scope: str | None = None) -> bytes:
    """Ordering state is per object and scope: (instance, scope, bucket, key). Without a
    scope: the key before scopes, (instance, bucket, key) like the repartition key."""
    if scope is None:
        return partition_key(instance, event.bucket, event.key)
    return f"{instance}|{scope}|{event.bucket or ''}/{event.key}".encode()


def instance_scope(event: KeyedEvent, instance: Scoping) -> str:
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


def unrecord(plan: EmitPlan, event: KeyedEvent, instance: Scoping, partition: int) -> None:
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


def dedupe_key(event: KeyedEvent, instance: Scoping) -> bytes:
    """The `seen` key of `event` in `instance`: where its id is if it was spilled from its
    key's record, or recorded before per-key state."""
    event_scope = id_scope(event, instance_scope(event, instance))
    return scoped_seen_key(instance.name, event, event_scope)[0]


def deleted_mark_grace(policy: EmitPolicy | PolicySource, instance_name: str) -> float:
    """How long a deleted key's mark is kept: `stream.deleted_mark_grace_s`, else the
    instance's dedupe TTL (else, for an instance no longer configured, the longest)."""
    return policy_of(policy).grace(instance_name)


def mark_instance(key: bytes) -> str:
    """The instance of a `keys` or `marks` key of either form (`<instance>|...`,
    `<instance>/...`): instance names hold neither `|` nor `/`."""
    text = key.decode("utf-8", "replace")
    return text.split("|", 1)[0].split("/", 1)[0]


def key_revision(
    key: bytes, stored: bytes, now: float, grace_of: Callable[[bytes], float]
) -> Revision | None:
    """What the sweep does to one `keys` record: None (keep it); delete one past its end
    (`streams.core.keystate`: a deleted key's past its grace whose ids expired, or one of ids
    alone); stamp a deleted key's mark that has no end (streams.migrations `stamp_unended`)
    with `now` + its grace (`grace_of(key)`), so that it goes a grace later."""
    if key.startswith(b"\x00"):
        return None  # a partition's marker, no key's record
    if FORGETTABLE_MARKER in stored:
        ends = record_forget_at(stored)
        return FORGET if ends is not None and ends <= now else None
    if DELETED_MARKER not in stored:
        return None
    current = decode(stored)
    if not stamp_unended(current, now, grace_of(key)):
        return None
    return Revision(encode(current))


def seen_revision(key: bytes, stored: bytes, now: float) -> Revision | None:
    """What the sweep does to one `seen` entry: delete it once its expiry has passed; keep
    it otherwise (and one without a readable expiry, which this stream never writes)."""
    expires_at = decode_expiry(stored)
    return FORGET if expires_at is not None and expires_at <= now else None


def plan_batch(
    inputs: Sequence[KeyedInput],
    policy: EmitPolicy | PolicySource,
    state: StateReader,
    now: float,
    reads: ReadsFactory = UpgradeReads,
    decoded: Decoded | None = None,
) -> EmitPlan:
    """Decide every event of a batch: dedupe, then order, then emit. `now` (epoch seconds)
    ages dedupe entries, bounds the event times recorded in marks and closes the upgrade
    windows; `reads` builds the batch's reader (streams.migrations' by default, which also
    reads what earlier releases wrote; `StateReads` for the current layout alone); `decoded`
    keeps key records decoded across batches (the stage's own; None parses every read).

    One state read per event on the common path (its key's record, `streams.core.keystate`),
    and one record written per key the batch touched, however many of its events it held."""
    rules = policy_of(policy)
    plan = EmitPlan()
    reader = reads(state, plan.writes, now, rules.longest_ttl, decoded)
    instances = rules.instances
    latest = now + rules.max_clock_skew_s
    records: dict[tuple[int, bytes], KeyState] = {}
    """(partition, key) -> the key's state as this batch leaves it; written once at the end."""
    changed: set[tuple[int, bytes]] = set()

    for item in inputs:
        event = _parse(item, instances, plan, rules.dead_letter_topic)
        if event is None:
            continue
        instance = instances[event.instance]
        partition = item.partition
        event_scope = instance_scope(event, instance)
        ids_scope = id_scope(event, event_scope)
        reconciled = ids_scope != event_scope
        key_key = mark_key(instance.name, event, event_scope)
        current = records.get((partition, key_key))
        if current is None:
            current = records[(partition, key_key)] = reader.record(partition, key_key)

        # 1. Dedupe: the key's recent ids, then the ids it spilled to `seen`.
        if current.seen(event.id, reconciled, now):
            plan.outcomes[(instance.name, "duplicate")] += 1
            continue
        spilled = current.spilled(now)
        expires_at = reader.spilled_expiry(partition, instance.name, event, ids_scope, spilled)
        if expires_at is not None and expires_at > now:
            plan.outcomes[(instance.name, "duplicate")] += 1
            continue
        changed.add((partition, key_key))
        for entry in current.remember(event.id, reconciled, now + instance.dedupe_ttl, now):
            spilled_key = spill_key(instance.name, entry, event_scope)
            plan.write(SEEN, partition, spilled_key, encode_expiry(entry[1]))

        # 2. Order against the key's mark.
        mark = mark_for(event)
        last = current.mark
        if last is None:
            last = reader.earlier_mark(partition, instance.name, event, event_scope, mark)
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
            recorded = recorded_mark(mark, last, latest)
            current.mark = with_grace(recorded, now, instance.deleted_mark_grace)
            current.etag = event.etag
        plan.outputs.append(keyed_output_record(instance.output_topic, event))
        plan.outcomes[(instance.name, "emitted")] += 1
        received_at = item.headers.get("received-at")
        if received_at:
            plan.received_at.append((instance.name, received_at))
    for partition, key in changed:
        plan.write(KEYS, partition, key, reader.encode(records[(partition, key)]))
    return plan


def _parse(
    item: KeyedInput,
    instances: Mapping[str, InstancePolicy],
    plan: EmitPlan,
    dead_letter_topic: str,
) -> KeyedEvent | None:
    """The keyed event of `item`, or None once its dead letter is in `plan` (unreadable, or of
    an instance no longer configured)."""
    instance_name = "?"
    try:
        event = parse_keyed(item.value, item.headers)
        instance_name = event.instance
        if instance_name not in instances:
            raise KeyError(instance_name)
        return event
    except (ValueError, KeyError) as exc:
        reason = f"unreadable keyed record: {exc}"
        if isinstance(exc, KeyError):
            reason = f"instance {exc} is no longer configured"
        raw = RawRecord(item.topic, item.value, item.headers)
        plan.outputs.append(dead_letter_record(dead_letter_topic, raw, item.key, reason, "emit"))
        plan.outcomes[(instance_name, "dead_letter")] += 1
        return None


def _version_only(event: KeyedEvent) -> bool:
    return event.type == "deleted" and event.version_only is True
