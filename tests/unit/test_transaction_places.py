"""What one emit transaction takes of the parts waiting to be committed (issue 33): parts
merged while the output partitions they may touch add up to at most MAX_TRANSACTION_PLACES,
so a batch spread over thousands of instances' topics is committed in several transactions
rather than one that outlives the transaction timeout; a stream with few output partitions
merges every waiting part, as before."""

from __future__ import annotations

import asyncio

import pytest

from streams.core.records import OutRecord
from streams.engine.librdkafka.transactions import (
    MAX_TRANSACTION_PLACES,
    _places,
    _Request,
    _within_places,
)


def request(records: list[OutRecord]) -> _Request:
    loop = asyncio.new_event_loop()
    try:
        return _Request(0, records, {}, loop.create_future())
    finally:
        loop.close()


def spread(instances: int, per_topic: int = 1, changelog: int = 0) -> _Request:
    records = [
        OutRecord(f"files.t{i}", f"k{i}-{n}".encode(), b"{}")
        for i in range(instances)
        for n in range(per_topic)
    ]
    records += [OutRecord("emit-changelog", b"s", b"", partition=changelog)] * 3
    return request(records)


def test_places_count_a_topics_records_up_to_its_partitions() -> None:
    part = spread(instances=3, per_topic=10, changelog=2)
    # Unknown topics: a partition per record; the changelog's one dictated partition once.
    assert _places(part, {}) == 30 + 1
    # Known: each instance topic has 4 partitions, so its 10 records touch 4 at most.
    assert _places(part, {f"files.t{i}": 4 for i in range(3)}) == 3 * 4 + 1


def test_few_output_partitions_merge_every_waiting_part() -> None:
    partitions = {"files.t0": 4}
    queue = [spread(instances=1, per_topic=5_000, changelog=p) for p in range(8)]
    taken, rest = _within_places(queue, partitions)
    assert (taken, rest) == (queue, [])


def test_parts_spread_over_many_topics_go_in_transactions_of_bounded_places() -> None:
    partitions = {f"files.t{i}": 4 for i in range(1_000)}
    queue = [spread(instances=1_000, per_topic=2, changelog=p) for p in range(4)]
    per_part = _places(queue[0], partitions)
    assert per_part == 1_000 * 2 + 1 > MAX_TRANSACTION_PLACES // 2
    committed: list[list[_Request]] = []
    while queue:
        taken, queue = _within_places(queue, partitions)
        committed.append(taken)
    # Each part alone (with one more, the two would pass the bound), all of them, in order.
    assert [len(taken) for taken in committed] == [1, 1, 1, 1]


@pytest.mark.parametrize("places", [1, MAX_TRANSACTION_PLACES, MAX_TRANSACTION_PLACES + 1])
def test_a_part_alone_always_goes_whatever_its_places(places: int) -> None:
    part = request([OutRecord("files.x", str(i).encode(), b"") for i in range(places)])
    assert _within_places([part], {}) == ([part], [])
    small = spread(instances=1)
    taken, rest = _within_places([part, small], {})
    assert taken[0] is part
    assert (len(taken), len(rest)) == ((2, 0) if places + 2 <= MAX_TRANSACTION_PLACES else (1, 1))
