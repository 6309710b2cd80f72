"""Attacks on the emit stage's state and on the instance rules, on the real broker.

Issue 13, items 3 and 10. Instances `tenant-a` and `tenant-b` share the bucket `uploads` with
those prefixes and accept every source (the default); `other` takes `other-bucket` and only
`s3` and `gcs`. Each attack is a delivery published to the raw topic with its `source`
header, as a bridge publishes it once it has authenticated that provider: the attacker holds
a valid credential of ONE provider (MinIO, Supabase, B2, Box, Appwrite, another Azure storage
account). Then the real provider's change follows on the same raw partition, and the test
reads what each instance's output and stale topics hold: the real change emitted, nothing of
the attack where it does not belong.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from support.kafka_io import Header, produce, produce_to, raw, read_topic
from support.payloads import (
    appwrite_body,
    azure_event,
    b2_body,
    box_body,
    gcs_pull,
    gcs_resource,
    minio_body,
    s3_body,
    s3_record,
    sns_envelope,
    supabase_insert,
)
from support.stream import Stream as BaseStream
from support.stream import running_worker
from support.worker import Topology, Worker, wait_for

from streams.core.delivery import Delivery
from streams.core.event import FileEvent
from streams.core.normalizers import normalize
from streams.core.ordering import mark_for
from streams.core.partitioning import partition_for
from streams.engine.topics import MARKS_TABLE, SEEN_TABLE, changelog_topic, ensure_topics, topology

pytestmark = pytest.mark.kafka

INSTANCES: list[dict[str, Any]] = [
    {"name": "tenant-a", "bucket": "uploads", "prefix": "tenant-a"},
    {"name": "tenant-b", "bucket": "uploads", "prefix": "tenant-b"},
    {"name": "other", "bucket": "other-bucket", "sources": ["s3", "gcs"]},
]
ARM = "/subscriptions/0000/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts"


class Stream(BaseStream):
    def events(self, instance: str, tag: str) -> list[dict[str, Any]]:
        found = [read.json() for read in self.read(self.names.output(instance))]
        return [event for event in found if tag in event["key"]]

    def stale(self, instance: str, tag: str) -> list[dict[str, Any]]:
        found = [read.json() for read in self.read(self.names.stale(instance))]
        return [event for event in found if tag in event["key"]]

    def wait_for_event(self, instance: str, key: str, event_id: str) -> None:
        wait_for(
            lambda: any(e["id"] == event_id for e in self.events(instance, key)),
            60,
            f"{event_id} of {key} on {instance}'s output",
            interval_s=0.3,
        )


@pytest.fixture(scope="module")
def stream(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stream]:
    workdir = tmp_path_factory.mktemp("attack-worker")
    with running_worker(kafka_bootstrap, INSTANCES, workdir) as (names, worker):
        yield Stream(kafka_bootstrap, names, worker)


def events_of(value: bytes, headers: Sequence[Header]) -> list[FileEvent]:
    """What the product's normalizer reads in a delivery: the attack is what we think it is."""
    found = dict(headers)
    delivery = Delivery(
        source=found["source"].decode(),
        body=value,
        headers={
            name.removeprefix("header."): v.decode()
            for name, v in headers
            if name.startswith("header.")
        },
        attributes={
            name.removeprefix("attribute."): v.decode()
            for name, v in headers
            if name.startswith("attribute.")
        },
    )
    return normalize(delivery)


def only_id(delivery: tuple[bytes, Sequence[Header]]) -> str:
    [event] = events_of(*delivery)
    return event.id


def tag() -> str:
    return uuid.uuid4().hex[:10]


# --- one provider's credential against another provider's keys ---------------------------------


