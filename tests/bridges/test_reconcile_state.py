"""Reconcile's default knowledge: the worker's keys changelog, and the bounded comparison.

Against the session broker: a keys changelog written in the worker's format
(streams.core.keystate records under `<instance>|<scope>|<bucket>/<key>`), with tombstones,
deleted marks, records of ids alone, other instances, buckets and scopes, partition markers
and pre-scope keys, read by `KeysChangelogKnowledge`; a worker older than per-key state (no
changelog, or an empty one, beside an output topic with events) is named. Without Kafka: the
spilled set's scope rule, and the comparison's Python memory, which does not grow with the
known set.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from support.worker import Topology

from connectors.reconcile.drift import Drift, Known, Listed, compare
from connectors.reconcile.knownset import SpilledKnown
from connectors.reconcile.stream import KeysChangelogKnowledge, StreamReadError, topic_problem
from streams.config import InstanceConfig
from streams.core.keystate import KeyState, encode
from streams.core.ordering import Mark
from streams.engine.topics import KEYS_TABLE, changelog_topic
from streams.kafka_settings import KafkaSettings

T = datetime(2026, 12, 1, tzinfo=UTC).timestamp()
NOW = datetime(2026, 12, 4, tzinfo=UTC)
INSTANCE = InstanceConfig.model_validate({"name": "photos", "bucket": "b1"})


def record(
    event_type: str | None,
    etag: str | None = "e1",
    time: float | None = T,
    token: tuple[str, ...] | None = None,
) -> bytes:
    """A keys record as the worker writes it (`None`: a record of ids alone)."""
    mark = None
    if event_type is not None:
        kind = "aws-sequencer" if token else None
        forget = T + 86400 if event_type == "deleted" else None
        mark = Mark(kind, token, time, f"id-{event_type}", event_type, forget)
    state = KeyState(mark=mark, ids=[["id-1", T + 3600]], etag=etag)
    return encode(state)


async def write(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None]]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(topic, 2, 1, topic_configs={"cleanup.policy": "compact"})]
        )
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


def knowledge(bootstrap: str, names: Topology, bucket: str | None = "b1") -> SpilledKnown:
    settings = names.settings([{"name": "photos", "bucket": bucket}])
    return KeysChangelogKnowledge(
        KafkaSettings.of(bootstrap),
        changelog_topic(settings, KEYS_TABLE),
        names.output("photos"),
        "photos",
        bucket,
        30.0,
    )()


@pytest.mark.kafka
def test_the_keys_changelog_is_what_the_stream_knows(kafka_bootstrap: str) -> None:
    names = Topology()
    topic = changelog_topic(names.settings(), KEYS_TABLE)
    records: list[tuple[bytes, bytes | None]] = [
        (b"photos|s3|b1/live.txt", record("created", '"e-live"', token=("00AB",))),
        (b"photos|s3|b1/gone.txt", record("created")),
        (b"photos|s3|b1/gone.txt", record("deleted", time=T + 10)),  # the later record wins
        (b"photos|s3|b1/tombstoned.txt", record("created")),
        (b"photos|s3|b1/tombstoned.txt", None),  # the sweep forgot it
        (b"photos|s3|b1/ids-only.txt", record(None)),
        # Two scopes of one key: the newest mark by time, whatever the order of the records.
        (b"photos|reconcile|b1/two-scopes.txt", record("created", "e-new", time=T + 60)),
        (b"photos|s3|b1/two-scopes.txt", record("deleted", time=T + 30)),
        (b"photos|s3|b1/scope-gone.txt", record("created", "e-s3", time=T + 60)),
        (b"photos|reconcile|b1/scope-gone.txt", record("deleted", time=T)),
        (b"photos|s3|b1/scope-gone.txt", None),  # only reconcile's older word is left
        (b"photos|azure@acct|b1/dir/k\xc3\xa9y.txt", record("created", "e-az")),
        (b"photos|s3|b2/other-bucket.txt", record("created")),
        (b"photo|s3|b1/other-instance.txt", record("created")),
        (b"photos-2|s3|b1/other-instance.txt", record("created")),
        (b"photos/b1/pre-scope.txt", record("created")),  # before scopes: skipped
        (b"\x00seen-ids-until", b"1767225600.0"),  # a partition's marker
        (b"\x00changelog-offset", b"12"),
    ]
    asyncio.run(write(kafka_bootstrap, topic, records))
    known = knowledge(kafka_bootstrap, names)
    try:
        found = {
            key: known.lookup(key)
            for key in (
                "live.txt",
                "gone.txt",
                "tombstoned.txt",
                "ids-only.txt",
                "two-scopes.txt",
                "scope-gone.txt",
                "dir/kéy.txt",
                "other-bucket.txt",
                "other-instance.txt",
                "pre-scope.txt",
            )
        }
        assert {key: (k.type, k.etag) for key, k in found.items() if k is not None} == {
            "live.txt": ("created", "e-live"),  # quotes stripped, as from the output topic
            "gone.txt": ("deleted", "e1"),
            "two-scopes.txt": ("created", "e-new"),
            "scope-gone.txt": ("deleted", "e1"),
            "dir/kéy.txt": ("created", "e-az"),
        }
        live = found["live.txt"]
        assert live is not None
        assert (live.token, live.time) == ("00AB", datetime.fromtimestamp(T, UTC))
        assert known.present == 3
        assert list(known.unlisted()) == []  # all three were looked up
    finally:
        known.close()
    assert not known.path.exists()


@pytest.mark.kafka
def test_a_worker_older_than_per_key_state_is_named(kafka_bootstrap: str) -> None:
    names = Topology()
    topic = changelog_topic(names.settings(), KEYS_TABLE)
    # No changelog and no output topic: the worker never ran.
    with pytest.raises(StreamReadError, match=f"keys changelog {topic} does not exist"):
        knowledge(kafka_bootstrap, names)
    # An output topic with events, no changelog: a worker before per-key state.
    event = b'{"type":"created","key":"a","bucket":"b1"}'
    asyncio.run(write(kafka_bootstrap, names.output("photos"), [(b"k", event)]))
    with pytest.raises(StreamReadError, match="predates per-key state") as raised:
        knowledge(kafka_bootstrap, names)
    assert "--known-from output" in str(raised.value)
    # An empty changelog beside it: the same.
    asyncio.run(write(kafka_bootstrap, topic, []))
    with pytest.raises(StreamReadError, match=f"keys changelog {topic} holds no record"):
        knowledge(kafka_bootstrap, names)


def test_a_topic_it_may_not_read_is_a_permission_problem() -> None:
    line = topic_problem("app-keys-changelog", 29, "keys changelog")
    assert line is not None and line.startswith(
        "not authorized to read keys changelog app-keys-changelog: this principal lacks"
    )
    assert "--component reconcile" in line


def test_the_newest_scope_wins_and_a_present_count_follows() -> None:
    known = SpilledKnown()
    try:
        known.put_mark("k", "s3", "created", "e1", T, None)
        known.put_mark("k", "reconcile", "deleted", None, T + 1, None)
        assert known.present == 0
        known.put_mark("k", "s3", "created", "e2", T + 2, None)
        assert known.present == 1
        known.put_mark("timeless", "s3", "created", "e1", None, None)
        known.put_mark("timeless", "reconcile", "deleted", None, None, None)  # written last
        assert known.present == 1
        known.put(Known("plain", "created", "e3", NOW))
        assert [k.key for k in known.unlisted()] == ["k", "plain"]
        k = known.lookup("k")
        assert k is not None and (k.type, k.etag) == ("created", "e2")
        assert [k.key for k in known.unlisted()] == ["plain"]
    finally:
        known.close()


def _listing(count: int) -> Iterator[Listed]:
    for i in range(count):
        # Every tenth key changed behind the stream's back (ETag), every 20th never notified.
        yield Listed(f"k{i:08d}{'-new' if i % 20 == 0 else ''}", f'"e{i % 10 == 0}"', 1, None)


def _compare_peak(count: int) -> tuple[int, int]:
    """Python's peak allocation of a comparison over `count` known keys (the set filled
    outside the measurement, as the changelog read fills it), and the drift found."""
    known = SpilledKnown()
    try:
        for i in range(count):
            known.put_mark(f"k{i:08d}", "s3", "created", "eFalse", T, None)
        found = 0

        def sink(drift: Drift) -> None:
            nonlocal found
            found += 1

        gc.collect()
        tracemalloc.start()
        try:
            result = compare(_listing(count), known, INSTANCE, "b1", NOW, sink)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert result.known == count and result.listed == count
        return peak, found
    finally:
        known.close()


def test_the_comparison_memory_does_not_grow_with_the_known_set() -> None:
    small, small_drift = _compare_peak(10_000)
    large, large_drift = _compare_peak(50_000)
    assert (small_drift, large_drift) == (1_500, 7_500)  # created: 5% new + 5% changed; deleted: 5%
    # Five times the keys (and the drift), the same peak: nothing is held per key (a dict
    # of 50,000 Known would be ~12 MiB).
    assert large < 2 * 1024 * 1024, (small, large)
    assert large < small * 1.5 + 256 * 1024, (small, large)
