"""Kafka's default partitioner (murmur2 of the key, as the Java client computes it), faster.

Every keyed and output record needs its partition, and aiokafka's pure-Python murmur2 reads
the key byte by byte: about 8 µs per 50-byte key, twice per event, more than parsing the
event. This is the same function over 4-byte words (`struct.iter_unpack`), about a third of
that. Records land exactly where any Kafka client puts the same key (the tests compare it
with aiokafka's on arbitrary keys).
"""

from __future__ import annotations

import struct

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
_WORDS = struct.Struct("<I")


def murmur2(data: bytes) -> int:
    """MurmurHash2 as org.apache.kafka.common.utils.Utils.murmur2, as an unsigned 32-bit int."""
    length = len(data)
    h = _SEED ^ length
    whole = length & ~3
    for (k,) in _WORDS.iter_unpack(data[:whole]):
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    extra = length - whole
    if extra >= 3:
        h ^= data[whole + 2] << 16
    if extra >= 2:
        h ^= data[whole + 1] << 8
    if extra >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner gives `key` among `partitions`."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
