"""The bridges' partitioner (connectors.publisher.KeylessSticky): keyed records exactly as
aiokafka's default (murmur2, like the Java client); key-less deliveries batched per time
slice and spread evenly. No broker needed."""

from __future__ import annotations

from collections import Counter

import pytest
from aiokafka.partitioner import DefaultPartitioner

from connectors.publisher import KeylessSticky, producer_settings

PARTITIONS = [0, 1, 2, 3]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_keyed_records_go_where_the_default_partitioner_puts_them() -> None:
    sticky, default = KeylessSticky(), DefaultPartitioner()
    for n in range(200):
        key = f"bucket/key-{n}".encode()
        assert sticky(key, PARTITIONS, PARTITIONS) == default(key, PARTITIONS, PARTITIONS)


def test_keyless_records_of_one_slice_share_a_partition(clock: Clock) -> None:
    sticky = KeylessSticky(clock)
    first = {sticky(None, PARTITIONS, PARTITIONS) for _ in range(50)}
    clock.now += KeylessSticky.SLICE_S
    second = {sticky(None, PARTITIONS, PARTITIONS) for _ in range(50)}
    assert len(first) == len(second) == 1
    assert first != second


@pytest.mark.parametrize("every_s", [0.0001, 0.001, 0.005, 0.02, 0.5])
def test_keyless_records_spread_evenly_whatever_the_arrival_period(
    clock: Clock, every_s: float
) -> None:
    sticky = KeylessSticky(clock)
    counts: Counter[int] = Counter()
    for _ in range(40_000):
        counts[sticky(None, PARTITIONS, PARTITIONS)] += 1
        clock.now += every_s
    assert set(counts) == set(PARTITIONS)
    assert max(counts.values()) - min(counts.values()) <= max(counts.values()) * 0.2


def test_only_available_partitions_are_used(clock: Clock) -> None:
    sticky = KeylessSticky(clock)
    used = set()
    for _ in range(100):
        used.add(sticky(None, PARTITIONS, [3, 1]))
        clock.now += KeylessSticky.SLICE_S
    assert used == {1, 3}
    assert sticky(None, PARTITIONS, []) in PARTITIONS


def test_the_bridges_producer_is_idempotent_with_acks_all() -> None:
    settings = producer_settings("127.0.0.1:9092", 10.0)
    assert settings["acks"] == "all"
    assert settings["enable_idempotence"] is True
    assert settings["request_timeout_ms"] == 10_000
    assert isinstance(settings["partitioner"], KeylessSticky)