def test_a_minio_sequencer_of_fs_does_not_make_the_next_s3_change_stale(stream: Stream) -> None:
    key = f"tenant-a/{tag()}/report.pdf"
    first = raw(s3_body(s3_record(key, "0055AED6DCD90281E5")), "s3")
    attack = raw(minio_body(key, "F" * 64), "minio")
    real = raw(s3_body(s3_record(key, "0055AED6DCD90281F0")), "s3")
    assert [e.provider for e in events_of(*attack)] == ["minio"]
    stream.send([first, attack, real], raw_key=key)

    relative = key.removeprefix("tenant-a/")
    stream.wait_for_event("tenant-a", relative, only_id(real))
    out = stream.events("tenant-a", relative)
    # The MinIO credential may write MinIO events (tenant-a accepts every source); it cannot
    # make the S3 change that follows look older than its own sequencer.
    assert [(e["provider"], e["sequencer"]) for e in out] == [
        ("s3", "0055AED6DCD90281E5"),
        ("minio", "F" * 64),
        ("s3", "0055AED6DCD90281F0"),
    ]
    assert stream.stale("tenant-a", relative) == []
    assert stream.events("tenant-b", relative) == [] and stream.events("other", relative) == []


def test_a_supabase_event_dated_9999_does_not_make_real_changes_stale(stream: Stream) -> None:
    key = f"tenant-a/{tag()}/avatar.png"
    attack = raw(supabase_insert(key, "9999-12-31T00:00:00+00:00", version="v-attack"), "supabase")
    real_s3 = raw(s3_body(s3_record(key, "0055AED6DCD90281E5")), "s3")
    # The provider's own next change: an honest time, long before 9999.
    real_supabase = raw(
        supabase_insert(key, "2026-11-30T00:09:00+00:00", version="v-real"), "supabase"
    )
    assert [e.time and e.time.year for e in events_of(*attack)] == [9999]
    stream.send([attack, real_s3, real_supabase], raw_key=key)

    relative = key.removeprefix("tenant-a/")
    stream.wait_for_event("tenant-a", relative, only_id(real_supabase))
    out = stream.events("tenant-a", relative)
    assert [e["id"] for e in out] == [only_id(attack), only_id(real_s3), only_id(real_supabase)]
    assert stream.stale("tenant-a", relative) == []


def test_a_b2_event_id_equal_to_an_s3_change_s_id_does_not_make_it_a_duplicate(
    stream: Stream,
) -> None:
    key = f"tenant-a/{tag()}/invoice.pdf"
    real = raw(s3_body(s3_record(key, "0055AED6DCD90281E5")), "s3")
    s3_id = only_id(real)
    attack = raw(b2_body(key, s3_id), "b2")
    assert [(e.provider, e.id) for e in events_of(*attack)] == [("b2", s3_id)]
    sentinel = raw(s3_body(s3_record(key, "0055AED6DCD90281F0")), "s3")
    stream.send([attack, real, sentinel], raw_key=key)

    relative = key.removeprefix("tenant-a/")
    stream.wait_for_event("tenant-a", relative, only_id(sentinel))
    out = stream.events("tenant-a", relative)
    assert [(e["provider"], e["id"]) for e in out] == [
        ("b2", s3_id),
        ("s3", s3_id),  # the real change: neither a duplicate nor stale
        ("s3", only_id(sentinel)),
    ]
    assert stream.stale("tenant-a", relative) == []


def test_two_azure_storage_accounts_on_one_endpoint_do_not_order_against_each_other(
    stream: Stream,
) -> None:
    key = f"tenant-a/{tag()}/blob.bin"
    high = azure_event(
        str(uuid.uuid4()), key, "0000000000000442000000000002896B", container="uploads"
    )
    low = azure_event(
        str(uuid.uuid4()), key, "00000000000004420000000000028963", container="uploads"
    )
    later = azure_event(
        str(uuid.uuid4()), key, "00000000000004420000000000028970", container="uploads"
    )
    low["topic"] = later["topic"] = f"{ARM}/secondaccount"
    stream.send([raw(json.dumps(event), "azure") for event in (high, low, later)], raw_key=key)

    relative = key.removeprefix("tenant-a/")
    stream.wait_for_event("tenant-a", relative, later["id"])
    assert [e["id"] for e in stream.events("tenant-a", relative)] == [
        high["id"],
        low["id"],
        later["id"],
    ]
    # Within one account, order still holds: an older event of `secondaccount` is stale.
    older = azure_event(
        str(uuid.uuid4()), key, "00000000000004420000000000028960", container="uploads"
    )
    older["topic"] = f"{ARM}/secondaccount"
    stream.send([raw(json.dumps(older), "azure")], raw_key=key)
    wait_for(lambda: stream.stale("tenant-a", relative), 60, "the older event on the stale topic")
    assert [e["id"] for e in stream.stale("tenant-a", relative)] == [older["id"]]


