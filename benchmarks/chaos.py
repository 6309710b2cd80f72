"""Chaos run: faults under load on the real broker, output compared with the ground truth.

    python -m benchmarks.chaos [--deliveries 50000] [--kills 5] [--rate 1000] [--keys 2000]
                               [--guarantee exactly_once|at_least_once] [--seed 7]
                               [--no-broker-restart] [--broker-signal kill|term] [--json FILE]
                               [--brokers 3 [--broker-kills 2] [--coordinator-kills 2]]

One run, on a PRIVATE local broker (dev/kafka/localkafka.py in a temporary directory on a free
port pair; nothing else is disturbed, and `KAFKA_BOOTSTRAP_SERVERS` is ignored because the run
must stop and restart its broker):

1. A workload of N raw deliveries is generated up front, deterministically from `--seed`:
   mostly S3 (bare notification or SNS envelope), plus GCS (Pub/Sub pull: data + attribute
   headers, or push envelope) and Azure (Event Grid event, array, or Storage Queue base64).
   About 30 % are redeliveries of an earlier change in another wrapper with a new transport
   id (`delivery-id`, SNS `MessageId`, Pub/Sub `messageId`); about 10 % are out-of-order
   pairs (two new changes of one key, the newer delivered first); about 1 % are malformed,
   each carrying a unique token. The ground truth is computed with the product's own
   normalizers (`streams.core.normalizers.normalize` on exactly the record a bridge would publish):
   every distinct change's event id, key and per-key order. Every redelivery must normalize to
   the same id as the first delivery of its change and every malformed one must raise
   `MalformedDelivery`, or the run stops before it starts (a workload error).
2. A producer thread writes them to the raw topic at `--rate` per second, as the bridges do
   (idempotent, acks=all, no record key, so copies of one change and changes of one key land
   on any raw partition, in any order). A record Kafka did not acknowledge is sent again, as
   a provider would redeliver it: a delivery counts as sent once acknowledged.
3. Meanwhile the worker (`faust -A streams worker`, static group membership) is SIGKILLed
   `--kills` times at random moments spread over the production window and restarted at
   once, and the broker is crashed (SIGKILL; `--broker-signal term` stops it gracefully
   instead) and restarted once under the running worker. Why a crash and not a graceful stop
   by default: on a single broker, a graceful stop makes every partition leaderless while the
   broker still takes requests, and Kafka's transaction coordinator completes a transaction
   committed in that window without writing its markers to partitions it finds leaderless
   (it takes them for deleted: TransactionMarkerChannelManager). Those records then take the
   outcome of their producer's next transaction on each partition, so one transaction can end
   up committed on one partition and aborted on another. That is a property of Kafka with
   replication factor 1, not of this stream (benchmarks/CHAOS.md, "A graceful stop of the
   only broker"); with replication factor 3 the leader moves instead (`--brokers 3`).
4. When the worker's two consumer groups (`<app id>-normalize` on the raw topic,
   `<app id>-emit` on the repartition topic) have committed the end of their topics
   (nothing left to process), the worker is stopped and the output, stale and dead-letter
   topics are read with `isolation.level=read_committed`.

Definitions used in the table:

* change: one distinct event id of the ground truth (all copies of one change share it).
* emitted: a change whose id appears in the output topic (`ce_id` header).
* duplicated: a change whose id appears more than once in the output topic; `copies` counts
  the extra records. Not a failure (see README "Processing guarantee" for why a few remain).
* legitimately stale: a change that is not emitted, but is in the stale topic, AND is older
  (by `streams.core.ordering.staleness`, the rule the stream applies) than some change of the same
  (bucket, key) that was emitted. Which of two changes of one key is emitted and which is
  stale depends on the order in which they reached the worker, and that order is free
  (deliveries are unkeyed, partitions are processed concurrently); what is not free is that
  the older one is either emitted before the newer one or set aside as stale.
* lost: a change that is neither emitted nor legitimately stale (a stale record with no newer
  emitted change of its key is a wrongful drop, so it counts as lost).
* per-key order violation: an emitted record older (`streams.core.ordering.staleness`) than the
  newest record emitted before it for the same (bucket, key), reading each output partition
  in offset order, the way a consumer would; a version-only delete does not advance the key,
  exactly as in `streams.core.emitting`.
* malformed sent / dead-lettered: malformed deliveries produced / those whose token is found
  in the dead-letter topic (any number of copies); `unexpected dead letters` are dead-letter
  records that carry no token (a valid delivery the stream failed to read).
* recovery after each kill: seconds from the SIGKILL until the restarted worker's `/ready`
  answers 200 (its tables restored, its agents running).
* broker restart: seconds the broker was down, and seconds from its return until the worker's
  committed offsets on the raw topic moved again (it resumed by itself).

On a cluster (`--brokers 3`, `make chaos CHAOS_ARGS="--brokers 3"`): the same run on a private
three-broker cluster (`localkafka.py --brokers 3`: three KRaft nodes in combined mode), the
stream's topics with replication factor 3 and min.insync.replicas 2. Instead of the single
broker's restart, the broker leading most of the stream's partitions is SIGKILLed
`--broker-kills` times (default 2) under load, each kept down until the stream has
progressed again on every partition, then restarted and waited for until it is back in every
partition's in-sync replicas (benchmarks/cluster_faults.py: which broker, and the figures:
time without progress, restart, back in sync). Between them, the broker that is the emit
producer's transaction coordinator is SIGKILLed the same way `--coordinator-kills` times
(default 2, exactly_once only): under load a transaction is open at each of these kills.
The worker SIGKILLs continue as on one broker.
A broker kill after which the stream does not progress everywhere within 180 s, or that
found no production left to measure by, fails the run.

The run fails (exit 1) on any lost change, any per-key order violation, any malformed delivery
missing from the dead-letter topic, or a workload/id inconsistency; duplicates are reported,
not failed. `--json FILE` also writes the figures as JSON (the slow test reads them).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from benchmarks.cluster_faults import (
    IN_SYNC_TIMEOUT_S,
    PROGRESS_TIMEOUT_S,
    BrokerKill,
    ClusterFaults,
)
from benchmarks.harness import (
    PrivateBroker,
    WorkerProcess,
    finish_on_sigterm,
    free_port,
    private_broker_env,
)
from dev.kafka.private import PrivateCluster
from streams.config import load_settings
from streams.core.event import FileEvent
from streams.core.normalizers import MalformedDelivery, normalize
from streams.core.ordering import Mark, mark_for, staleness
from streams.core.records import RawRecord, delivery_from_raw
from streams.engine.topics import topology
from streams.kafka_settings import KafkaSettings

BASE_TIME = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)

Header = tuple[str, bytes]


# ------------------------------------------------------------------------------ workload


@dataclass
class Change:
    """One distinct change of the ground truth."""

    source: str
    bucket: str
    key: str
    """the caller-facing key (decoded)"""
    created: bool
    token: int
    """per-key order: sequencer / generation; larger is newer"""
    index: int
    """position in the global sequence, for times and unique values"""
    event_id: str = ""


@dataclass(frozen=True)
class RawDelivery:
    value: bytes
    headers: tuple[Header, ...]
    change: int | None
    """index into Workload.changes, None for a malformed delivery"""
    token: str | None = None
    """the unique marker of a malformed delivery"""


@dataclass
class Workload:
    deliveries: list[RawDelivery] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    redeliveries: int = 0
    out_of_order_pairs: int = 0
    malformed: int = 0
    by_source: Counter[str] = field(default_factory=Counter)


def _time(index: int) -> str:
    return (BASE_TIME + dt.timedelta(milliseconds=index)).isoformat().replace("+00:00", "Z")


def _headers(source: str, transport: str, **extra: str) -> list[Header]:
    out: list[Header] = [
        ("source", source.encode()),
        ("transport", transport.encode()),
        ("delivery-id", uuid.uuid4().hex.encode()),
        ("received-at", f"{time.time():.3f}".encode()),
    ]
    out += [(name, value.encode()) for name, value in extra.items()]
    return out


def s3_delivery(change: Change, wrapper: int) -> tuple[bytes, list[Header]]:
    """Bare S3 JSON from SQS, or the same in an SNS envelope (SQS without raw delivery)."""
    obj: dict[str, Any] = {
        "key": urllib.parse.quote_plus(change.key, safe="/"),
        "sequencer": f"{change.token:018X}",
    }
    if change.created:
        obj.update(size=change.index, eTag=f"{change.index:032x}")
    record = {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "awsRegion": "us-east-1",
        "eventTime": _time(change.index),
        "eventName": "ObjectCreated:Put" if change.created else "ObjectRemoved:DeleteMarkerCreated",
        "s3": {
            "s3SchemaVersion": "1.0",
            "bucket": {"name": change.bucket, "arn": f"arn:aws:s3:::{change.bucket}"},
            "object": obj,
        },
    }
    body = json.dumps({"Records": [record]}).encode()
    if wrapper % 2 == 0:
        return body, _headers("s3", "sqs")
    envelope = {
        "Type": "Notification",
        "MessageId": str(uuid.uuid4()),
        "TopicArn": "arn:aws:sns:us-east-1:123456789012:chaos",
        "Subject": "Amazon S3 Notification",
        "Message": body.decode(),
        "Timestamp": _time(change.index + 5),
        "SignatureVersion": "1",
        "Signature": "EXAMPLE",
        "SigningCertURL": "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-0.pem",
    }
    return json.dumps(envelope).encode(), _headers("s3", "sqs" if wrapper % 4 == 1 else "webhook")


def gcs_delivery(change: Change, wrapper: int) -> tuple[bytes, list[Header]]:
    """Pub/Sub pull (data + attribute headers) or push (the envelope, as the webhook posts)."""
    generation = str(change.token)
    resource = {
        "kind": "storage#object",
        "name": change.key,
        "bucket": change.bucket,
        "generation": generation,
        "metageneration": "1",
        "size": str(change.index),
        "etag": f"C{change.index}=",
        "updated": _time(change.index),
    }
    attributes = {
        "eventType": "OBJECT_FINALIZE" if change.created else "OBJECT_DELETE",
        "payloadFormat": "JSON_API_V1",
        "bucketId": change.bucket,
        "objectId": change.key,
        "objectGeneration": generation,
        "eventTime": _time(change.index),
    }
    if wrapper % 2 == 0:
        headers = _headers("gcs", "pubsub-pull")
        headers += [(f"attribute.{name}", value.encode()) for name, value in attributes.items()]
        return json.dumps(resource).encode(), headers
    envelope = {
        "message": {
            "data": base64.b64encode(json.dumps(resource).encode()).decode(),
            "attributes": attributes,
            "messageId": str(random.getrandbits(60)),
            "publishTime": _time(change.index + 7),
        },
        "subscription": "projects/chaos/subscriptions/push",
    }
    return json.dumps(envelope).encode(), _headers("gcs", "webhook")


def azure_delivery(change: Change, wrapper: int) -> tuple[bytes, list[Header]]:
    """One Event Grid event, an array of it, or its base64 text from a Storage Queue."""
    data: dict[str, Any] = {
        "api": "PutBlob" if change.created else "DeleteBlob",
        "blobType": "BlockBlob",
        "url": f"https://chaos.blob.core.windows.net/{change.bucket}/{change.key}",
        "sequencer": f"{change.token:032X}",
    }
    if change.created:
        data.update(eTag=f"0x{change.index:015X}", contentLength=change.index)
    event = {
        "topic": "/subscriptions/0/resourceGroups/rg/providers/Microsoft.Storage/"
        "storageAccounts/chaos",
        "subject": f"/blobServices/default/containers/{change.bucket}/blobs/{change.key}",
        "eventType": "Microsoft.Storage.BlobCreated"
        if change.created
        else "Microsoft.Storage.BlobDeleted",
        "eventTime": _time(change.index),
        "id": str(uuid.UUID(int=random.Random(change.index).getrandbits(128))),
        "data": data,
        "dataVersion": "",
        "metadataVersion": "1",
    }
    form = wrapper % 3
    if form == 0:
        return json.dumps(event).encode(), _headers("azure", "webhook")
    if form == 1:
        return json.dumps([event]).encode(), _headers("azure", "webhook")
    return base64.b64encode(json.dumps(event).encode()), _headers("azure", "azure-queue")


BUILDERS: dict[str, Callable[[Change, int], tuple[bytes, list[Header]]]] = {
    "s3": s3_delivery,
    "gcs": gcs_delivery,
    "azure": azure_delivery,
}
BUCKETS = {"s3": "chaos-s3", "gcs": "chaos-gcs", "azure": "chaos-azure"}


def malformed_delivery(kind: int, token: str) -> tuple[bytes, list[Header]]:
    """A delivery the stream cannot read; `token` makes its dead letter recognisable."""
    if kind == 0:
        return f'{{"Records": [{{"chaos": "{token}"'.encode(), _headers("s3", "sqs")
    if kind == 1:
        body = {
            "Records": [{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put", "t": token}]
        }
        return json.dumps(body).encode(), _headers("s3", "webhook")
    if kind == 2:  # a Pub/Sub pull message without its attributes
        return json.dumps({"name": token}).encode(), _headers("gcs", "pubsub-pull")
    if kind == 3:
        return f"{token} is neither JSON nor base64!".encode(), _headers("azure", "azure-queue")
    if kind == 4:
        return b"\xff\xfe\x00" + token.encode() + b"\x80", _headers("s3", "sqs")
    return token.encode(), _headers("chaos-unknown-source", "webhook")


def ids_of(value: bytes, headers: Sequence[Header]) -> list[str]:
    """The event ids the product's normalizer gives for this raw record."""
    delivery = delivery_from_raw(RawRecord("raw", value, dict(headers)), None)
    return [event.id for event in normalize(delivery)]


