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

The restore reads with a confluent_kafka.Consumer of its own (`restore_config`: assigned
partitions, no group joined, nothing committed), its blocking calls in a thread. Its end is
the last stable offset: with `isolation.level=read_committed` librdkafka's ListOffsets
(`get_watermark_offsets(cached=False)`) answers the LSO as the high watermark, and its fetcher
reports `_PARTITION_EOF` when its fetch position reaches the LSO (rdkafka_request.c,
rdkafka_fetcher.c) - past the commit marker that ends the last transaction, which is never
handed over as a record.

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
import contextlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import rocksdict
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as RdTopicPartition

from streams.core.records import OutRecord
from streams.core.state import OFFSET_KEY as OFFSET_KEY  # re-exported: tests, benchmarks
from streams.core.state import Revision as Revision
from streams.engine.binding import Binding, fetch_binding, mismatch, read_binding, write_binding
from streams.engine.librdkafka import librdkafka_log
from streams.engine.outcomes import Acknowledged
from streams.kafka_settings import KafkaSettings

log = logging.getLogger(__name__)

RESTORE_BATCH = 10_000
"""Records one `consume` of the restore hands over at most (one write batch per partition)."""
RESTORE_POLL_S = 0.05
"""How long one `consume` of the restore collects records: librdkafka's consume returns when
it has RESTORE_BATCH records or this time passed (rdkafka_queue.c), so it is also what the
restore may wait after its last record before it sees the partition's end."""
RESTORE_FETCH_BACKOFF_MS = 10
"""How long librdkafka postpones a partition's next fetch while its queue holds more than
queued.min.messages: short, so that a drained queue is fetched again at once."""
RESTORE_CALL_TIMEOUT_S = 30.0
"""One ListOffsets (the changelogs' ends) answered within this, or the restore fails and its
caller retries, as for any other Kafka error."""
RESTORE_GROUP = "storage-events-restore"
"""The consumer's group.id when the changelogs' names give no app id (confluent-kafka wants
one; the restore assigns partitions and never joins it nor commits)."""
CHANGELOG_SUFFIX = "-changelog"
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


def restore_config(kafka: KafkaSettings | str, group: str) -> dict[str, Any]:
    """librdkafka properties of the restore's consumer: `read_committed` (an aborted batch's
    changelog records are never state), the end reported (`enable.partition.eof`), nothing
    committed, and the stored offset read again from the beginning when retention passed it.

    `group` is only named, never joined (partitions are assigned), but librdkafka looks its
    coordinator up all the same (FindCoordinator needs Describe on it): the app's own group,
    which the worker's ACLs grant (streams.acls)."""
    return {
        **KafkaSettings.of(kafka).librdkafka_config(),
        "client.id": "storage-events-restore",
        "group.id": group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",  # the stored offset may be past retention
        "enable.partition.eof": True,
        "max.partition.fetch.bytes": 2 * 1024 * 1024,
        "fetch.max.bytes": 8 * 1024 * 1024,
        "receive.message.max.bytes": 8 * 1024 * 1024 + 512,  # at least fetch.max.bytes + 512
        # A partition's queue past queued.min.messages (100,000) postpones its next fetch by
        # this (librdkafka's default: 1 s); the restore drains such a queue in well under
        # that, then sat idle waiting for the rest (runs of empty `consume`s in the worker).
        "fetch.queue.backoff.ms": RESTORE_FETCH_BACKOFF_MS,
        "logger": librdkafka_log(),  # its lines through the log, never raw on stderr
    }


def restore_group(changelogs: Mapping[str, str]) -> str:
    """The app's own group (`<app_id>`), from its changelogs' names (table -> topic
    `<app_id>-<table>-changelog`, streams.engine.topics.changelog_topic), else RESTORE_GROUP."""
    for table, topic in changelogs.items():
        suffix = f"-{table}{CHANGELOG_SUFFIX}"
        if topic.endswith(suffix) and len(topic) > len(suffix):
            return topic[: -len(suffix)]
    return RESTORE_GROUP