# --- sources: a bucket-less or foreign provider's credential against a bound instance ---------


def test_an_instance_with_sources_takes_no_other_provider_s_deliveries(stream: Stream) -> None:
    name = tag()
    file_id = str(int(uuid.uuid4().int % 10**11))
    attacks = [
        raw(box_body(file_id, str(uuid.uuid4())), "box"),  # names no bucket: passes the bucket rule
        appwrite_body(f"f{name}", "other-bucket"),
        raw(minio_body(f"{name}/x.bin", "0055AED6DCD90281E5", bucket="other-bucket"), "minio"),
    ]
    buckets = [e.bucket for attack in attacks for e in events_of(*attack)]
    assert buckets == [None, "other-bucket", "other-bucket"]
    before = stream.worker.metric(
        "storage_events_filtered_total", instance="other", reason="source"
    )
    real = raw(
        s3_body(s3_record(f"{name}/x.bin", "0055AED6DCD90281F0", bucket="other-bucket")), "s3"
    )
    stream.send([*attacks, real], raw_key=name)

    stream.wait_for_event("other", f"{name}/x.bin", only_id(real))
    found = [read.json() for read in stream.read(stream.names.output("other"))]
    mine = [e for e in found if name in e["key"] or e["key"] in (file_id, f"f{name}")]
    assert [(e["provider"], e["key"]) for e in mine] == [("s3", f"{name}/x.bin")]
    after = stream.worker.wait_metric(
        "storage_events_filtered_total", before + 3, instance="other", reason="source"
    )
    assert after == before + 3


# --- dot segments --------------------------------------------------------------------------


def test_keys_climbing_out_of_the_prefix_reach_no_tenant(stream: Stream) -> None:
    name = tag()
    escapes = [
        f"tenant-a/../tenant-b/{name}/dotdot",
        f"tenant-a/%2e%2e/tenant-b/{name}/encoded",
        f"tenant-a/..%2Ftenant-b%2F{name}%2Fslash",
        f"tenant-a/x\\..\\..\\tenant-b\\{name}\\backslash",
    ]
    deliveries = [
        raw(s3_body(s3_record(urllib.parse.quote_plus(key, safe="/"), f"00{i}1")), "s3")
        for i, key in enumerate(escapes)
    ]
    assert [e.key for d in deliveries for e in events_of(*d)] == escapes  # S3 decodes them
    gcs_name = f"tenant-a/x/../../tenant-b/{name}/gcs"
    deliveries.append(
        gcs_pull(gcs_resource(gcs_name, "1700000000000001", bucket="uploads"), "OBJECT_FINALIZE")
    )
    before = stream.worker.metric(
        "storage_events_filtered_total", instance="tenant-a", reason="prefix-escape"
    )
    inside = f"tenant-a/{name}/sub/../kept"
    control = raw(s3_body(s3_record(inside, "0055AED6DCD90281F0")), "s3")
    stream.send([*deliveries, control], raw_key=name)

    stream.wait_for_event("tenant-a", f"{name}/sub/../kept", only_id(control))
    assert [e["key"] for e in stream.events("tenant-a", name)] == [f"{name}/sub/../kept"]
    assert stream.events("tenant-b", name) == []
    stream.worker.wait_metric(
        "storage_events_filtered_total", before + 5, instance="tenant-a", reason="prefix-escape"
    )