def build_workload(count: int, keys: int, seed: int) -> Workload:
    """`count` raw deliveries with their ground truth; see the module docstring."""
    rng = random.Random(seed)
    work = Workload()
    key_state: dict[tuple[str, str], tuple[int, bool]] = {}  # (source, key) -> (token, created)
    tokens = iter(range(1000, 10**12))

    def new_change(source: str, key: str, token: int | None = None) -> Change:
        last_token, exists = key_state.get((source, key), (0, False))
        # alternate mostly: a created, sometimes created again (overwrite), then deleted
        created = not exists or rng.random() < 0.3
        change = Change(
            source,
            BUCKETS[source],
            key,
            created,
            token if token is not None else next(tokens),
            len(work.changes),
        )
        key_state[(source, key)] = (max(last_token, change.token), created)
        work.changes.append(change)
        return change

    def deliver(change_index: int, wrapper: int) -> None:
        change = work.changes[change_index]
        value, headers = BUILDERS[change.source](change, wrapper)
        ids = ids_of(value, headers)
        if len(ids) != 1:
            raise SystemExit(f"workload error: {change} gave {ids}")
        if not change.event_id:
            change.event_id = ids[0]
        elif ids[0] != change.event_id:
            raise SystemExit(
                f"normalizer gives change {change} two ids: {change.event_id} and {ids[0]}"
            )
        work.deliveries.append(RawDelivery(value, tuple(headers), change_index))
        work.by_source[change.source] += 1

    def pick_source() -> str:
        draw = rng.random()
        return "s3" if draw < 0.7 else "gcs" if draw < 0.85 else "azure"

    def pick_key(source: str) -> str:
        number = rng.randrange(keys)
        # S3 keys are form-encoded on the wire: spaces and `+` test the decoding.
        return (
            f"chaos/{number % 97:02d}/file {number:05d}+v.bin"
            if source == "s3"
            else (f"chaos/{number % 97:02d}/file-{number:05d}.bin")
        )

    while len(work.deliveries) < count:
        draw = rng.random()
        if draw < 0.01:
            token = f"chaos-malformed-{uuid.UUID(int=rng.getrandbits(128)).hex}"
            value, headers = malformed_delivery(work.malformed % 6, token)
            try:
                ids_of(value, headers)
            except MalformedDelivery:
                pass
            else:
                raise SystemExit(f"workload error: malformed kind {work.malformed % 6} parsed")
            work.deliveries.append(RawDelivery(value, tuple(headers), None, token))
            work.malformed += 1
        elif draw < 0.31 and work.changes:
            # an earlier change again, most often a recent one, in another wrapper
            back = min(len(work.changes), 1 + int(rng.expovariate(1 / 200)))
            deliver(len(work.changes) - back, rng.randrange(1, 12))
            work.redeliveries += 1
        elif draw < 0.36 and len(work.deliveries) + 2 <= count:
            source = pick_source()
            key = pick_key(source)
            older_token, newer_token = next(tokens), next(tokens)
            older = new_change(source, key, older_token)
            newer = new_change(source, key, newer_token)
            deliver(newer.index, rng.randrange(12))
            deliver(older.index, rng.randrange(12))
            work.out_of_order_pairs += 1
        else:
            source = pick_source()
            deliver(new_change(source, pick_key(source)).index, rng.randrange(12))
    return work


