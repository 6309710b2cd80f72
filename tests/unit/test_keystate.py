"""streams.core.keystate: one key's record (mark, recent ids, ETag, spill), its encoding, its
end; pure."""

from __future__ import annotations

import json

import pytest

from streams.core.keystate import (
    FORGETTABLE_MARKER,
    RECENT_IDS,
    KeyState,
    decode,
    encode,
    record_forget_at,
)
from streams.core.ordering import Mark

NOW = 1_800_000_000.0
LIVE = Mark("aws-sequencer", ("0005".ljust(64, "0"),), 1_700_000_000.0, "s3:5", "created")
DELETED = Mark(None, None, 1_700_000_000.0, "b2-id", "deleted", NOW + 5)
GCS = Mark("gcs-generation", (2**70, 2, 1), None, "gcs:x", "created")
"""A GCS generation past 64 bits: orjson refuses it, json writes it."""


@pytest.mark.parametrize(
    "state",
    [
        KeyState(),
        KeyState(LIVE, [["s3:5", NOW + 60], ["s3:5", NOW + 60, 1]], '"etag"', NOW + 30),
        KeyState(DELETED, [["b2-id", NOW + 60]]),
        KeyState(GCS, [["gcs:x", NOW]], "e"),
    ],
)
def test_a_record_round_trips(state: KeyState) -> None:
    assert decode(encode(state)) == state


def test_the_record_is_json_with_short_fields() -> None:
    state = KeyState(DELETED, [["b2-id", NOW + 60], ["r", NOW + 70, 1]], "e", NOW + 80)
    data = json.loads(encode(state))
    assert data == {
        "m": DELETED.to_json(),
        "e": "e",
        "i": [["b2-id", NOW + 60], ["r", NOW + 70, 1]],
        "s": NOW + 80,
        "x": NOW + 80,
    }
    assert set(json.loads(encode(KeyState(LIVE)))) == {"m"}  # a live key's: no end


@pytest.mark.parametrize(
    "stored",
    [
        None,
        b"",
        b"not json",
        b"[]",
        b'"text"',
        b"1800000000.000",  # a window marker
        b'{"i": "ids"}',
        b'{"i": [["a", 1.0], ["b"]]}',
        b'{"i": [[1, 2.0]]}',
        b'{"i": [["a", "soon"]]}',
        b'{"m": "mark", "e": 5, "s": "soon"}',
    ],
)
def test_an_unreadable_record_decodes_as_empty(stored: bytes | None) -> None:
    assert decode(stored) == KeyState()


def test_a_record_with_an_unreadable_mark_decodes_without_it() -> None:
    """A mark whose fields have the wrong types is no mark (the order is unknown: the event
    passes), and the record's ids still count; it never stops the partition."""
    state = decode(b'{"m": {"token": 5}, "i": [["a", 1.0]]}')
    assert state.mark is None
    assert state.ids == [["a", 1.0]]


def test_seen_is_per_id_scope_and_until_the_expiry() -> None:
    state = KeyState(ids=[["id", NOW + 10], ["listing", NOW + 10, 1]])
    assert state.seen("id", False, NOW + 9.999)
    assert not state.seen("id", False, NOW + 10)
    assert not state.seen("id", True, NOW)  # a reconcile id never takes a provider's
    assert state.seen("listing", True, NOW)
    assert not state.seen("listing", False, NOW)


def test_remember_drops_expired_ids_and_spills_the_oldest_beyond_recent_ids() -> None:
    state = KeyState(ids=[["gone", NOW]])
    assert state.remember("a0", False, NOW + 60, NOW) == []
    assert state.ids == [["a0", NOW + 60]]  # `gone` expired at NOW
    for index in range(1, RECENT_IDS):
        assert state.remember(f"a{index}", False, NOW + 60 + index, NOW) == []
    assert len(state.ids) == RECENT_IDS and state.spill_until is None
    assert state.remember("r", True, NOW + 30, NOW) == [["a0", NOW + 60]]
    assert state.spill_until == NOW + 60
    assert state.ids[-1] == ["r", NOW + 30, 1] and len(state.ids) == RECENT_IDS
    # `spill_until` is the latest expiry spilled: it never moves back.
    assert state.remember("b", False, NOW + 90, NOW) == [["a1", NOW + 61]]
    assert state.spill_until == NOW + 61
    state.spill_until = NOW + 1000
    state.remember("c", False, NOW + 90, NOW)
    assert state.spill_until == NOW + 1000
    assert state.spilled(NOW + 999.999) and not state.spilled(NOW + 1000)
    assert not KeyState().spilled(NOW)


def test_forget_takes_out_one_scope_s_entry() -> None:
    state = KeyState(ids=[["id", NOW], ["id", NOW, 1], ["other", NOW]])
    state.forget("id", True)
    assert state.ids == [["id", NOW], ["other", NOW]]
    state.forget("id", False)
    assert state.ids == [["other", NOW]]


def test_a_record_ends_when_nothing_in_it_is_kept_for_good() -> None:
    ids = [["a", NOW + 60], ["b", NOW + 30]]
    assert KeyState(LIVE, ids).forget_at() is None
    assert KeyState(DELETED, ids).forget_at() == NOW + 60
    assert KeyState(DELETED).forget_at() == NOW + 5
    assert KeyState(DELETED, ids, spill_until=NOW + 90).forget_at() == NOW + 90
    assert KeyState(ids=ids).forget_at() == NOW + 60
    assert KeyState().forget_at() == 0.0
    # A deleted key's mark written before marks expired: kept until the sweep stamps it.
    unstamped = Mark(None, None, 1.0, "b2-id", "deleted")
    assert KeyState(unstamped, ids).forget_at() is None


def test_record_forget_at_reads_the_end_of_records_that_carry_one() -> None:
    ended = encode(KeyState(DELETED, [["a", NOW + 60]]))
    assert FORGETTABLE_MARKER in ended
    assert record_forget_at(ended) == NOW + 60
    live = encode(KeyState(LIVE, [["a", NOW + 60]]))
    assert FORGETTABLE_MARKER not in live
    assert record_forget_at(live) is None
    assert record_forget_at(encode(KeyState(GCS, [["gcs:x", NOW]]))) is None
    assert record_forget_at(b'{"x":' + str(2**70).encode() + b', "i": []}') == float(2**70)
    assert record_forget_at(b"1800000000.000") is None  # a window marker
    assert record_forget_at(b'{"x": "soon"}') is None
    assert record_forget_at(b'["x": 1]') is None
    # The marker in a string (an id, an ETag) is always escaped: no end is read from it.
    odd = encode(KeyState(LIVE, [['id "x": 1', NOW]], 'e"x":2'))
    assert record_forget_at(odd) is None
    assert decode(odd).etag == 'e"x":2'