def test_absolute_keys_after_the_prefix_reach_no_tenant(stream: Stream) -> None:
    """Issue 31, item 2: through MinIO's route, `tenant-a//etc/cron.d/pwn` was emitted to
    tenant-a as `/etc/cron.d/pwn`, which a consumer joining keys to its root writes at the
    root of the file system; `\\`, a drive and a UNC path likewise on Windows."""
    name = tag()
    absolute = [
        f"tenant-a//etc/cron.d/{name}",
        f"tenant-a/\\Windows\\{name}",
        f"tenant-a/C:{name}",
        f"tenant-a/\\\\server\\share\\{name}",
    ]
    deliveries = [
        raw(minio_body(urllib.parse.quote_plus(key), f"17C0DE{i:010X}"), "minio")
        for i, key in enumerate(absolute)
    ]
    assert [e.key for d in deliveries for e in events_of(*d)] == absolute  # MinIO decodes them
    before = stream.worker.metric(
        "storage_events_filtered_total", instance="tenant-a", reason="prefix-escape"
    )
    control = raw(minio_body(f"tenant-a/{name}/kept", "17C0DEFFFFFFFFFF"), "minio")
    stream.send([*deliveries, control], raw_key=name)

    stream.wait_for_event("tenant-a", f"{name}/kept", only_id(control))
    assert [e["key"] for e in stream.events("tenant-a", name)] == [f"{name}/kept"]
    assert stream.events("tenant-b", name) == []
    stream.worker.wait_metric(
        "storage_events_filtered_total", before + 4, instance="tenant-a", reason="prefix-escape"
    )


# --- upgrade: state written with the keys of before scopes --------------------------------------


def test_state_written_before_scopes_still_dedupes_and_orders(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The changelogs hold what the stream wrote before scopes (`default/<id>` with an
    expiry, `default/<bucket>/<key>` with a mark); the new worker restores them, then a
    redelivery of an old change is a duplicate and an older change of an old key is stale."""
    names = Topology()
    config = names.config()
    settings = names.settings()
    name = tag()
    s3_key, azure_key = f"old/{name}/s3.bin", f"old/{name}/azure.bin"
    old_s3 = raw(s3_body(s3_record(s3_key, "0055AED6DCD9028200")), "s3")
    old_azure_event = azure_event(str(uuid.uuid4()), azure_key, "0000000000000442000000000002896B")
    old_azure = raw(json.dumps(old_azure_event), "azure")
    seen: list[tuple[int, bytes, bytes]] = []
    marks: list[tuple[int, bytes, bytes]] = []
    for delivery in (old_s3, old_azure):
        [event] = events_of(*delivery)
        legacy_key = f"default/{event.bucket or ''}/{event.key}".encode()
        partition = partition_for(legacy_key, 2)
        seen.append(
            (partition, f"default/{event.id}".encode(), f"{time.time() + 3600:.3f}".encode())
        )
        marks.append((partition, legacy_key, orjson.dumps(mark_for(event).to_json())))

    async def as_the_old_worker_left_it() -> None:
        await ensure_topics(kafka_bootstrap, topology(settings))
        await produce_to(kafka_bootstrap, changelog_topic(settings, SEEN_TABLE), seen)
        await produce_to(kafka_bootstrap, changelog_topic(settings, MARKS_TABLE), marks)

    asyncio.run(as_the_old_worker_left_it())
    worker = Worker(kafka_bootstrap, config, tmp_path / "worker").start()
    try:
        older_s3 = raw(s3_body(s3_record(s3_key, "0055AED6DCD90281E5")), "s3")
        newer_s3 = raw(s3_body(s3_record(s3_key, "0055AED6DCD9028300")), "s3")
        newer_azure_event = azure_event(
            str(uuid.uuid4()), azure_key, "0000000000000442000000000002897A"
        )
        redelivered_s3 = raw(sns_envelope(old_s3[0], "redelivery"), "s3")
        asyncio.run(
            produce(
                kafka_bootstrap,
                names.raw,
                [redelivered_s3, older_s3, newer_s3],
                key=s3_key.encode(),
            )
        )
        asyncio.run(
            produce(
                kafka_bootstrap,
                names.raw,
                [old_azure, raw(json.dumps(newer_azure_event), "azure")],
                key=azure_key.encode(),
            )
        )
        worker.wait_metric("storage_events_emitted_total", 2)
        worker.wait_metric("storage_events_duplicates_total", 2)
        worker.wait_metric("storage_events_stale_total", 1)
    finally:
        assert worker.stop() == 0, worker.tail()
    out = [
        read.json() for read in asyncio.run(read_topic(kafka_bootstrap, names.output("default")))
    ]
    emitted = sorted(e["id"] for e in out if name in e["key"])
    assert emitted == sorted([only_id(newer_s3), newer_azure_event["id"]])
    stale = [
        read.json() for read in asyncio.run(read_topic(kafka_bootstrap, names.stale("default")))
    ]
    assert [e["id"] for e in stale] == [only_id(older_s3)]