# ------------------------------------------------------------------------------ processes


class Producer(threading.Thread):
    """Writes the workload at a steady rate; resends what Kafka did not acknowledge."""

    def __init__(self, bootstrap: str, topic: str, deliveries: list[RawDelivery], rate: float):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.deliveries, self.rate = bootstrap, topic, deliveries, rate
        self.acknowledged = 0
        self.resent = 0
        self.errors: Counter[str] = Counter()
        self.error: BaseException | None = None
        self.producer: AIOKafkaProducer  # created in the thread's event loop

    def run(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            **plaintext(self.bootstrap),
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            request_timeout_ms=10_000,
            max_request_size=4 * 1024 * 1024,
        )

    async def _send(self, batch: list[RawDelivery]) -> None:
        pending = batch
        delay = 0.2
        while pending:
            futures = []
            failed: list[RawDelivery] = []
            for position, item in enumerate(pending):
                try:
                    future = await self.producer.send(
                        self.topic, item.value, headers=list(item.headers)
                    )
                    futures.append((item, future))
                except KafkaError as exc:
                    self.errors[type(exc).__name__] += 1
                    failed.extend(pending[position:])
                    break
            for item, future in futures:
                try:
                    await future
                    self.acknowledged += 1
                except KafkaError as exc:
                    self.errors[type(exc).__name__] += 1
                    failed.append(item)
            pending = failed
            if pending:
                # As a bridge's provider would: deliver again later. A fresh producer, since
                # aiokafka's idempotent producer does not recover from a sequence gap
                # (OutOfOrderSequenceNumber after the broker restart) by itself.
                self.resent += len(pending)
                await self.producer.stop()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                self.producer = self._new_producer()
                await self._start()

    async def _start(self) -> None:
        while True:
            try:
                await self.producer.start()
                return
            except KafkaError as exc:
                self.errors[type(exc).__name__] += 1
                await self.producer.stop()
                await asyncio.sleep(0.5)
                self.producer = self._new_producer()

    async def _run(self) -> None:
        self.producer = self._new_producer()
        await self._start()
        try:
            started = time.monotonic()
            step = max(1, int(self.rate / 50))  # ~50 sends per second, each awaited
            for first in range(0, len(self.deliveries), step):
                ahead = first / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
                await self._send(self.deliveries[first : first + step])
        finally:
            await self.producer.stop()


