"""The stream's state in Faust tables (RocksDB through rocksdict), read and written per batch.

Faust tables give us what a Kafka state store needs: one RocksDB database per partition, a
changelog topic co-partitioned with the repartition topic, restore from that changelog on
start-up and rebalance, and readiness only after recovery. Their per-key `table[k] = v`
interface, though, costs a changelog send and a context lookup per event (see the
performance issue), and takes its partition from the "current event", which a batch does not
have. So the stream reads a partition's database directly and, once a batch's outputs are
acknowledged, writes its changes as one RocksDB write batch per partition plus the matching
changelog records, sent to that same partition.

Bounded state: every dedupe entry carries its absolute expiry. `sweep` deletes expired
entries locally and writes tombstones to the changelog, whose `compact,delete` policy with a
retention of the longest TTL bounds the topic even if a sweep never ran. A restore therefore
cannot bring back an id past its TTL, nor renew it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import rocksdict
from faust.types import TP

from streams.emitting import decode_expiry
from streams.records import OutRecord


class TableState:
    """Direct, partition-addressed access to the stores of some Faust tables."""

    def __init__(self, tables: Mapping[str, Any]) -> None:
        self._tables = dict(tables)

    def _store(self, table: str) -> Any:
        return self._tables[table].data

    def changelog_topic(self, table: str) -> str:
        name: str = self._tables[table].changelog_topic.get_topic_name()
        return name

    def get(self, table: str, partition: int, key: bytes) -> bytes | None:
        value: bytes | None = self._store(table)._db_for_partition(partition).get(key)
        return value

    def changelog_records(
        self, writes: Mapping[tuple[str, int], Mapping[bytes, bytes | None]]
    ) -> list[OutRecord]:
        return [
            OutRecord(self.changelog_topic(table), key, value, partition=partition)
            for (table, partition), items in writes.items()
            for key, value in items.items()
        ]

    def apply_local(self, writes: Mapping[tuple[str, int], Mapping[bytes, bytes | None]]) -> None:
        for (table, partition), items in writes.items():
            batch = rocksdict.WriteBatch(raw_mode=True)
            for key, value in items.items():
                if value is None:
                    batch.delete(key)
                else:
                    batch.put(key, value)
            self._store(table)._db_for_partition(partition).write(batch)

    def remember_offset(self, table: str, partition: int, offset: int) -> None:
        """Tell the store how far the changelog it holds goes, so a restart replays less."""
        self._store(table).set_persisted_offset(TP(self.changelog_topic(table), partition), offset)

    def partitions(self, table: str) -> list[int]:
        return sorted(self._store(table)._dbs)

    def expired(self, table: str, partition: int, now: float, limit: int) -> Iterator[bytes]:
        """Up to `limit` keys of `table` in `partition` whose expiry has passed."""
        store = self._store(table)
        db = store._dbs.get(partition)
        if db is None:
            return
        found = 0
        for key, value in db.items():
            if key == store.offset_key:
                continue
            expires_at = decode_expiry(value)
            if expires_at is not None and expires_at <= now:
                yield key
                found += 1
                if found >= limit:
                    return
