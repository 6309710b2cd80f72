"""The emit stage's state tables as the core sees them, pure: table names, record keys, the
entry values it writes, and the read interface it decides against.

The state lives in RocksDB with a changelog per table (streams.engine.store, which imports these
names); the core only names keys and values, so the decisions are tested without a disk:

* `keys`: one record per (instance, scope, bucket, key) (streams.core.keystate);
* `seen`: a hot key's dedupe ids that its record could not keep, `<expiry>` as text
  (`encode_expiry`);
* `marks`: read only by the upgrade to per-key state (streams.migrations).

`OFFSET_KEY` in each table's database holds the changelog offset the database reached; no key of
a record starts with NUL, so neither it nor a partition's markers are any key's record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from streams.core.keystate import Decoded, KeyState, decode, encode
from streams.core.ordering import Mark

KEYS = "keys"
SEEN = "seen"
MARKS = "marks"
OFFSET_KEY = b"\x00changelog-offset"
"""Holds the last changelog offset a database contains; no state key starts with NUL."""


@dataclass(frozen=True, slots=True)
class Revision:
    """What a sweep does to one entry: write `value`, or delete the entry (None)."""

    value: bytes | None


FORGET = Revision(None)
"""The revision that deletes an entry: one object for every id a sweep forgets."""


class StateReader(Protocol):
    """Read access to the co-partitioned state tables."""

    def get(self, table: str, partition: int, key: bytes) -> bytes | None: ...


def encode_expiry(expires_at: float) -> bytes:
    return f"{expires_at:.3f}".encode()


def decode_expiry(value: bytes | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def seen_key(instance: str, event_id: str, scope: str | None = None) -> bytes:
    """The `seen` key of an id in `scope`; without a scope, the key of a provider's own derived
    id in its own scope (`<instance>/<id>`), which is also the key before scopes."""
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


def id_key(instance: str, event_id: str, provider: str, scope: str) -> tuple[bytes, bool]:
    """The `seen` key of `provider`'s id in `scope`, and whether the id is the provider's own
    (whose key is the one before scopes: streams.core.emitting)."""
    own = own_id(event_id, provider, scope)
    return seen_key(instance, event_id, None if own else scope), own


class Keyed(Protocol):
    """What the state reads of an event: stage two's KeyedEvent."""

    @property
    def id(self) -> str: ...
    @property
    def provider(self) -> str: ...
    @property
    def bucket(self) -> str | None: ...
    @property
    def key(self) -> str: ...


class StateReads:
    """One batch's reads of one state, in the current layout: a key's record (one read per
    event), and a hot key's spilled ids in `seen` (a second read only for such a key).

    Reads see the batch's own writes first (`writes`, the plan's). streams.migrations wraps
    this to also read what earlier releases wrote (`UpgradeReads`), for a window after an
    upgrade; the plan asks the same questions either way."""

    def __init__(
        self,
        state: StateReader,
        writes: dict[tuple[str, int], dict[bytes, bytes]],
        now: float,
        longest_ttl: float,
        decoded: Decoded | None = None,
    ) -> None:
        self.state = state
        self.decoded = decoded
        """Decoded records kept across batches (the stage's), or None: parsed every time."""
        self.writes = writes
        """(table, partition) -> key -> value: the plan's writes, read before `state`."""
        self.now = now
        self.longest_ttl = longest_ttl
        """The longest dedupe TTL of the configured instances."""

    def lookup(self, table: str, partition: int, key: bytes) -> bytes | None:
        found = self.writes.get((table, partition))
        if found is not None and key in found:
            return found[key]
        return self.state.get(table, partition, key)

    def record(self, partition: int, key: bytes) -> KeyState:
        """The key's record, decoded (an empty one when there is none)."""
        stored = self.lookup(KEYS, partition, key)
        return decode(stored) if self.decoded is None else self.decoded.decode(stored)

    def encode(self, state: KeyState) -> bytes:
        """A key's record to write (kept decoded for its next read, with `decoded`)."""
        return encode(state) if self.decoded is None else self.decoded.encode(state)

    def spilled_expiry(
        self, partition: int, instance: str, event: Keyed, ids_scope: str, spilled: bool
    ) -> float | None:
        """The expiry recorded in `seen` for `event`'s id in `ids_scope`, read only when its
        key's record says ids were spilled there and may be live (`spilled`)."""
        if not spilled:
            return None
        key = id_key(instance, event.id, event.provider, ids_scope)[0]
        return decode_expiry(self.lookup(SEEN, partition, key))

    def earlier_mark(
        self, partition: int, instance: str, event: Keyed, event_scope: str, mark: Mark
    ) -> Mark | None:
        """The mark that orders `event` (whose own is `mark`) when its key's record has none:
        none in the current layout."""
        return None
