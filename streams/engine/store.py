"""The stream's state: RocksDB databases per table and partition, each backed by a changelog.

Three tables, co-partitioned with the repartition topic (streams.core.emitting): `keys`
(object key -> its record: ordering mark, recent ids, ETag), `seen` (dedupe ids a hot key's
record could not keep, and those recorded before per-key state -> absolute expiry) and
`marks` (the ordering marks before per-key state, moved into `keys` at a partition's
restore). Each table and partition is one RocksDB database (rocksdict, raw bytes) under
`<data_dir>/<app_id>-state/<table>-<partition>.db`, and one partition of the table's changelog
topic `<app_id>-<table>-changelog`.

Writes come per batch: once Kafka acknowledged a batch's changelog records (with its outputs,
in one transaction for exactly_once), its changes go into the database as one write batch,
together with the changelog offset they reach (`OFFSET_KEY`). On assignment, `restore` reads
each changelog partition from that offset to its end, `read_committed`, so a database that is
missing, behind or brand new ends up as the changelog says, and a transaction that was
aborted (a crashed batch) never comes back as state.

Bound to its origin (streams/engine/binding.py): the directory records the cluster id and the
changelog topics' ids it was restored from. A restore against another cluster, or against
changelog topics deleted and created again under the same names, discards the local copy
first (one log line says why) and restores it from the changelog: a stored offset means
nothing in another topic.

Bounded state: every dedupe entry carries its absolute expiry. The sweep (`revisions`, a
bounded scan that resumes where the previous turn stopped) finds entries past it; the worker
deletes them locally and writes tombstones to the changelog, whose
`compact,delete` policy with a retention of the longest TTL bounds the topic even if a sweep
never ran. A restore skips entries already expired, so it can neither bring back nor renew one.
Deleted keys' records expire the same way (`revisions`, streams.core.emitting.key_revision):
past their grace and their ids' expiry they are deleted and tombstoned, and a restore skips
them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import rocksdict
from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.core.records import OutRecord
from streams.engine.binding import Binding, fetch_binding, mismatch, read_binding, write_binding
from streams.engine.outcomes import Acknowledged
from streams.kafka_settings import KafkaSettings

log = logging.getLogger(__name__)

OFFSET_KEY = b"\x00changelog-offset"
"""Holds the last changelog offset a database contains; no state key starts with NUL."""
RESTORE_BATCH = 10_000
SWEEP_FLUSH_KEYS = 5_000
"""Deletions in a row that make a file worth compacting; a sweep that deletes this many
flushes its memtable, so the compaction can happen now rather than after later writes."""

STATE_DIR_MODE = 0o700
"""The state holds every tenant's keys: its directories are the worker's user's alone (the
files in them inherit nothing, but cannot be reached through a private directory)."""

ExpiryReader = Callable[[bytes], float | None]
"""Reads the absolute expiry (epoch seconds) out of a stored value; None if it has none."""
Writes = Mapping[tuple[str, int], Mapping[bytes, bytes | None]]
"""(table, partition) -> key -> value, or None to delete."""


def private(path: Path) -> None:
    """Make a directory the worker owns readable by its user only (STATE_DIR_MODE), whatever
    the umask it was made under; one it does not own (a volume's root) is left as it is."""
    info = path.stat()
    if info.st_uid == os.geteuid() and info.st_mode & 0o077:
        path.chmod(STATE_DIR_MODE)


@dataclass(frozen=True, slots=True)
class Revision:
    """What a sweep does to one entry: write `value`, or delete the entry (None)."""

    value: bytes | None


Reviser = Callable[[bytes, bytes], Revision | None]
"""(key, stored value) -> the entry's revision, None to keep it as it is."""


@dataclass(frozen=True, slots=True)
class Swept:
    """What one sweep turn over one database found (`StateStore.revisions`)."""

    changes: dict[bytes, bytes | None]
    """key -> the new value, None to delete (a tombstone in the changelog)"""
    read: int
    """entries read, at most the turn's `scan`"""
    finished: bool
    """whether the turn reached the database's end, so that the next starts at its beginning"""


def _open(path: Path) -> rocksdict.Rdict:
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_compression_type(rocksdict.DBCompressionType.lz4())
    # Swept ids leave tombstones over the files that hold them; by default RocksDB reclaims
    # that space only after several memtables of new writes, i.e. never after a quiet spell.
    # Compact any file that is mostly deletions (measured: 84 -> 0.5 bytes per expired id).
    options.add_compact_on_deletion_collector_factory(10_000, SWEEP_FLUSH_KEYS, 0.5)
    # 8 MiB memtables (default 64): at most 2 x 8 MiB per database, and a worker holds two
    # per partition (measured: 1M ids restored cost 49 MiB of RSS instead of 86 MiB).
    options.set_write_buffer_size(8 * 1024 * 1024)
    options.set_keep_log_file_num(3)  # RocksDB's own info logs, one more per open otherwise
    return rocksdict.Rdict(str(path), options=options)


@dataclass(frozen=True, slots=True)
class Restored:
    """What one restore read."""

    partitions: int
    records: int
    seconds: float


class StateStore:
    """The local databases of the tables, for the partitions this worker owns."""

    def __init__(self, directory: Path, changelogs: Mapping[str, str]) -> None:
        self.directory = directory
        self._changelogs = dict(changelogs)
        self._tables_by_changelog = {topic: table for table, topic in self._changelogs.items()}
        self._dbs: dict[tuple[str, int], rocksdict.Rdict] = {}
        self._cursors: dict[tuple[str, int], bytes] = {}
        """Per database, the key where the next `revisions` scan starts."""

    @property
    def tables(self) -> list[str]:
        return list(self._changelogs)

    def changelog_topic(self, table: str) -> str:
        return self._changelogs[table]

    def partitions(self) -> list[int]:
        return sorted({partition for _, partition in self._dbs})

    def open(self, partitions: Iterable[int]) -> None:
        """Open the databases of `partitions` (creating missing ones); close all others."""
        wanted = {(table, partition) for table in self._changelogs for partition in partitions}
        for place in set(self._dbs) - wanted:
            db = self._dbs.pop(place)
            try:
                db.flush()  # leaves nothing to replay from the write-ahead log at the next open
            except Exception as exc:  # rocksdict raises plain Exception (a full disk, say)
                log.warning("flushing %s-%d before closing failed: %s", *place, exc)
            db.close()
        self.directory.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
        private(self.directory)
        for table, partition in sorted(wanted - set(self._dbs)):
            self._dbs[(table, partition)] = _open(self.directory / f"{table}-{partition}.db")

    def close(self) -> None:
        self.open(())

    def _databases(self) -> list[Path]:
        """Every table database in the directory, open or not, of any partition."""
        return sorted(
            path for table in self._changelogs for path in self.directory.glob(f"{table}-*.db")
        )

    def bind(self, current: Binding) -> str | None:
        """Make the local state `current`'s: a copy written against another cluster or other
        changelog topics is deleted (closed first), so that a restore reads it all again.
        Returns why it was discarded, None when it was kept (or there was none)."""
        stored = read_binding(self.directory)
        reason = mismatch(stored, current, has_state=bool(self._databases()))
        if reason is not None:
            self.close()
            for path in self._databases():
                shutil.rmtree(path)
            log.warning(
                "local state in %s discarded, restoring it from the changelogs: %s",
                self.directory,
                reason,
            )
        if stored != current:
            if any(topic_id is None for topic_id in current.topic_ids.values()):
                log.warning(
                    "the brokers give no topic ids (Metadata v12): local state in "
                    "%s is bound to the cluster id only, not to the changelog topics",
                    self.directory,
                )
            write_binding(self.directory, current)
        return reason

    def get(self, table: str, partition: int, key: bytes) -> bytes | None:
        value: bytes | None = self._dbs[(table, partition)].get(key)
        return value

    def entries(self, table: str, partition: int, limit: int) -> list[tuple[bytes, bytes]]:
        """The first `limit` entries of `table` in `partition` (its offset key left out)."""
        found: list[tuple[bytes, bytes]] = []
        for key, value in self._dbs[(table, partition)].items():
            if not isinstance(key, bytes) or key == OFFSET_KEY:
                continue
            if len(found) >= limit:
                break
            found.append((key, bytes(value)))
        return found

    def flush(self, table: str, partition: int) -> None:
        self._dbs[(table, partition)].flush()

    def changelog_offset(self, table: str, partition: int) -> int | None:
        stored = self._dbs[(table, partition)].get(OFFSET_KEY)
        return int(stored) if stored is not None else None

    def changelog_records(self, writes: Writes) -> list[OutRecord]:
        return [
            OutRecord(self._changelogs[table], key, value, partition=partition)
            for (table, partition), items in writes.items()
            for key, value in items.items()
        ]

    def apply(self, writes: Writes, changelog: Sequence[Acknowledged] = ()) -> None:
        """Write `writes` locally, one write batch per database, each with the changelog
        offset its records reached (from `changelog`, what Kafka acknowledged)."""
        reached = {
            (self._tables_by_changelog[ack.topic], ack.partition): ack.last_offset
            for ack in changelog
            if ack.topic in self._tables_by_changelog and ack.count
        }
        for place in set(writes) | set(reached):
            if place not in self._dbs:
                # Released meanwhile (its partition moved): what was written is in the
                # changelog, which the partition's next owner restores.
                log.info("state of %s[%d] closed before a write was applied", *place)
                continue
            batch = rocksdict.WriteBatch(raw_mode=True)
            for key, value in writes.get(place, {}).items():
                if value is None:
                    batch.delete(key)
                else:
                    batch.put(key, value)
            if place in reached:
                batch.put(OFFSET_KEY, str(reached[place]).encode())
            self._dbs[place].write(batch)

    def revisions(
        self, table: str, partition: int, limit: int, revise: Reviser, scan: int | None = None
    ) -> Swept:
        """One sweep turn over `table` in `partition`: up to `limit` entries that `revise`
        changes (`seen` ids past their expiry, streams.core.emitting.seen_revision; deleted
        keys' records past their end, key_revision).

        Reads at most `scan` entries, from where the previous turn on this database stopped
        to its end (the next turn starts over), so that a sweep of a table of millions of
        entries holds the emit stage up for a bounded time, and covers it in turns."""
        place = (table, partition)
        db = self._dbs.get(place)
        found: dict[bytes, bytes | None] = {}
        if db is None:
            return Swept(found, 0, finished=True)
        start = self._cursors.pop(place, None)
        read = 0
        for key, value in db.items(from_key=start) if start is not None else db.items():
            if not isinstance(key, bytes) or key == OFFSET_KEY:
                continue
            if (scan is not None and read >= scan) or len(found) >= limit:
                self._cursors[place] = key
                return Swept(found, read, finished=False)
            read += 1
            revision = revise(key, value)
            if revision is not None:
                found[key] = revision.value
        return Swept(found, read, finished=True)

    async def restore(
        self,
        kafka: KafkaSettings | str,
        partitions: Iterable[int],
        expiry_of: Mapping[str, ExpiryReader],
    ) -> Restored:
        """Bring the databases of `partitions` up to the end of their changelogs.

        `expiry_of` names the tables whose values carry an expiry; entries already past it
        are deleted rather than restored."""
        started = time.monotonic()
        partitions = sorted(partitions)
        if not partitions:
            self.close()
            return Restored(0, 0, 0.0)
        current = await asyncio.to_thread(fetch_binding, kafka, self._changelogs.values())
        client_options = {
            **KafkaSettings.of(kafka).aiokafka_args(),
            "client_id": "storage-events-restore",
        }
        self.bind(current)
        self.open(partitions)
        places = {
            TopicPartition(self._changelogs[table], partition): (table, partition)
            for table in self._changelogs
            for partition in partitions
        }
        if not places:
            return Restored(0, 0, 0.0)
        consumer = AIOKafkaConsumer(
            **client_options,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",  # the stored offset may be past retention
            max_partition_fetch_bytes=2 * 1024 * 1024,
            fetch_max_bytes=8 * 1024 * 1024,
        )
        total = 0
        try:
            await consumer.start()
            consumer.assign(list(places))
            ends = await consumer.end_offsets(list(places))
            remaining: dict[TopicPartition, int] = {}
            for tp, (table, partition) in places.items():
                stored = self.changelog_offset(table, partition)
                start = stored + 1 if stored is not None else 0
                if start >= ends[tp]:
                    continue
                if stored is None:
                    await consumer.seek_to_beginning(tp)
                else:
                    consumer.seek(tp, start)
                remaining[tp] = ends[tp]
            consumer.pause(*(tp for tp in places if tp not in remaining))
            now = time.time()
            while remaining:
                fetched = await consumer.getmany(
                    *remaining, timeout_ms=1000, max_records=RESTORE_BATCH
                )
                for tp, records in fetched.items():
                    table, partition = places[tp]
                    reader = expiry_of.get(table)
                    items: dict[bytes, bytes | None] = {}
                    for record in records:
                        if record.key is None:
                            continue
                        value = record.value
                        if value is not None and reader is not None:
                            expires_at = reader(value)
                            if expires_at is not None and expires_at <= now:
                                value = None
                        items[record.key] = value
                    total += len(records)
                    self.apply(
                        {(table, partition): items},
                        [Acknowledged(tp.topic, tp.partition, records[-1].offset, 1)],
                    )
                    await asyncio.sleep(0)  # let /metrics and heartbeats in between
                for tp in list(remaining):
                    if await consumer.position(tp) >= remaining[tp]:
                        del remaining[tp]
        finally:
            await consumer.stop()
        return Restored(len(partitions), total, time.monotonic() - started)