# ------------------------------------------------------------------------------ reading


@dataclass(frozen=True)
class Read:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]


def plaintext(bootstrap: str) -> dict[str, Any]:
    """aiokafka arguments for the private PLAINTEXT broker this run starts."""
    return KafkaSettings.of(bootstrap).aiokafka_args()


async def read_topic(bootstrap: str, topic: str) -> list[Read]:
    """Every committed record of `topic`, by partition then offset (read_committed)."""
    consumer = AIOKafkaConsumer(
        **plaintext(bootstrap),
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        max_partition_fetch_bytes=8 * 1024 * 1024,
        fetch_max_bytes=32 * 1024 * 1024,
    )
    await consumer.start()
    try:
        await consumer._client.add_topic(topic)  # track its metadata without subscribing
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        if not partitions:
            return []
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        # read_committed: the end offsets are the last stable offsets
        ends = await consumer.end_offsets(partitions)
        records: list[Read] = []
        deadline = time.monotonic() + 300
        while any([await consumer.position(tp) < ends[tp] for tp in partitions]):
            if time.monotonic() > deadline:
                raise SystemExit(f"reading {topic} did not reach its end offsets")
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                records.extend(
                    Read(m.partition, m.offset, m.key, m.value, dict(m.headers)) for m in messages
                )
        return sorted(records, key=lambda read: (read.partition, read.offset))
    finally:
        await consumer.stop()


