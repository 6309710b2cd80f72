"""The stream job on the real broker: dedupe, per-key order, tenant isolation, dead letters.

One worker serves the tests of this module. Each test uses its own keys and publishes its
deliveries with one raw-topic key, so they are read in order; each ends with a sentinel
change of the same object key, which is emitted only after every delivery before it was
handled (one key is one partition, handled in order).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from support.kafka_io import Read, raw
from support.payloads import (
    azure_event,
    gcs_pull,
    gcs_push,
    gcs_resource,
    s3_body,
    s3_record,
    sns_envelope,
)
from support.stream import Stream as BaseStream
from support.stream import running_worker
from support.worker import wait_for

pytestmark = pytest.mark.kafka

INSTANCES = [
    {"name": "default"},
    {"name": "tenant-a", "bucket": "shared", "prefix": "tenant-a"},
    {"name": "tenant-b", "bucket": "shared", "prefix": "/tenant-b/"},
]


class Stream(BaseStream):
    def events(self, instance: str = "default", key: str | None = None) -> list[dict[str, object]]:
        found = [read.json() for read in self.read(self.names.output(instance))]
        return [event for event in found if key is None or event["key"] == key]

    def stale(self, instance: str = "default", key: str | None = None) -> list[Read]:
        found = self.read(self.names.stale(instance))
        return [read for read in found if key is None or read.json()["key"] == key]

    def wait_for_event(self, instance: str, key: str, sequencer: str) -> None:
        wait_for(
            lambda: any(event["sequencer"] == sequencer for event in self.events(instance, key)),
            60,
            f"{key} {sequencer} on {instance}'s output",
            interval_s=0.3,
        )


@pytest.fixture(scope="module")
def stream(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stream]:
    workdir = tmp_path_factory.mktemp("stream-worker")
    with running_worker(kafka_bootstrap, INSTANCES, workdir) as (names, worker):
        yield Stream(kafka_bootstrap, names, worker)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_one_change_delivered_many_ways_comes_out_once(stream: Stream) -> None:
    key = unique("dupes/a b")
    encoded = key.replace(" ", "+")
    put = s3_body(s3_record(encoded, "0055AED6DCD90281E5"))
    sentinel = s3_body(s3_record(encoded, "0055AED6DCD90281F9"))
    resource = gcs_resource(unique("gcs/obj"), "1700000000000001")
    gcs_sentinel = gcs_resource(resource["name"], "1700000000000099")
    stream.send(
        [
            raw(put, "s3"),  # S3 -> SQS
            raw(put, "s3", transport="sqs"),  # SQS redelivery
            raw(sns_envelope(put, "msg-1"), "s3"),  # S3 -> SNS -> SQS
            raw(sns_envelope(put, "msg-2"), "s3"),  # ... redelivered with a new id
            raw(sentinel, "s3"),
        ],
        raw_key=key,
    )
    stream.send(
        [
            gcs_pull(resource, "OBJECT_FINALIZE"),
            gcs_push(resource, "OBJECT_FINALIZE", "111"),
            gcs_push(resource, "OBJECT_FINALIZE", "222"),
            gcs_pull(gcs_sentinel, "OBJECT_FINALIZE"),
        ],
        raw_key=resource["name"],
    )

    stream.wait_for_event("default", key, "0055AED6DCD90281F9")
    stream.wait_for_event("default", resource["name"], "1700000000000099")
    s3_events = stream.events(key=key)
    assert [event["sequencer"] for event in s3_events] == [
        "0055AED6DCD90281E5",
        "0055AED6DCD90281F9",
    ]
    gcs_events = stream.events(key=resource["name"])
    assert [event["sequencer"] for event in gcs_events] == ["1700000000000001", "1700000000000099"]


def test_an_older_event_goes_to_the_stale_topic_not_the_output(stream: Stream) -> None:
    s3_key = unique("order/s3")
    newer_delete = s3_body(s3_record(s3_key, "0055AED6DCD9028200", "ObjectRemoved:Delete"))
    older_create = s3_body(s3_record(s3_key, "0055AED6DCD90281E5"))  # shorter? same width
    longer_sentinel = s3_body(s3_record(s3_key, "0055AED6DCD902820001"))  # right-padded compare
    azure_key = unique("order/azure")
    newer = azure_event(str(uuid.uuid4()), azure_key, "0000000000000442000000000002896B", False)
    older = azure_event(str(uuid.uuid4()), azure_key, "00000000000004420000000000028963")
    azure_sentinel = azure_event(str(uuid.uuid4()), azure_key, "0000000000000442000000000002897A")
    gcs_name = unique("order/gcs")
    gcs_new = gcs_resource(gcs_name, "1700000000000200")
    gcs_old = gcs_resource(gcs_name, "1700000000000100")
    gcs_sentinel = gcs_resource(gcs_name, "1700000000000300")

    stream.send(
        [raw(newer_delete, "s3"), raw(older_create, "s3"), raw(longer_sentinel, "s3")],
        raw_key=s3_key,
    )
    stream.send(
        [raw(json.dumps([event]), "azure") for event in (newer, older, azure_sentinel)],
        raw_key=azure_key,
    )
    stream.send(
        [
            gcs_pull(gcs_new, "OBJECT_FINALIZE"),
            gcs_pull(gcs_old, "OBJECT_FINALIZE"),
            gcs_pull(gcs_sentinel, "OBJECT_FINALIZE"),
        ],
        raw_key=gcs_name,
    )

    stream.wait_for_event("default", s3_key, "0055AED6DCD902820001")
    stream.wait_for_event("default", azure_key, "0000000000000442000000000002897A")
    stream.wait_for_event("default", gcs_name, "1700000000000300")

    s3_out = stream.events(key=s3_key)
    assert [(e["type"], e["sequencer"]) for e in s3_out] == [
        ("deleted", "0055AED6DCD9028200"),
        ("created", "0055AED6DCD902820001"),
    ]
    azure_out = stream.events(key=azure_key)
    assert [e["id"] for e in azure_out] == [newer["id"], azure_sentinel["id"]]
    gcs_out = stream.events(key=gcs_name)
    assert [e["sequencer"] for e in gcs_out] == ["1700000000000200", "1700000000000300"]

    for key, stale_sequencer in (
        (s3_key, "0055AED6DCD90281E5"),
        (azure_key, "00000000000004420000000000028963"),
        (gcs_name, "1700000000000100"),
    ):
        stale = stream.stale(key=key)
        assert [read.json()["sequencer"] for read in stale] == [stale_sequencer]
        assert b"older" in stale[0].headers["stale.reason"]


def test_tenants_on_one_bucket_see_only_their_own_keys(stream: Stream) -> None:
    tag = uuid.uuid4().hex[:8]
    keys = [
        f"tenant-a/{tag}/a.txt",
        f"tenant-b/{tag}/b.txt",
        f"tenant-ab/{tag}/ab.txt",
        f"tenant-a{tag}.txt",
    ]
    records = [
        s3_record(key, f"00{index}0000000000000001", bucket="shared")
        for index, key in enumerate(keys)
    ]
    other_bucket = s3_record(f"tenant-a/{tag}/other-bucket.txt", "0099", bucket="elsewhere")
    sentinels = [
        s3_record(f"tenant-{name}/{tag}/zz-sentinel", "0100", bucket="shared")
        for name in ("a", "b")
    ]
    stream.send([raw(s3_body(*records, other_bucket, *sentinels), "s3")], raw_key=tag)

    stream.wait_for_event("tenant-a", f"{tag}/zz-sentinel", "0100")
    stream.wait_for_event("tenant-b", f"{tag}/zz-sentinel", "0100")

    # Keys of one delivery spread over partitions: wait for each tenant's own keys, then
    # compare the whole set (a leaked key would have been emitted in the same batch).
    def keys_of(instance: str) -> set[str]:
        return {str(e["key"]) for e in stream.events(instance) if tag in str(e["key"])}

    wait_for(lambda: f"{tag}/a.txt" in keys_of("tenant-a"), 60, "tenant-a's a.txt")
    wait_for(lambda: f"{tag}/b.txt" in keys_of("tenant-b"), 60, "tenant-b's b.txt")
    assert keys_of("tenant-a") == {f"{tag}/a.txt", f"{tag}/zz-sentinel"}
    assert keys_of("tenant-b") == {f"{tag}/b.txt", f"{tag}/zz-sentinel"}
    # The catch-all instance gets every key, on its own partitions: wait for it too.
    wait_for(
        lambda: f"tenant-ab/{tag}/ab.txt" in keys_of("default"), 60, "default's tenant-ab key"
    )  # every bucket, no prefix
    # Issue 33: `filtered` counts for the instances whose bucket and prefix hold an event
    # (its candidates) only: tenant-b's keys, the other bucket's, are never tenant-a's to count.
    for reason in ("bucket", "prefix"):
        filtered = stream.worker.metric(
            "storage_events_filtered_total", instance="tenant-a", reason=reason
        )
        assert filtered == 0


def test_a_malformed_delivery_is_dead_lettered_and_the_stream_goes_on(stream: Stream) -> None:
    key = unique("after/bad")
    garbage = b"\x00\xffnot json at all" + uuid.uuid4().bytes
    good = s3_body(s3_record(key, "0055AED6DCD90281E5"))
    stream.send(
        [
            (garbage, [("source", b"s3"), ("delivery-id", b"d-1")]),
            raw(b"{}", "no-such-source"),
            raw(good, "s3"),
        ],
        raw_key=key,
    )

    stream.wait_for_event("default", key, "0055AED6DCD90281E5")
    dead = stream.read(stream.names.dead_letter)
    by_value = {read.value: read for read in dead}
    assert garbage in by_value
    letter = by_value[garbage]
    assert letter.headers["error.stage"] == b"normalize"
    assert b"not JSON" in letter.headers["error"]
    assert letter.headers["delivery-id"] == b"d-1"
    assert letter.headers["error.topic"] == stream.names.raw.encode()
    assert any(b"unknown source" in read.headers["error"] for read in dead)
