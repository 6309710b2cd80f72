"""What the stream knows per key, for the comparison with a listing.

The comparison takes any `StreamKnowledge`: a callable yielding one `Known` per key (present
or deleted, ETag, ordering token), the last word the stream gave consumers about that key, or
a ready `KnownSet` (connectors.reconcile.knownset).

`KeysChangelogKnowledge` (the default, `--known-from state`): the worker's per-key state
(streams.core.keystate), whose changelog `<app_id>-keys-changelog` is compacted per key, read
from the beginning to its end offsets at that moment with `isolation.level=read_committed`.
Its cost follows the keys the worker keeps (every instance's), not the events of the past:
no retention of the output topic matters. Of its records only this instance's, for this
bucket, are kept: Kafka key `<instance>|<scope>|<bucket>/<key>` (bucket empty for providers
without one); partition markers (`\x00...`) and keys from before scopes (`<instance>/...`)
are skipped; a tombstone forgets the key's record in that scope; a record without a mark (ids
alone) says nothing. A record's mark is the last event the worker emitted for the key in its
scope (a `deleted` that removed only a noncurrent version does not move it), its `e` that
event's ETag (quotes stripped, as from the output topic), its time the event's. Where a key
has records in several scopes, the newest mark by time wins (`knownset`). A changelog that is
missing or empty while the output topic holds events means a worker older than per-key state:
the read fails and says to use `--known-from output`.

`OutputTopicKnowledge` (`--known-from output`): the instance's output topic
(`files.events.<instance>`, or its configured `topic`), read the same way, keeping the last
event per key for this bucket. A `deleted` with `version_only: true` is skipped (a noncurrent
version went; the key lives on). It compares with exactly what consumers were told, but reads
every event the topic still holds, and needs the topic to keep every key's last event
(compaction keeps it; retention alone may not): an event that aged out makes its key look
unknown, and reconcile announces it once more. It holds the events and a dict of every key in
memory.

The two differ where the worker's state and its output can: a deleted key's mark is forgotten
after its grace (then the key reads as unknown rather than deleted: the same drift), and an
event time beyond the clock-skew bound is not recorded in the mark (a `not-listed` delete's
`last_modified` is then the previous event's time).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from connectors.reconcile.drift import Known
from connectors.reconcile.knownset import KnownSet, SpilledKnown
from streams.core.keystate import decode
from streams.core.normalizers.base import MalformedDelivery, parse_time, strip_quotes
from streams.kafka_settings import KafkaSettings, check_access

log = logging.getLogger(__name__)

StreamKnowledge = Callable[[], "Iterable[Known] | KnownSet"]
"""What the stream knows: one `Known` per key (a later one for a key replaces an earlier), or a
ready `KnownSet` (`KeysChangelogKnowledge`'s, on disk)."""

TOPIC_AUTHORIZATION_FAILED = 29
UNKNOWN_TOPIC_OR_PARTITION = 3
FETCH_MAX_BYTES = 8 * 1024 * 1024
"""One fetch response at most (aiokafka's default, 50 MiB, is held and decoded at once)."""
BATCH_RECORDS = 5_000
"""Records handed over at a time: what is held decoded is bounded, whatever the topic."""


class StreamReadError(Exception):
    """Reading what the stream knows failed, as one line."""


def last_events(values: Iterable[bytes | None], bucket: str | None) -> dict[str, Known]:
    """The last event per key among output-topic values (in offset order), for `bucket`."""
    known: dict[str, Known] = {}
    unreadable = 0
    for value in values:
        try:
            event = json.loads(value or b"")
            key, event_type = event["key"], event["type"]
            if not isinstance(key, str) or event_type not in ("created", "deleted"):
                raise ValueError("not a canonical event")
            if event.get("bucket") != bucket:
                continue
            if event_type == "deleted" and event.get("version_only") is True:
                continue  # a noncurrent version went; the key lives on
            etag, token = event.get("etag"), event.get("sequencer")
            known[key] = Known(
                key=key,
                type=event_type,
                etag=strip_quotes(etag) if isinstance(etag, str) else None,
                time=parse_time(event.get("time")),
                token=token if isinstance(token, str) else None,
            )
        except (ValueError, KeyError, TypeError, MalformedDelivery):
            unreadable += 1
    if unreadable:
        log.warning("%d output records are not canonical events; ignored", unreadable)
    return known


def topic_problem(topic: str, error_code: int, what: str = "output topic") -> str | None:
    """The one line for a topic's metadata error code (None: readable)."""
    if error_code == 0:
        return None
    if error_code == TOPIC_AUTHORIZATION_FAILED:
        return (
            f"not authorized to read {what} {topic}: this principal lacks Describe/Read "
            "on it (grant what `python -m streams acls --component reconcile` prints)"
        )
    if error_code == UNKNOWN_TOPIC_OR_PARTITION:
        return f"{what} {topic} does not exist (has the worker run with this config?)"
    return f"{what} {topic} cannot be described (Kafka error code {error_code})"


class MissingTopic(StreamReadError):
    """The topic does not exist."""


async def _partitions(kafka: KafkaSettings, topic: str, timeout_s: float, what: str) -> list[int]:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError
    from aiokafka.protocol.metadata import MetadataRequest

    admin = AIOKafkaAdminClient(**kafka.aiokafka_args(), client_id="storage-events-reconcile")
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        # This topic's metadata only, never creating it: the error code tells a topic that
        # is missing from one this principal may not describe (listing all topics cannot:
        # both are simply absent from the list).
        response = await admin._send_request(
            MetadataRequest([topic], allow_auto_topic_creation=False)
        )
        [description] = [t for t in response.to_object()["topics"] if t["topic"] == topic]
        code = int(description["error_code"])
        problem_line = topic_problem(topic, code, what)
        if problem_line is not None:
            missing = code == UNKNOWN_TOPIC_OR_PARTITION
            raise (MissingTopic if missing else StreamReadError)(problem_line)
        return sorted(int(item["partition"]) for item in description["partitions"])
    except (KafkaError, TimeoutError) as exc:
        raise StreamReadError(f"cannot reach Kafka at {kafka.bootstrap_servers}: {exc!r}") from None
    finally:
        await admin.close()


Records = Callable[[list[Any]], None]
"""Takes one fetched batch of one partition (aiokafka ConsumerRecords, in offset order)."""


async def read_topic(
    kafka: KafkaSettings | str,
    topic: str,
    timeout_s: float,
    on_records: Records,
    what: str = "output topic",
    on_total: Callable[[int], None] | None = None,
) -> int:
    """Every committed record of `topic` up to its end offsets at the start, handed to
    `on_records` batch by batch (each partition in offset order); the bytes of keys and values
    read. `on_total` learns how many offsets lie between the beginnings and the ends (the
    records to read, transaction markers and compacted gaps included). Fails when no record
    comes for `timeout_s` seconds."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.errors import KafkaError

    kafka = KafkaSettings.of(kafka)
    problem = await check_access(kafka, timeout_s)
    if problem is not None:  # a refused password or certificate: one line naming the setting
        raise StreamReadError(problem[0])
    partitions = await _partitions(kafka, topic, timeout_s, what)
    consumer = AIOKafkaConsumer(
        **kafka.aiokafka_args(),
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        client_id="storage-events-reconcile",
        fetch_max_bytes=FETCH_MAX_BYTES,
    )
    read_bytes = 0
    try:
        await asyncio.wait_for(consumer.start(), timeout_s)
        assignment = [TopicPartition(topic, partition) for partition in partitions]
        consumer.assign(assignment)
        await consumer.seek_to_beginning(*assignment)
        ends = await consumer.end_offsets(assignment)
        if on_total is not None:
            starts = await consumer.beginning_offsets(assignment)
            on_total(sum(ends[tp] - starts[tp] for tp in assignment))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            behind = [tp for tp in assignment if await consumer.position(tp) < ends[tp]]
            if not behind:
                break
            if loop.time() > deadline:
                raise StreamReadError(
                    f"reading {topic} did not reach its end: nothing came for {timeout_s} s"
                )
            batches = await consumer.getmany(*behind, timeout_ms=500, max_records=BATCH_RECORDS)
            for tp, messages in batches.items():
                kept = [message for message in messages if message.offset < ends[tp]]
                if kept:
                    deadline = loop.time() + timeout_s
                    read_bytes += sum(len(m.key or b"") + len(m.value or b"") for m in kept)
                    on_records(kept)
        return read_bytes
    except (KafkaError, TimeoutError) as exc:
        name = type(exc).__name__
        if "Authorization" in name:
            raise StreamReadError(
                f"not authorized to read {what} {topic} ({name}): grant Read on it "
                "(what `python -m streams acls --component reconcile` prints)"
            ) from None
        raise StreamReadError(f"reading {topic} failed: {exc!r}") from None
    finally:
        await consumer.stop()


async def read_output(
    kafka: KafkaSettings | str, topic: str, timeout_s: float
) -> list[bytes | None]:
    """Every committed value of `topic`, per partition in offset order, up to its end offsets."""
    values: dict[int, list[bytes | None]] = {}

    def keep(records: list[Any]) -> None:
        for record in records:
            values.setdefault(record.partition, []).append(record.value)

    await read_topic(kafka, topic, timeout_s, keep)
    return [value for partition in sorted(values) for value in values[partition]]


async def holds_records(kafka: KafkaSettings, topic: str, timeout_s: float) -> bool | None:
    """Whether `topic` holds any record (None: it does not exist)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.errors import KafkaError

    try:
        partitions = await _partitions(kafka, topic, timeout_s, "output topic")
    except MissingTopic:
        return None
    consumer = AIOKafkaConsumer(
        **kafka.aiokafka_args(), group_id=None, client_id="storage-events-reconcile"
    )
    try:
        await asyncio.wait_for(consumer.start(), timeout_s)
        assignment = [TopicPartition(topic, partition) for partition in partitions]
        starts = await consumer.beginning_offsets(assignment)
        ends = await consumer.end_offsets(assignment)
        return any(ends[tp] > starts[tp] for tp in assignment)
    except (KafkaError, TimeoutError) as exc:
        raise StreamReadError(f"reading {topic} failed: {exc!r}") from None
    finally:
        await consumer.stop()


@dataclass(frozen=True)
class OutputTopicKnowledge:
    """The last event per key of the instance's output topic, for one bucket."""

    kafka: KafkaSettings
    topic: str
    bucket: str | None
    timeout_s: float

    def __call__(self) -> Iterable[Known]:
        values = asyncio.run(read_output(self.kafka, self.topic, self.timeout_s))
        return last_events(values, self.bucket).values()


def _token(token: tuple[Any, ...] | None) -> str | None:
    if token is None:
        return None
    if len(token) == 1 and isinstance(token[0], str):
        return token[0]
    return json.dumps(list(token), separators=(",", ":"))


@dataclass
class ChangelogReader:
    """Folds keys-changelog records of one instance and bucket into a `SpilledKnown`."""

    instance: str
    bucket: str | None
    known: SpilledKnown
    records: int = 0
    """Records read (every instance's, markers and tombstones included)."""
    kept: int = 0
    """Records of this instance and bucket."""

    def __post_init__(self) -> None:
        self._prefix = f"{self.instance}|".encode()
        self._bucket = self.bucket or ""

    def __call__(self, records: list[Any]) -> None:
        for record in records:
            self.records += 1
            self.add(record.key, record.value)

    def add(self, key: bytes | None, value: bytes | None) -> None:
        # Partition markers (`\x00...`) and pre-scope keys (`<instance>/...`) fail this too.
        if not key or not key.startswith(self._prefix):
            return
        try:
            _, scope, rest = key.decode().split("|", 2)
        except ValueError:
            return
        bucket, slash, object_key = rest.partition("/")
        if not slash or bucket != self._bucket:
            return
        self.kept += 1
        if value is None:  # a tombstone: the key's record in this scope is gone
            self.known.put_mark(object_key, scope, None, None, None, None)
            return
        state = decode(value)
        mark = state.mark
        if mark is None or mark.type not in ("created", "deleted"):
            # ids alone: this scope says nothing about the object
            self.known.put_mark(object_key, scope, None, None, None, None)
            return
        etag = strip_quotes(state.etag) if state.etag is not None else None
        self.known.put_mark(
            object_key,
            scope,
            mark.type,
            etag,
            float(mark.time) if mark.time is not None else None,
            _token(mark.token),
        )


@dataclass
class KeysChangelogKnowledge:
    """What the worker's per-key state says of each key of one instance and bucket: its keys
    changelog (`<app_id>-keys-changelog`, compacted per key), read from the beginning to its
    end offsets at the start, `read_committed`, into a `SpilledKnown` (see the module's
    docstring)."""

    kafka: KafkaSettings
    topic: str
    output_topic: str
    instance: str
    bucket: str | None
    timeout_s: float
    on_records: Callable[[int], None] | None = None
    """Progress: called with the records read so far, once per fetched batch."""
    on_total: Callable[[int], None] | None = None
    """Progress: the offsets to read (an upper bound of the records)."""
    read_bytes: int = 0
    records: int = 0

    def __call__(self) -> SpilledKnown:
        known = SpilledKnown()
        reader = ChangelogReader(self.instance, self.bucket, known)

        def fold(records: list[Any]) -> None:
            reader(records)
            if self.on_records is not None:
                self.on_records(reader.records)

        try:
            self.read_bytes = asyncio.run(self._read(fold))
            self.records = reader.records
        except BaseException:
            known.close()
            raise
        return known

    async def _read(self, fold: Records) -> int:
        what = "keys changelog"
        try:
            read = await read_topic(
                self.kafka, self.topic, self.timeout_s, fold, what, self.on_total
            )
        except MissingTopic as exc:
            if await holds_records(self.kafka, self.output_topic, self.timeout_s):
                raise StreamReadError(
                    self._predates(f"{what} {self.topic} does not exist")
                ) from None
            raise StreamReadError(str(exc)) from None
        if read == 0 and await holds_records(self.kafka, self.output_topic, self.timeout_s):
            raise StreamReadError(self._predates(f"{what} {self.topic} holds no record"))
        return read

    def _predates(self, what: str) -> str:
        return (
            f"{what}, while output topic {self.output_topic} holds events: the worker predates "
            "per-key state (or has not run since its upgrade); reconcile with "
            "`--known-from output` until it has"
        )
