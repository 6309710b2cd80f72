"""A deleted key's ordering mark is forgotten after its grace, on the real broker.

Two instances with the default grace (each one's `dedupe_ttl`): `brief` with a grace of
4 s, `kept` with one of an hour. For both, a create and then a newer delete of one key. The
`kept` key's late create (older than its delete) goes to the stale topic, within the grace.
The `brief` key's record is tombstoned on the `keys` changelog by the sweeper once its grace
is over (awaited). Then a second worker restores from the changelogs into an empty state
directory (what the changelogs hold is all it knows) and a late create older than the
delete is emitted for `brief` as if new, while one for `kept` is still stale.

The upgrade: marks in the format of a previous version (no time to be forgotten), under
scoped and pre-scope keys, are moved into `keys` records, stamped by the sweeper and then
tombstoned; a live key's is moved and left alone.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from functools import partial
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from support.kafka_io import Read, produce, raw, read_topic
from support.payloads import s3_body, s3_record
from support.worker import Topology, Worker, wait_for

from streams.config import Settings
from streams.core.emitting import mark_key
from streams.core.event import FileEvent
from streams.core.keystate import decode
from streams.core.ordering import Mark
from streams.engine.topics import (
    KEYS_TABLE,
    MARKS_TABLE,
    changelog_topic,
    ensure_topics,
    topology,
)

pytestmark = pytest.mark.kafka

INSTANCES = [
    {"name": "brief", "bucket": "brief-bucket", "dedupe_ttl": "4s"},
    {"name": "kept", "bucket": "kept-bucket", "dedupe_ttl": "1h"},
]
CREATE, LATE, LATER_LATE, DELETE = (
    "0055AED6DCD9028100",
    "0055AED6DCD9028200",
    "0055AED6DCD9028250",
    "0055AED6DCD9028300",
)


def send(bootstrap: str, names: Topology, bucket: str, key: str, *changes: str) -> None:
    """S3 notifications of `key` in order (one raw key: read in this order)."""
    deliveries = [
        raw(
            s3_body(
                s3_record(
                    key,
                    sequencer,
                    "ObjectRemoved:Delete" if sequencer == DELETE else "ObjectCreated:Put",
                    bucket=bucket,
                )
            ),
            "s3",
        )
        for sequencer in changes
    ]
    asyncio.run(produce(bootstrap, names.raw, deliveries, key=key.encode()))


def sequencers(bootstrap: str, topic: str, key: str) -> list[tuple[str, str]]:
    found = [read.json() for read in asyncio.run(read_topic(bootstrap, topic))]
    return [(event["type"], event["sequencer"]) for event in found if event["key"] == key]


def changelog(bootstrap: str, topic: str, key: bytes) -> list[Read]:
    return [read for read in asyncio.run(read_topic(bootstrap, topic)) if read.key == key]


def test_a_deleted_keys_mark_is_forgotten_after_its_grace(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    names = Topology()
    config = names.config(INSTANCES, extra="dedupe_sweep_interval_s = 0.5")
    marks_topic = changelog_topic(names.settings(INSTANCES), KEYS_TABLE)
    brief_key, kept_key = f"gone-{uuid.uuid4().hex[:8]}", f"kept-{uuid.uuid4().hex[:8]}"

    def mark_of(instance: str, bucket: str, key: str) -> bytes:
        item = FileEvent(id="s3:x", type="created", key=key, bucket=bucket, provider="s3")
        return mark_key(instance, item, "s3")

    brief_mark = mark_of("brief", "brief-bucket", brief_key)
    kept_mark = mark_of("kept", "kept-bucket", kept_key)

    def tombstoned() -> bool:
        history = changelog(kafka_bootstrap, marks_topic, brief_mark)
        return bool(history) and history[-1].value is None

    first = Worker(kafka_bootstrap, config, tmp_path / "first").start()
    try:
        send(kafka_bootstrap, names, "brief-bucket", brief_key, CREATE, DELETE)
        send(kafka_bootstrap, names, "kept-bucket", kept_key, CREATE, DELETE, LATE)
        # Within the grace: the late create is older than the delete, so it is stale.
        wait_for(
            lambda: sequencers(kafka_bootstrap, names.stale("kept"), kept_key),
            60,
            "the kept key's late create on the stale topic",
        )
        assert sequencers(kafka_bootstrap, names.stale("kept"), kept_key) == [("created", LATE)]
        wait_for(tombstoned, 60, "the brief key's mark tombstoned on the changelog", 0.5)
        history = changelog(kafka_bootstrap, marks_topic, brief_mark)
        assert b"deleted" in (history[-2].value or b"")  # the delete's mark, then forgotten
        assert sequencers(kafka_bootstrap, names.output("brief"), brief_key) == [
            ("created", CREATE),
            ("deleted", DELETE),
        ]
        kept_history = changelog(kafka_bootstrap, marks_topic, kept_mark)
        assert b"deleted" in (kept_history[-1].value or b"")  # within its grace: kept
    finally:
        assert first.stop() == 0, first.tail()

    # A fresh state directory: what the changelog holds is all there is.
    second = Worker(kafka_bootstrap, config, tmp_path / "second").start()
    try:
        send(kafka_bootstrap, names, "brief-bucket", brief_key, LATE)
        send(kafka_bootstrap, names, "kept-bucket", kept_key, LATER_LATE)
        wait_for(
            lambda: (
                ("created", LATE) in sequencers(kafka_bootstrap, names.output("brief"), brief_key)
            ),
            60,
            "the brief key's late create on the output",
        )
        wait_for(
            lambda: (
                ("created", LATER_LATE)
                in sequencers(kafka_bootstrap, names.stale("kept"), kept_key)
            ),
            60,
            "the kept key's second late create on the stale topic",
        )
        assert sequencers(kafka_bootstrap, names.output("brief"), brief_key) == [
            ("created", CREATE),
            ("deleted", DELETE),
            ("created", LATE),  # older than the delete, delayed past the grace: emitted
        ]
        assert sequencers(kafka_bootstrap, names.stale("brief"), brief_key) == []
        assert sequencers(kafka_bootstrap, names.output("kept"), kept_key) == [
            ("created", CREATE),
            ("deleted", DELETE),
        ]
        assert sequencers(kafka_bootstrap, names.stale("kept"), kept_key) == [
            ("created", LATE),
            ("created", LATER_LATE),
        ]
    finally:
        assert second.stop() == 0, second.tail()


def test_marks_written_before_marks_expired_are_stamped_then_forgotten(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The upgrade: a `marks` changelog as the previous versions wrote it (no time to be
    forgotten; scoped and pre-scope keys). The new worker moves each mark into its key's
    `keys` record and tombstones it in `marks`; the sweeper stamps the deleted keys' records,
    tombstones them a grace later, and leaves the live key's record as it was moved."""
    names = Topology()
    instances = [{"name": "default", "dedupe_ttl": "3s"}]
    config = names.config(instances, extra="dedupe_sweep_interval_s = 0.5")
    settings = names.settings(instances)
    marks_topic = changelog_topic(settings, MARKS_TABLE)
    keys_topic = changelog_topic(settings, KEYS_TABLE)
    deleted = Mark("aws-sequencer", (DELETE.ljust(64, "0"),), 1.8e9, "s3:x", "deleted")
    live = Mark("aws-sequencer", (CREATE.ljust(64, "0"),), 1.8e9, "s3:y", "created")
    old_deleted = json.dumps(deleted.to_json()).encode()
    assert b"forget_at" not in old_deleted  # the previous version's format
    scoped, legacy = b"default|s3|uploads/old-deleted", b"default/uploads/old-deleted-legacy"
    live_key = b"default|s3|uploads/old-live"
    old_live = json.dumps(live.to_json()).encode()
    asyncio.run(
        as_the_old_worker_left_it(
            kafka_bootstrap,
            settings,
            [(scoped, old_deleted), (legacy, old_deleted), (live_key, old_live)],
        )
    )

    def history(topic: str, key: bytes) -> list[bytes | None]:
        return [read.value for read in changelog(kafka_bootstrap, topic, key)]

    def tombstoned(key: bytes) -> bool:
        return history(keys_topic, key)[-1:] == [None]

    worker = Worker(kafka_bootstrap, config, tmp_path / "upgraded").start()
    try:
        for key in (scoped, legacy):
            wait_for(partial(tombstoned, key), 60, f"{key!r} stamped, then tombstoned", 0.5)
            values = history(keys_topic, key)
            moved, stamped = decode(values[0]).mark, decode(values[-2]).mark
            assert moved == deleted  # as it was in `marks`
            assert stamped is not None and stamped.type == "deleted"
            assert stamped.forget_at is not None
        for key, value in ((scoped, old_deleted), (legacy, old_deleted), (live_key, old_live)):
            assert history(marks_topic, key) == [value, None]  # moved, then tombstoned
        [moved_live] = history(keys_topic, live_key)
        assert decode(moved_live).mark == live
    finally:
        assert worker.stop() == 0, worker.tail()


async def as_the_old_worker_left_it(
    bootstrap: str, settings: Settings, marks: list[tuple[bytes, bytes]]
) -> None:
    """The stream's topics, and `marks` on partition 0 of the marks changelog, as a worker
    of the previous version wrote them."""
    await ensure_topics(bootstrap, topology(settings))
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in marks:
            await producer.send_and_wait(
                changelog_topic(settings, MARKS_TABLE), value, key=key, partition=0
            )
    finally:
        await producer.stop()
