"""streams.core.partitioning: the same partitions as Kafka's default partitioner, for any key."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner, murmur2
from hypothesis import given
from hypothesis import strategies as st

from streams.core.partitioning import murmur2 as fast_murmur2
from streams.core.partitioning import partition_for


@given(st.binary(max_size=200))
def test_murmur2_equals_the_kafka_clients(key: bytes) -> None:
    assert fast_murmur2(key) == murmur2(key)


@given(st.binary(min_size=1, max_size=100), st.integers(min_value=1, max_value=500))
def test_partition_for_equals_the_default_partitioner(key: bytes, partitions: int) -> None:
    every = list(range(partitions))
    assert partition_for(key, partitions) == DefaultPartitioner()(key, every, every)


def test_a_known_java_client_value() -> None:
    # org.apache.kafka.common.utils.UtilsTest#testMurmur2: "21" hashes to -973932308.
    assert fast_murmur2(b"21") == -973932308 & 0xFFFFFFFF