async def group_lag(bootstrap: str, group: str, topics: Sequence[str]) -> tuple[int, int]:
    """(records not yet committed by `group` on `topics`, committed offsets of the first)."""
    admin = AIOKafkaAdminClient(**plaintext(bootstrap), request_timeout_ms=5000)
    consumer = AIOKafkaConsumer(**plaintext(bootstrap), group_id=None)
    await admin.start()
    await consumer.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
        partitions = []
        for topic in topics:
            await consumer._client.add_topic(topic)
            partitions += [
                TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()
            ]
        ends = await consumer.end_offsets(partitions)
        lag = 0
        for tp in partitions:
            meta = committed.get(tp)
            lag += ends[tp] - (meta.offset if meta is not None and meta.offset >= 0 else 0)
        first = sum(
            meta.offset
            for tp, meta in committed.items()
            if tp.topic == topics[0] and meta.offset > 0
        )
        return lag, first
    finally:
        await consumer.stop()
        await admin.close()


def lag_now(bootstrap: str, group: str, topics: Sequence[str]) -> tuple[int, int] | None:
    try:
        return asyncio.run(asyncio.wait_for(group_lag(bootstrap, group, topics), 15))
    except (KafkaError, OSError, TimeoutError):
        return None


# ------------------------------------------------------------------------------ the run


@dataclass
class Result:
    date: str = ""
    command: str = ""
    guarantee: str = ""
    deliveries: int = 0
    by_source: dict[str, int] = field(default_factory=dict)
    redeliveries: int = 0
    out_of_order_pairs: int = 0
    changes_sent: int = 0
    emitted: int = 0
    stale: int = 0
    lost: int = 0
    lost_examples: list[str] = field(default_factory=list)
    wrongly_stale: int = 0
    duplicated: int = 0
    duplicate_copies: int = 0
    order_violations: int = 0
    order_examples: list[str] = field(default_factory=list)
    malformed_sent: int = 0
    malformed_dead_lettered: int = 0
    unexpected_dead_letters: int = 0
    kills: int = 0
    recovery_s: list[float] = field(default_factory=list)
    broker_signal: str = "kill"
    broker_down_s: float | None = None
    broker_resumed_s: float | None = None
    resent_by_producer: int = 0
    brokers: int = 1
    broker_kills: list[BrokerKill] = field(default_factory=list)
    wall_s: float = 0.0
    failures: list[str] = field(default_factory=list)

    def table(self) -> str:
        recovery = ", ".join(f"{seconds:.1f}" for seconds in self.recovery_s) or "-"
        broker = (
            "not restarted"
            if self.broker_down_s is None
            else f"down {self.broker_down_s:.1f} s; worker resumed "
            + (
                f"{self.broker_resumed_s:.1f} s after it was back"
                if self.broker_resumed_s is not None
                else "NOT within 120 s"
            )
        )
        sources = ", ".join(f"{name} {count}" for name, count in sorted(self.by_source.items()))
        rows = [
            ("raw deliveries", f"{self.deliveries} ({sources}, malformed {self.malformed_sent})"),
            ("  redeliveries in another wrapper", str(self.redeliveries)),
            ("  out-of-order pairs (newer first)", str(self.out_of_order_pairs)),
            ("distinct changes sent", str(self.changes_sent)),
            ("emitted (distinct ce_id)", str(self.emitted)),
            ("legitimately stale", str(self.stale)),
            ("**lost**", f"**{self.lost}**"),
            (
                "duplicated (ce_id emitted twice or more)",
                f"{self.duplicated} ({self.duplicate_copies} extra records)",
            ),
            ("**per-key order violations**", f"**{self.order_violations}**"),
            (
                "malformed sent / dead-lettered",
                f"{self.malformed_sent} / {self.malformed_dead_lettered}",
            ),
            ("unexpected dead letters", str(self.unexpected_dead_letters)),
            (f"recovery after each of {self.kills} SIGKILLs (s)", recovery),
            (f"broker SIG{self.broker_signal.upper()} + restart under the worker", broker),
            ("raw records resent by the producer (not acknowledged)", str(self.resent_by_producer)),
            ("wall time", f"{self.wall_s:.0f} s"),
        ]
        rows = cluster_rows(self, rows)
        width = max(len(name) for name, _ in rows)
        lines = [
            f"chaos run {self.date}, guarantee {self.guarantee}: `{self.command}`",
            "",
            f"| {'measure':<{width}} | value |",
            f"|{'-' * (width + 2)}|-------|",
        ]
        lines += [f"| {name:<{width}} | {value} |" for name, value in rows]
        verdict = "PASS" if not self.failures else "FAIL: " + "; ".join(self.failures)
        lines += ["", f"result: {verdict}"]
        return "\n".join(lines)


