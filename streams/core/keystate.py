"""The emit stage's state of one object key, pure: one record per (instance, scope, bucket, key).

Everything stage two decides about a key's event is in one record, so that an event costs one
state read and one changelog record (streams.core.emitting):

* `mark`: the ordering mark of the newest event emitted for the key (streams.core.ordering);
* `ids`: the key's recent event ids and their absolute expiry (the dedupe TTL of the instance
  from when each was first handled, never extended). Dedupe per key is dedupe per id: an id
  names one change of one object, and every change of a key is in the key's partition;
* `etag`: the ETag of the newest event emitted, for reconcile's comparison with a listing;
* `spill_until`: when this key's ids outgrew `RECENT_IDS`, the latest expiry among those moved
  out to the `seen` table. Until then a miss in `ids` also reads `seen` (a hot key's second
  read); a key changed a million times a day keeps a record of bounded size, and writing it
  costs the same on its millionth change as on its first.

The record is JSON (orjson), its fields short:

    {"m": <Mark.to_json()>, "e": "<etag>", "i": [["<id>", <expiry>], ["<id>", <expiry>, 1]],
     "s": <spill_until>, "x": <forget_at>}

An id entry's third element marks an id of reconcile's own scope (streams.core.emitting
`id_scope`): a listing's id never takes a provider's, even under one key. `x` is the record's
own end, written only when nothing in it is kept for good (no mark, or a deleted key's):
the latest of the mark's `forget_at`, the ids' expiries and `spill_until`. Past it the record
is as if absent: a restore skips it (`record_forget_at`) and the sweep deletes it. A live
key's record has no `x` and stays (its mark is what makes an older copy of it stale).

Reconcile reads these records (compacted in their changelog) to learn, per key, what the stream
emitted last: present or deleted, its ETag and its ordering token.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from streams.core.ordering import Mark

RECENT_IDS = 8
"""Ids kept in a key's record; older live ones move to `seen` (`spill_until`). Redeliveries
come within minutes of the change; eight changes of one key inside that is a hot key."""
FORGETTABLE_MARKER = b'"x":'
"""In every stored record that can end (`x`): records without it are skipped unparsed by the
sweep and the restore."""
DECODED_RECORDS = 16_384
"""Records whose decoded state the emit stage keeps across batches (`Decoded`): about 1 KiB
each with their stored bytes, so 16 MiB at most."""


@dataclass(slots=True, init=False)  # the __init__ below is compiled; a dataclass's is not
class KeyState:
    """One key's state, decoded (`decode`) and written back once per batch (`encode`)."""

    mark: Mark | None
    ids: list[list[Any]]
    """[id, expiry] or [id, expiry, 1] (a reconcile id), oldest first."""
    etag: str | None
    spill_until: float | None

    def __init__(
        self,
        mark: Mark | None = None,
        ids: list[list[Any]] | None = None,
        etag: str | None = None,
        spill_until: float | None = None,
    ) -> None:
        self.mark = mark
        self.ids = [] if ids is None else ids
        self.etag = etag
        self.spill_until = spill_until

    def seen(self, event_id: str, reconcile: bool, now: float) -> bool:
        """Whether `event_id` (of reconcile's scope or not) is a live id of this key."""
        for entry in self.ids:
            if entry[0] == event_id and (len(entry) > 2) == reconcile and entry[1] > now:
                return True
        return False

    def spilled(self, now: float) -> bool:
        """Whether ids of this key were moved to `seen` and may still be live there."""
        return self.spill_until is not None and self.spill_until > now

    def remember(
        self, event_id: str, reconcile: bool, expires_at: float, now: float
    ) -> list[list[Any]]:
        """Record a new id; drop expired ones and return those that no longer fit
        (`RECENT_IDS`), oldest first, for the caller to spill to `seen`."""
        entry: list[Any] = [event_id, expires_at, 1] if reconcile else [event_id, expires_at]
        ids = [old for old in self.ids if old[1] > now] if self.ids else []
        ids.append(entry)
        spilled: list[list[Any]] = []
        if len(ids) > RECENT_IDS:
            spilled = ids[: len(ids) - RECENT_IDS]
            ids = ids[len(ids) - RECENT_IDS :]
            latest = max(old[1] for old in spilled)
            if self.spill_until is None or latest > self.spill_until:
                self.spill_until = latest
        self.ids = ids
        return spilled

    def forget(self, event_id: str, reconcile: bool) -> None:
        """Take `event_id` out again (its output was refused: a replay is no duplicate)."""
        self.ids = [
            entry
            for entry in self.ids
            if not (entry[0] == event_id and (len(entry) > 2) == reconcile)
        ]

    def copy(self) -> KeyState:
        """A state the caller may change without changing this one: its own `ids` list (the
        entries and the mark are shared: nothing changes them in place, `with_grace` and
        `remember` make new ones)."""
        return KeyState(self.mark, list(self.ids), self.etag, self.spill_until)

    def forget_at(self) -> float | None:
        """When the whole record may go; None while it holds a live key's mark (kept)."""
        mark = self.mark
        if mark is not None and (mark.type != "deleted" or mark.forget_at is None):
            return None
        ends = [entry[1] for entry in self.ids]
        if mark is not None and mark.forget_at is not None:
            ends.append(mark.forget_at)
        if self.spill_until is not None:
            ends.append(self.spill_until)
        return max(ends) if ends else 0.0

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.mark is not None:
            data["m"] = self.mark.to_json()
        if self.etag is not None:
            data["e"] = self.etag
        if self.ids:
            data["i"] = self.ids
        if self.spill_until is not None:
            data["s"] = self.spill_until
        ends = self.forget_at()
        if ends is not None:
            data["x"] = ends
        return data


