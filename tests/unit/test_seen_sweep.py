"""The `seen` sweep reads a bounded slice of the table per turn and covers it in turns.

On a real RocksDB database in a temporary directory: `StateStore.revisions` with the worker's
decision for dedupe ids (streams.core.emitting.seen_revision), turn after turn as the worker's
sweeper runs it, each turn's removals applied as the worker applies them once Kafka
acknowledged their tombstones.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import rocksdict

from streams.core.emitting import MARKS, SEEN, encode_expiry, seen_revision
from streams.engine.outcomes import Acknowledged
from streams.engine.store import OFFSET_KEY, Reviser, StateStore, Swept

NOW = 1_800_000_000.0
SEEN_CHANGELOG = "app-seen-changelog"
CHANGELOGS = {SEEN: SEEN_CHANGELOG, MARKS: "app-marks-changelog"}
SCAN = 70
LIMIT = 50_000


def expire_at(now: float) -> Reviser:
    """The sweeper's decision for `seen` entries at `now` (streams.worker `Pipeline.sweep`)."""
    return lambda key, stored: seen_revision(key, stored, now)


def id_key(index: int) -> bytes:
    """Ids whose key order is not their index order: live and expired ones interleave, as
    hashed event ids do; both key forms (streams.core.emitting), as a store written before
    scopes and since holds them."""
    spread = f"{index * 7919 % 10007:05d}-{index}"
    return (f"default/s3:{spread}" if index % 2 else f"default|eventbridge|{spread}").encode()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    opened = StateStore(tmp_path, CHANGELOGS)
    opened.open([0])
    yield opened
    opened.close()


def fill(store: StateStore, ids: int) -> tuple[set[bytes], set[bytes]]:
    """Partition 0 holds `ids` ids, every third one expired at NOW: (live, expired)."""
    expired = {id_key(index) for index in range(0, ids, 3)}
    live = {id_key(index) for index in range(ids)} - expired
    values = dict.fromkeys(expired, encode_expiry(NOW - 1))
    values.update(dict.fromkeys(live, encode_expiry(NOW + 3600)))
    store.apply({(SEEN, 0): values})
    return live, expired


def stored_ids(store: StateStore) -> set[bytes]:
    """Every id in partition 0's `seen` database, read back from RocksDB after a close."""
    store.close()
    db = rocksdict.Rdict(
        str(store.directory / "seen-0.db"),
        options=rocksdict.Options(raw_mode=True),
        access_type=rocksdict.AccessType.read_only(),
    )
    try:
        return {key for key in db.keys() if key != OFFSET_KEY}  # noqa: SIM118
    finally:
        db.close()


def sweep_turn(store: StateStore, now: float) -> Swept:
    """One turn over partition 0's `seen`, its removals applied locally."""
    swept = store.revisions(SEEN, 0, LIMIT, expire_at(now), SCAN)
    if swept.changes:
        store.apply({(SEEN, 0): swept.changes})
    return swept


def test_one_turn_reads_at_most_the_bound_and_the_next_goes_on_from_there(
    store: StateStore,
) -> None:
    live, expired = fill(store, 1000)
    in_order = sorted(live | expired)
    first = store.revisions(SEEN, 0, LIMIT, expire_at(NOW), SCAN)
    assert (first.read, first.finished) == (SCAN, False)
    assert first.changes
    assert set(first.changes) == set(in_order[:SCAN]) & expired
    following = store.revisions(SEEN, 0, LIMIT, expire_at(NOW), SCAN)
    assert following.read == SCAN
    assert set(following.changes) == set(in_order[SCAN : 2 * SCAN]) & expired


def test_repeated_turns_remove_every_expired_id_and_keep_every_live_one(
    store: StateStore,
) -> None:
    ids = 1000
    live, expired = fill(store, ids)
    removed: set[bytes] = set()
    turns = 0
    while turns < math.ceil(ids / SCAN):
        swept = sweep_turn(store, NOW)
        turns += 1
        assert swept.read <= SCAN
        assert set(swept.changes) <= expired
        assert set(swept.changes.values()) <= {None}
        removed |= set(swept.changes)
        if swept.finished:
            break
    assert swept.finished  # in the fewest turns the bound allows
    assert removed == expired
    assert stored_ids(store) == live


def test_ids_that_arrive_or_expire_during_a_pass_go_in_a_later_one(store: StateStore) -> None:
    live, expired = fill(store, 600)
    for _ in range(3):  # a pass under way
        sweep_turn(store, NOW)
    later = NOW + 10
    # Ids arriving meanwhile, before and after the cursor, and live ids expiring by `later`.
    arrivals = {f"default/s3:{head}-new".encode() for head in ("00000", "05000", "99999")}
    due = set(sorted(live)[::4])
    store.apply({(SEEN, 0): dict.fromkeys(arrivals | due, encode_expiry(later))})
    passes = 0
    for _ in range(3 * math.ceil(700 / SCAN)):
        passes += sweep_turn(store, later).finished
        if passes == 2:  # the one under way, then a whole one
            break
    assert passes == 2
    assert stored_ids(store) == live - due
    assert due and expired


def test_the_removed_ids_become_tombstones_on_the_seen_changelog(store: StateStore) -> None:
    _, expired = fill(store, 300)
    swept = store.revisions(SEEN, 0, LIMIT, expire_at(NOW), 1000)
    assert swept.finished
    records = store.changelog_records({(SEEN, 0): swept.changes})
    assert sorted(record.key or b"" for record in records) == sorted(expired)
    assert {(record.topic, record.partition, record.value) for record in records} == {
        (SEEN_CHANGELOG, 0, None)
    }


def test_the_sweep_skips_the_offset_key_and_keeps_values_without_an_expiry(
    store: StateStore,
) -> None:
    store.apply(
        {(SEEN, 0): {b"default/odd": b"not a time", b"default/due": encode_expiry(NOW)}},
        [Acknowledged(SEEN_CHANGELOG, 0, 40, 2)],  # offsets 40 and 41
    )
    assert seen_revision(b"default/soon", encode_expiry(NOW + 0.01), NOW) is None
    swept = sweep_turn(store, NOW)
    assert swept.changes == {b"default/due": None}  # gone at its expiry exactly
    assert (swept.read, swept.finished) == (2, True)
    assert store.changelog_offset(SEEN, 0) == 41
    assert stored_ids(store) == {b"default/odd"}