def compare(
    work: Workload, outputs: list[Read], stale: list[Read], dead: list[Read], result: Result
) -> None:
    """Fill the figures of `result` from what the topics hold (see the module docstring)."""
    emitted_ids: Counter[str] = Counter()
    emitted_by_key: dict[tuple[str | None, str], list[FileEvent]] = defaultdict(list)
    last: dict[tuple[str | None, str], Mark] = {}
    for read in outputs:
        event = FileEvent.model_validate_json(read.value or b"null")
        emitted_ids[read.headers["ce_id"].decode()] += 1
        key = (event.bucket, event.key)
        emitted_by_key[key].append(event)
        reason = staleness(event, last.get(key))
        if reason is not None:
            result.order_violations += 1
            if len(result.order_examples) < 5:
                result.order_examples.append(f"{key}: {reason}")
        if not (event.type == "deleted" and event.version_only is True):
            last[key] = mark_for(event)
    stale_events: dict[str, FileEvent] = {}
    for read in stale:
        event = FileEvent.model_validate_json(read.value or b"null")
        stale_events[event.id] = event
    truth = {change.event_id: change for change in work.changes}
    result.changes_sent = len(truth)
    result.emitted = sum(1 for event_id in truth if event_id in emitted_ids)
    for event_id, change in truth.items():
        if event_id in emitted_ids:
            continue
        set_aside = stale_events.get(event_id)
        newer_emitted = set_aside is not None and any(
            staleness(set_aside, mark_for(other)) is not None
            for other in emitted_by_key.get((change.bucket, change.key), [])
        )
        if newer_emitted:
            result.stale += 1
            continue
        result.lost += 1
        if set_aside is not None:
            result.wrongly_stale += 1
        if len(result.lost_examples) < 5:
            result.lost_examples.append(f"{event_id} {change.source} {change.bucket}/{change.key}")
    unknown = set(emitted_ids) - set(truth)
    if unknown:
        result.failures.append(f"{len(unknown)} emitted ids not in the ground truth")
    copies = {event_id: n for event_id, n in emitted_ids.items() if n > 1}
    result.duplicated = len(copies)
    result.duplicate_copies = sum(n - 1 for n in copies.values())
    tokens = {d.token for d in work.deliveries if d.token is not None}
    found: set[str] = set()
    for read in dead:
        value = read.value or b""
        hit = next((token for token in tokens if token.encode() in value), None)
        if hit is None:
            result.unexpected_dead_letters += 1
        else:
            found.add(hit)
    result.malformed_sent = len(tokens)
    result.malformed_dead_lettered = len(found)
    if result.lost:
        result.failures.append(f"{result.lost} lost (e.g. {result.lost_examples[0]})")
    if result.order_violations:
        result.failures.append(
            f"{result.order_violations} order violations (e.g. {result.order_examples[0]})"
        )
    if result.malformed_dead_lettered != result.malformed_sent:
        result.failures.append(
            f"{result.malformed_sent - result.malformed_dead_lettered} malformed deliveries "
            "missing from the dead-letter topic"
        )


def fault_schedule(
    rng: random.Random, kills: int, broker_restart: bool, window_s: float
) -> list[tuple[float, str]]:
    """(seconds after production starts, "kill" | "broker"), spread over the window."""
    faults = ["kill"] * kills + (["broker"] if broker_restart else [])
    moments = sorted(rng.uniform(0.1 * window_s, 0.9 * window_s) for _ in faults)
    rng.shuffle(faults)
    return list(zip(moments, faults, strict=True))


# ------------------------------------------------------------------------------ on a cluster
# `--brokers 3`: the broker faults of benchmarks/cluster_faults.py instead of the single
# broker's restart; the rest of the run is the same.


def private_kafka(args: argparse.Namespace, workdir: Path) -> PrivateBroker | PrivateCluster:
    """The run's own broker, or its own cluster with `--brokers N`."""
    if args.brokers > 1:
        return PrivateCluster(workdir / "kafka", brokers=args.brokers)
    return PrivateBroker(workdir / "kafka", heap=os.environ.get("LOCAL_KAFKA_HEAP", "768m"))


def replication_settings(brokers: int) -> str:
    """The `[stream]` lines of a production cluster: 3 replicas, 2 in sync."""
    if brokers == 1:
        return ""
    return f"replication_factor = {min(brokers, 3)}\nmin_insync_replicas = 2\n"


def cluster_fault_schedule(
    rng: random.Random, kills: int, broker_kills: int, window_s: float, coordinator_kills: int = 0
) -> list[tuple[float, str]]:
    """Worker kills at random moments as on one broker; broker kills (of the leading broker,
    then of the transaction coordinator, alternating) evenly spaced from 15 % of the window,
    so that each has load to measure its failover by (each takes 30-60 s with its restart; the
    next one waits for it)."""
    faults = [(rng.uniform(0.1 * window_s, 0.9 * window_s), "kill") for _ in range(kills)]
    order = _alternate(broker_kills, coordinator_kills)
    faults += [
        (window_s * (0.15 + 0.7 * index / max(len(order), 1)), kind)
        for index, kind in enumerate(order)
    ]
    return sorted(faults)


def _alternate(leaders: int, coordinators: int) -> list[str]:
    """`broker-kill` and `coordinator-kill` in turn, the rest of the longer list last."""
    order: list[str] = []
    for index in range(max(leaders, coordinators)):
        if index < leaders:
            order.append("broker-kill")
        if index < coordinators:
            order.append("coordinator-kill")
    return order


def cluster_faults(
    broker: PrivateBroker | PrivateCluster,
    app_id: str,
    raw: str,
    config: Path,
    transactional_id: str | None,
) -> ClusterFaults | None:
    if not isinstance(broker, PrivateCluster):
        return None
    topics = [spec.name for spec in topology(load_settings(config, environ={}))]
    return ClusterFaults(broker, app_id, raw, f"{app_id}.by-key", topics, transactional_id)