def encode(state: KeyState) -> bytes:
    data = state.to_json()
    try:
        return orjson.dumps(data)
    except TypeError:  # orjson stops at 64-bit integers; a GCS token may be longer
        return json.dumps(data, separators=(",", ":")).encode()


def read_json(stored: bytes) -> object:
    """A stored JSON value (the `keys` records, and the marks of before them)."""
    try:
        return orjson.loads(stored)
    except orjson.JSONDecodeError:
        return json.loads(stored)  # integers past 64 bits, which only json reads


def decode(stored: bytes | None) -> KeyState:
    """The stored record; a missing or unreadable one is an empty state (no mark: unknown
    order passes; no ids: nothing is a duplicate)."""
    if stored is None:
        return KeyState()
    try:
        data = read_json(stored)
    except (ValueError, TypeError):
        return KeyState()
    if not isinstance(data, dict):
        return KeyState()
    mark_data = data.get("m")
    try:
        mark = Mark.from_json(mark_data) if isinstance(mark_data, dict) else None
    except (ValueError, TypeError):  # a field of the wrong type: no mark (order unknown)
        mark = None
    ids = data.get("i")
    if not isinstance(ids, list):
        ids = []
    else:
        for entry in ids:
            if not (
                type(entry) is list
                and 2 <= len(entry) <= 3
                and type(entry[0]) is str
                and type(entry[1]) in (int, float)
            ):
                ids = []  # not as this stage writes them: none counts
                break
    etag = data.get("e")
    spill = data.get("s")
    return KeyState(
        mark=mark,
        ids=ids,
        etag=etag if isinstance(etag, str) else None,
        spill_until=float(spill) if isinstance(spill, int | float) else None,
    )


def record_forget_at(stored: bytes) -> float | None:
    """When a stored record is forgotten, None if never (a live key's): the restore's expiry
    reader, and the sweep's test. Parses only records that carry `x`."""
    if FORGETTABLE_MARKER not in stored:
        return None
    try:
        data = read_json(stored)
    except (ValueError, TypeError):
        return None
    ends = data.get("x") if isinstance(data, dict) else None
    return float(ends) if isinstance(ends, int | float) else None


class Decoded:
    """`decode` and `encode` of key records, remembering the decoded state of the last
    `size` records read or written, so that a key handled again in a later batch is not
    parsed again (its record is read from the state as the bytes last written for it).

    A memo of a pure function: a stored record always decodes to the state kept for its
    bytes (`decode(encode(state)) == state` for every state the plan builds), and each caller
    gets its own copy. Bounded: once `size` are kept, the oldest entry goes, one for one, in
    O(1) (`OrderedDict.popitem`; a plain dict's first entry is found by scanning past the
    holes its deletions left). One for one keeps the cyclic collector's allocation count
    flat: freeing thousands of states at once would bring back young collections over the
    memo's states (BENCHMARKS.md, "Issue 32 item 4")."""

    def __init__(self, size: int = DECODED_RECORDS) -> None:
        self.size = size
        self.states: OrderedDict[bytes, KeyState] = OrderedDict()

    def decode(self, stored: bytes | None) -> KeyState:
        if stored is None:
            return KeyState()
        found = self.states.get(stored)
        if found is None:
            found = decode(stored)
            self.keep(stored, found)
        return found.copy()

    def encode(self, state: KeyState) -> bytes:
        stored = encode(state)
        self.keep(stored, state.copy())
        return stored

    def keep(self, stored: bytes, state: KeyState) -> None:
        states = self.states
        if stored in states:
            return
        if len(states) >= self.size:
            states.popitem(last=False)  # the oldest
        states[stored] = state