def _ends(consumer: Consumer, places: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """Each partition's last stable offset (blocking: ListOffsets in the consumer's
    read_committed isolation)."""
    return {
        place: int(
            consumer.get_watermark_offsets(
                RdTopicPartition(*place), timeout=RESTORE_CALL_TIMEOUT_S, cached=False
            )[1]
        )
        for place in places
    }


@dataclass(slots=True)
class _Restoring:
    """What one `consume` brought of one partition being restored."""

    reader: ExpiryReader | None
    items: dict[bytes, bytes | None] = field(default_factory=dict)
    last: int = -1


def _restore_error(
    message: Message, error: KafkaError, remaining: dict[tuple[str, int], int]
) -> None:
    """An event among the restore's records: its end (the partition leaves `remaining`),
    a partition's error (raised), or the client's own news (logged)."""
    place = (message.topic() or "", message.partition() or 0)
    if error.code() == KafkaError._PARTITION_EOF:
        # The fetch position reached the last stable offset (the message's offset).
        if place in remaining and (message.offset() or 0) >= remaining[place]:
            del remaining[place]
        return
    if error.fatal() or message.topic() is not None:
        # A partition's error (authorization, unknown topic, an unreadable batch): its state
        # cannot be restored, and the caller's retry says so again.
        raise KafkaException(error)
    # The client's own news (a broker away, reconnecting): librdkafka goes on trying.
    log.info("restoring state: %s", error.str())


def _fetch(
    consumer: Consumer, places: list[tuple[str, int]]
) -> tuple[list[Message], list[RdTopicPartition]]:
    """One `consume` of the restore and the positions of `places` after it (blocking: one
    thread call, so that the loop applies one batch while the next is fetched)."""
    messages = consumer.consume(RESTORE_BATCH, RESTORE_POLL_S)
    return messages, consumer.position([RdTopicPartition(*place) for place in places])


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

    def _apply_restored(
        self,
        messages: list[Message],
        places: Mapping[tuple[str, int], tuple[str, int]],
        remaining: dict[tuple[str, int], int],
        expiry_of: Mapping[str, ExpiryReader],
        now: float,
    ) -> int:
        """Write one `consume`'s records of the partitions still being restored, one write
        batch per database with the offset reached; a partition whose end was reached is
        taken out of `remaining`. Returns the records read.

        One pass, its lookups once per run of one partition's records (librdkafka hands them
        over in such runs), not per record: the restore's own cost per record."""
        found: dict[tuple[str, int], _Restoring] = {}
        total = 0
        topic: str | None = None
        partition: int | None = None
        current: _Restoring | None = None
        for message in messages:
            error = message.error()
            if error is not None:
                _restore_error(message, error, remaining)
                topic = partition = current = None  # a partition may have ended
                continue
            if message.topic() != topic or message.partition() != partition:
                topic, partition = message.topic(), message.partition()
                place = (topic or "", partition or 0)
                current = found.get(place)
                if current is None and place in remaining:
                    current = found[place] = _Restoring(expiry_of.get(places[place][0]))
            if current is None:
                continue
            total += 1
            current.last = message.offset() or 0
            key = message.key()
            if key is None:
                continue
            value = message.value()
            if value is not None and current.reader is not None:
                expires_at = current.reader(value)
                if expires_at is not None and expires_at <= now:
                    value = None
            current.items[key] = value
        for place, restoring in found.items():
            self.apply(
                {places[place]: restoring.items},
                [Acknowledged(place[0], place[1], restoring.last, 1)],
            )
            if place in remaining and restoring.last + 1 >= remaining[place]:
                del remaining[place]
        return total

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
        self.bind(current)
        self.open(partitions)
        places = {
            (self._changelogs[table], partition): (table, partition)
            for table in self._changelogs
            for partition in partitions
        }
        if not places:
            return Restored(0, 0, 0.0)
        config = restore_config(kafka, restore_group(self._changelogs))
        consumer = await asyncio.to_thread(Consumer, config)
        fetching: asyncio.Future[tuple[list[Message], list[RdTopicPartition]]] | None = None
        total = 0
        try:
            ends = await asyncio.to_thread(_ends, consumer, list(places))
            remaining: dict[tuple[str, int], int] = {}
            starts: list[RdTopicPartition] = []
            for place, (table, partition) in places.items():
                stored = self.changelog_offset(table, partition)
                start = stored + 1 if stored is not None else 0
                if start >= ends[place]:
                    continue
                starts.append(
                    RdTopicPartition(*place, OFFSET_BEGINNING if stored is None else start)
                )
                remaining[place] = ends[place]
            if starts:
                await asyncio.to_thread(consumer.assign, starts)
            now = time.time()
            if remaining:
                fetching = asyncio.ensure_future(
                    asyncio.to_thread(_fetch, consumer, list(remaining))
                )
            while remaining and fetching is not None:
                messages, positions = await fetching
                # The next batch is fetched while this one is written (RocksDB, on the loop).
                fetching = asyncio.ensure_future(
                    asyncio.to_thread(_fetch, consumer, list(remaining))
                )
                total += self._apply_restored(messages, places, remaining, expiry_of, now)
                for position in positions:
                    place = (position.topic, position.partition)
                    if position.offset >= 0 and position.offset >= remaining.get(place, 0):
                        remaining.pop(place, None)
                if messages:
                    await asyncio.sleep(0)  # let /metrics and heartbeats in between
        finally:
            if fetching is not None:  # the consumer is closed once no call is on it
                with contextlib.suppress(Exception):  # its records are past the ends
                    await fetching
            await asyncio.to_thread(consumer.close)
        return Restored(len(partitions), total, time.monotonic() - started)