def kill_a_leading_broker(
    faults: ClusterFaults | None, producer: Producer, result: Result, coordinator: bool = False
) -> None:
    """One broker kill under load (the leader of most partitions, or the emit producer's
    transaction coordinator), its figures into `result`."""
    if faults is None:
        raise SystemExit("a broker kill needs --brokers 3")
    number = len(result.broker_kills) + 1
    if not producer.is_alive():
        result.failures.append(
            f"production ended before broker kill {number}: nothing to measure its failover "
            "by (lower --rate or raise --deliveries)"
        )
        return
    kill = faults.kill_coordinator() if coordinator else faults.kill_leader()
    result.broker_kills.append(kill)
    print(f"#   broker SIGKILL {number}: {kill.describe()}", flush=True)
    if kill.no_progress_s is None:
        result.failures.append(
            f"the stream did not progress on every partition within "
            f"{PROGRESS_TIMEOUT_S:.0f} s of broker kill {number} (node {kill.node})"
        )
    elif not producer.is_alive():
        result.failures.append(
            f"production ended during broker kill {number}: its time without progress may "
            "be short of the truth (lower --rate or raise --deliveries)"
        )
    if kill.in_sync_s is None:
        result.failures.append(
            f"node {kill.node} was not back in every partition's in-sync replicas "
            f"{IN_SYNC_TIMEOUT_S:.0f} s after its restart"
        )


