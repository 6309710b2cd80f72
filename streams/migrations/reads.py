"""The upgrade windows (streams.migrations, items 1 and 2): for the longest dedupe TTL after a
partition's first plan by a release with per-key state and scopes, a miss in the current layout
also reads the older ones.

How a window works: on a partition's first plan its marker (`SEEN_UNTIL_KEY`,
`LEGACY_UNTIL_KEY`, in `keys`) is written, now + the longest dedupe TTL when the partition
already had state (a changelog offset in the tables the older layout used), else now. Read once
per batch and partition; past it, nothing of the older layout is read and a new event costs its
one read. Markers start with NUL, as no instance name does: they are no key's record.

The pre-scope readers let no provider's delivery reach another's state:

* ids (`legacy_id_readable`): for an id not of the provider's own `<p>:` form, the old key
  `<instance>/<id>` is read, unless the id starts with `<p>:` for a source `p` other than the
  event's provider, whose old-form key `p` still writes;
* marks (`legacy_mark_applies`): the record of the old key (which nothing writes any more)
  applies only to an event of the provider it came from, and only with the same token kind.
"""

from __future__ import annotations

from streams.core.keystate import Decoded, decode
from streams.core.normalizers import SOURCES
from streams.core.ordering import TOKEN_KINDS, Mark
from streams.core.records import partition_key
from streams.core.state import (
    KEYS,
    MARKS,
    OFFSET_KEY,
    SEEN,
    Keyed,
    StateReader,
    StateReads,
    decode_expiry,
    encode_expiry,
    id_key,
    seen_key,
)

LEGACY_UNTIL_KEY = b"\x00legacy-keys-until"
"""In `keys` (in `marks` before per-key state): until when this partition also reads the keys
written before scopes. It never expires (it is no key's record)."""
SEEN_UNTIL_KEY = b"\x00seen-ids-until"
"""In `keys`: until when a miss in a key's ids also reads `seen`, where ids were recorded
before per-key state."""
SEEN_WINDOW_TABLES = (SEEN, MARKS)
"""The tables a partition had state in before per-key state."""
LEGACY_WINDOW_TABLES = (SEEN, MARKS, KEYS)
"""The tables a partition had state in before scopes (`keys` since per-key state)."""
KNOWN_SOURCES = frozenset(SOURCES)
UNPREFIXED_ID_PROVIDERS = frozenset({"eventbridge", "azure", "b2", "box", "cloudinary"})
"""Providers whose event ids are their own (not `<provider>:...`)."""


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


class UpgradeReads(StateReads):
    """`StateReads` that, inside a partition's windows, also reads the older layouts: ids in
    `seen` (before per-key state) and under their pre-scope keys, marks under pre-scope keys."""

    def __init__(
        self,
        state: StateReader,
        writes: dict[tuple[str, int], dict[bytes, bytes]],
        now: float,
        longest_ttl: float,
        decoded: Decoded | None = None,
    ) -> None:
        super().__init__(state, writes, now, longest_ttl, decoded)
        self.windows: dict[tuple[bytes, int], float] = {}
        """(marker, partition) -> until when: each read once per batch."""

    def window_open(self, marker: bytes, partition: int, tables: tuple[str, ...]) -> bool:
        """Whether `partition` still reads an older layout's state (module docstring); the
        marker is written on the partition's first plan."""
        until = self.windows.get((marker, partition))
        if until is None:
            stored = self.lookup(KEYS, partition, marker)
            if stored is not None:
                until = decode_expiry(stored) or 0.0
            else:
                had_state = any(
                    self.state.get(table, partition, OFFSET_KEY) is not None for table in tables
                )
                until = self.now + self.longest_ttl if had_state else self.now
                self.writes.setdefault((KEYS, partition), {})[marker] = encode_expiry(until)
            self.windows[(marker, partition)] = until
        return self.now < until

    def spilled_expiry(
        self, partition: int, instance: str, event: Keyed, ids_scope: str, spilled: bool
    ) -> float | None:
        if not (spilled or self.window_open(SEEN_UNTIL_KEY, partition, SEEN_WINDOW_TABLES)):
            return None
        key, own = id_key(instance, event.id, event.provider, ids_scope)
        stored = self.lookup(SEEN, partition, key)
        if (
            stored is None
            and not own
            and self.window_open(LEGACY_UNTIL_KEY, partition, LEGACY_WINDOW_TABLES)
            and legacy_id_readable(event.id, event.provider)
        ):
            stored = self.state.get(SEEN, partition, seen_key(instance, event.id))
        return decode_expiry(stored)

    def earlier_mark(
        self, partition: int, instance: str, event: Keyed, event_scope: str, mark: Mark
    ) -> Mark | None:
        if not self.window_open(LEGACY_UNTIL_KEY, partition, LEGACY_WINDOW_TABLES):
            return None
        old_key = partition_key(instance, event.bucket, event.key)
        legacy = decode(self.state.get(KEYS, partition, old_key)).mark
        if legacy is not None and legacy_mark_applies(legacy, mark, event.provider, event_scope):
            return legacy
        return None