def cluster_rows(result: Result, rows: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The table's rows on a cluster: the broker kills instead of the single broker's restart."""
    if result.brokers == 1:
        return rows
    single = next(index for index, (name, _) in enumerate(rows) if name.startswith("broker "))
    roles = {"leader": "the leader of most partitions", "coordinator": "transaction coordinator"}
    kills = [
        (f"broker SIGKILL {number} ({roles[kill.role]})", kill.describe())
        for number, kill in enumerate(result.broker_kills, 1)
    ] or [("broker SIGKILLs", "none")]
    cluster = (
        "cluster",
        f"{result.brokers} brokers (KRaft combined mode), replication factor "
        f"{min(result.brokers, 3)}, min.insync.replicas 2",
    )
    return [cluster, *rows[:single], *kills, *rows[single + 1 :]]


def run(args: argparse.Namespace, command: str) -> Result:
    started = time.monotonic()
    result = Result(
        date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        command=command,
        guarantee=args.guarantee,
        deliveries=args.deliveries,
        kills=args.kills,
        broker_signal=args.broker_signal,
        brokers=args.brokers,
    )
    print(f"# building {args.deliveries} deliveries ...", flush=True)
    work = build_workload(args.deliveries, args.keys, args.seed)
    result.by_source = dict(work.by_source)
    result.redeliveries, result.out_of_order_pairs = work.redeliveries, work.out_of_order_pairs
    workdir = Path(tempfile.mkdtemp(prefix="chaos-"))
    broker = private_kafka(args, workdir)
    suffix = uuid.uuid4().hex[:8]
    app_id = f"chaos-{suffix}"
    raw, output, stale_topic, dead_letter = "chaos.raw", "chaos.events", "chaos.stale", "chaos.dlq"
    config = workdir / "streams.toml"
    config.write_text(
        f'[stream]\napp_id = "{app_id}"\nraw_topics = ["{raw}"]\n'
        f'repartition_topic = "{app_id}.by-key"\ndead_letter_topic = "{dead_letter}"\n'
        f'partitions = 4\nprocessing_guarantee = "{args.guarantee}"\n'
        f"{replication_settings(args.brokers)}"
        f'[[instances]]\nname = "default"\ntopic = "{output}"\nstale_topic = "{stale_topic}"\n'
    )
    what = f"cluster of {args.brokers} brokers" if args.brokers > 1 else "broker"
    print(f"# starting a private {what} in {workdir / 'kafka'} ...", flush=True)
    broker.start()
    instance_id = f"{app_id}-worker-0"
    env = private_broker_env(
        broker.bootstrap,
        STREAMS_CONFIG=str(config),
        STREAMS_DATA_DIR=str(workdir / "state"),
        STREAMS_WEB_PORT=str(free_port()),
        # Static membership: the restarted worker takes its partitions back at once.
        STREAMS_GROUP_INSTANCE_ID=instance_id,
    )
    env.pop("STREAMS_FAILPOINT", None)
    worker = WorkerProcess(env, workdir / "worker.log")
    keep = False
    try:
        worker.start()
        worker.wait_ready()
        window = args.deliveries / args.rate
        schedule = (
            cluster_fault_schedule(
                random.Random(args.seed),
                args.kills,
                args.broker_kills,
                window,
                args.coordinator_kills if args.guarantee == "exactly_once" else 0,
            )
            if args.brokers > 1
            else fault_schedule(
                random.Random(args.seed), args.kills, not args.no_broker_restart, window
            )
        )
        # The emit producer's transactional id: <app id>-emit-<group instance id>.
        faults = cluster_faults(broker, app_id, raw, config, f"{app_id}-emit-{instance_id}")
        producer = Producer(broker.bootstrap, raw, work.deliveries, args.rate)
        print(
            f"# producing for ~{window:.0f} s; faults at "
            + ", ".join(f"{moment:.1f} s {what}" for moment, what in schedule),
            flush=True,
        )
        producing_since = time.monotonic()
        producer.start()
        for moment, what in schedule:
            wait = producing_since + moment - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if what == "kill":
                worker.kill()
                killed_at = time.monotonic()
                worker.start()
                worker.wait_ready()
                result.recovery_s.append(time.monotonic() - killed_at)
                print(f"#   SIGKILL: ready again after {result.recovery_s[-1]:.1f} s", flush=True)
            elif what in ("broker-kill", "coordinator-kill"):
                kill_a_leading_broker(faults, producer, result, what == "coordinator-kill")
            else:
                assert isinstance(broker, PrivateBroker)  # one broker's restart
                before = lag_now(broker.bootstrap, f"{app_id}-normalize", [raw])
                stopped_at = time.monotonic()
                if args.broker_signal == "kill":
                    broker.kill()
                else:
                    broker.stop()
                time.sleep(args.broker_down_s)
                broker.start()
                back_at = time.monotonic()
                result.broker_down_s = back_at - stopped_at
                committed_before = before[1] if before else 0
                while time.monotonic() - back_at < 120:
                    now = lag_now(broker.bootstrap, f"{app_id}-normalize", [raw])
                    if now is not None and now[1] > committed_before:
                        result.broker_resumed_s = time.monotonic() - back_at
                        break
                    time.sleep(0.2)
                print(
                    f"#   broker restarted: down {result.broker_down_s:.1f} s, worker resumed "
                    f"after {result.broker_resumed_s} s",
                    flush=True,
                )
                if result.broker_resumed_s is None:
                    result.failures.append("the worker did not resume after the broker restart")
        producer.join()
        if producer.error is not None:
            raise SystemExit(f"the producer failed: {producer.error!r}")
        result.resent_by_producer = producer.resent
        print(f"# producer errors: {dict(producer.errors)}", flush=True)
        print("# production done; waiting for the worker to drain ...", flush=True)
        deadline = time.monotonic() + args.drain_timeout_s
        settled = 0
        while settled < 2:
            if time.monotonic() > deadline:
                result.failures.append(f"the worker did not drain within {args.drain_timeout_s} s")
                break
            if worker.process is not None and worker.process.poll() is not None:
                raise SystemExit(f"the worker exited by itself; see {worker.log}")
            lags = [
                lag_now(broker.bootstrap, f"{app_id}-normalize", [raw]),
                lag_now(broker.bootstrap, f"{app_id}-emit", [f"{app_id}.by-key"]),
            ]
            drained = all(lag is not None and lag[0] == 0 for lag in lags)
            settled = settled + 1 if drained else 0
            time.sleep(0.5)
        worker.stop()
        print("# reading the output, stale and dead-letter topics ...", flush=True)
        outputs = asyncio.run(read_topic(broker.bootstrap, output))
        stale = asyncio.run(read_topic(broker.bootstrap, stale_topic))
        dead = asyncio.run(read_topic(broker.bootstrap, dead_letter))
        compare(work, outputs, stale, dead, result)
        keep = bool(result.failures) or args.keep
    finally:
        worker.stop()
        try:
            broker.stop()
        finally:
            if keep:
                print(f"# kept {workdir} (worker.log, kafka/broker.log)", flush=True)
            else:
                shutil.rmtree(workdir, ignore_errors=True)
    result.wall_s = time.monotonic() - started
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=50_000)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument(
        "--rate", type=float, default=1000.0, help="raw deliveries per second (default 1000)"
    )
    parser.add_argument("--keys", type=int, default=2000, help="distinct object keys per source")
    parser.add_argument(
        "--guarantee", choices=["exactly_once", "at_least_once"], default="exactly_once"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-broker-restart", action="store_true")
    parser.add_argument("--broker-down-s", type=float, default=5.0)
    parser.add_argument(
        "--broker-signal",
        choices=["kill", "term"],
        default="kill",
        help="how the broker is stopped: a crash (SIGKILL, default) or a graceful stop (SIGTERM)",
    )
    parser.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="1 (default): one broker, restarted once; 3 or more: a cluster whose leading "
        "broker is SIGKILLed --broker-kills times (replication factor 3, 2 in sync)",
    )
    parser.add_argument(
        "--broker-kills", type=int, default=2, help="with --brokers 3: how many (default 2)"
    )
    parser.add_argument(
        "--coordinator-kills",
        type=int,
        default=2,
        help="with --brokers 3 and exactly_once: SIGKILLs of the emit producer's transaction "
        "coordinator, between the leader kills (default 2)",
    )
    parser.add_argument("--drain-timeout-s", type=float, default=600.0)
    parser.add_argument("--keep", action="store_true", help="keep the run's directory")
    parser.add_argument("--json", type=Path, help="also write the figures here, as JSON")
    args = parser.parse_args(argv)
    finish_on_sigterm()
    if args.brokers == 2 or args.brokers < 1:
        parser.error("--brokers: 1, or 3 or more (2 in sync of 3 survive one broker lost)")
    # aiokafka logs every refused connection while the broker is down; the table says enough.
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    command = "python -m benchmarks.chaos " + " ".join(argv if argv is not None else sys.argv[1:])
    result = run(args, command.strip())
    print(result.table(), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(result), indent=2))
    return 1 if result.failures else 0


if __name__ == "__main__":
    sys.exit(main())
