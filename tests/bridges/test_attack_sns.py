"""Issue 13 item 1 as an attack on the real broker, the real bridge and a real worker.

The attacker holds one validly signed SNS Notification (lifted from `files.raw`, the
dead-letter topic, or as any other subscriber of the topic): its signed `Message` names a
`tenant-a/...` key. They add a top-level `"Records": [...]` naming `tenant-b/...`, which the
signature does not cover, and

* POST it to the bridge: 401, nothing reaches the raw topic;
* write the same bytes straight onto the raw topic (as a topic writer would): the worker
  dead-letters the whole delivery, nothing reaches tenant-a's, tenant-b's or other's output;
* replay the signed message unchanged: refused once it is older than `max_message_age_s`,
  else accepted and dropped by the stream as a duplicate.

Each ends with a control delivery that IS emitted. Instances: tenant-a and tenant-b on bucket
`uploads` with those prefixes, `other` on `other-bucket`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.kafka_io import Read, produce, raw, read_topic
from support.payloads import s3_body, s3_record
from support.webhook_signing import (
    FakeHttp,
    Request,
    SnsChain,
    der,
    exchange,
    pem,
    settings_for,
    sns_chain,
    sns_message,
    write,
)
from support.worker import Topology, Worker, wait_for

from connectors.webhook_auth.base import HttpResult, Services

pytestmark = pytest.mark.kafka

INSTANCES = [
    {"name": "tenant-a", "bucket": "uploads", "prefix": "tenant-a"},
    {"name": "tenant-b", "bucket": "uploads", "prefix": "tenant-b"},
    {"name": "other", "bucket": "other-bucket"},
]
TENANTS = [instance["name"] for instance in INSTANCES]
TOPIC_ARN = "arn:aws:sns:eu-west-1:123456789012:uploads"
CERT_URL = "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-attack.pem"


@dataclass
class Stack:
    bootstrap: str
    names: Topology
    worker: Worker
    chain: SnsChain
    route: dict[str, Any]

    def read(self, topic: str) -> list[Read]:
        return asyncio.run(read_topic(self.bootstrap, topic))

    def keys(self, instance: str) -> list[str]:
        return [read.json()["key"] for read in self.read(self.names.output(instance))]

    def post(self, *bodies: bytes) -> list[int]:
        """POST each body to the bridge's /hooks/s3 (publishing to the worker's raw topic)."""
        settings = settings_for(self.bootstrap, self.names.raw, {"routes": {"s3": self.route}})
        http = FakeHttp(
            {
                CERT_URL: HttpResult(200, pem(self.chain.certificate)),
                self.chain.intermediate_url: HttpResult(200, der(self.chain.intermediate)),
            }
        )
        headers = {"x-amz-sns-message-type": "Notification", "x-amz-sns-topic-arn": TOPIC_ARN}
        requests = [Request(body, headers) for body in bodies]
        answers = asyncio.run(exchange(settings, "s3", requests, services=Services(http_get=http)))
        return [answer.status for answer in answers]

    def wait_emitted(self, instance: str, key: str) -> None:
        wait_for(lambda: key in self.keys(instance), 60, f"{key} on {instance}'s output", 0.3)


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir: Path = tmp_path_factory.mktemp("attack-sns")
    names = Topology()
    chain = sns_chain()
    route = {
        "topic_arns": [TOPIC_ARN],
        "trusted_ca_file": str(write(workdir / "root.pem", pem(chain.root))),
    }
    worker = Worker(kafka_bootstrap, names.config(INSTANCES), workdir / "worker").start()
    try:
        yield Stack(kafka_bootstrap, names, worker, chain, route)
    finally:
        assert worker.stop() == 0, worker.tail()


def unique(prefix: str) -> str:
    return f"{prefix}/{uuid.uuid4().hex[:8]}"


def notification(stack: Stack, s3_json: bytes, published: float | None = None) -> dict[str, str]:
    """A Notification signed by the test's SNS certificate, published now unless told."""
    return sns_message(
        stack.chain.key,
        CERT_URL,
        TOPIC_ARN,
        message=s3_json.decode(),
        version="2",
        timestamp=time.time() if published is None else published,
    )


def with_foreign_records(envelope: dict[str, str], key: str) -> bytes:
    """The signed envelope plus unsigned records: a deletion and a creation in tenant-b."""
    foreign = [
        s3_record(key, "00FFFFFFFFFFFFFFFF", "ObjectRemoved:Delete"),
        s3_record(key + ".exe", "00FFFFFFFFFFFFFFFF"),
    ]
    return json.dumps({**envelope, "Records": foreign}).encode()


def assert_nothing_foreign(stack: Stack, foreign: str) -> None:
    for instance in TENANTS:
        assert all(foreign not in key for key in stack.keys(instance)), instance
        stale = stack.read(stack.names.stale(instance))
        assert all(foreign.encode() not in (read.value or b"") for read in stale), instance


def test_signed_envelope_with_added_records_is_refused_by_the_bridge(stack: Stack) -> None:
    own = unique("tenant-a/report")
    foreign = unique("tenant-b/payroll")
    envelope = notification(stack, s3_body(s3_record(own, "0055AED6DCD90281E5")))
    attack = with_foreign_records(envelope, foreign)
    genuine = json.dumps(envelope).encode()

    assert stack.post(attack) == [401]
    assert stack.post(genuine) == [202]  # the control: the very envelope, as SNS signed it

    stack.wait_emitted("tenant-a", own.removeprefix("tenant-a/"))
    published = [read.value for read in stack.read(stack.names.raw)]
    assert attack not in published
    assert genuine in published
    assert_nothing_foreign(stack, foreign.removeprefix("tenant-b/"))


def test_the_same_bytes_written_onto_the_raw_topic_are_dead_lettered(stack: Stack) -> None:
    own = unique("tenant-a/invoice")
    foreign = unique("tenant-b/salaries")
    control = unique("tenant-b/control")
    envelope = notification(stack, s3_body(s3_record(own, "0055AED6DCD90281E6")))
    attack = with_foreign_records(envelope, foreign)
    # One raw key: the control is handled after the attack (one partition, in order).
    deliveries = [
        raw(attack, "s3", delivery_id="attack-1"),
        raw(s3_body(s3_record(control, "0055AED6DCD90281E7")), "s3"),
    ]
    asyncio.run(produce(stack.bootstrap, stack.names.raw, deliveries, key=b"one-raw-key"))

    stack.wait_emitted("tenant-b", control.removeprefix("tenant-b/"))
    letters = [read for read in stack.read(stack.names.dead_letter) if read.value == attack]
    assert len(letters) == 1
    assert letters[0].headers["error.stage"] == b"normalize"
    assert b"fields SNS does not send" in letters[0].headers["error"]
    assert b"Records" in letters[0].headers["error"]
    # Neither the unsigned records nor the signed Message of a tampered envelope were read.
    assert own.removeprefix("tenant-a/") not in stack.keys("tenant-a")
    assert_nothing_foreign(stack, foreign.removeprefix("tenant-b/"))
    assert stack.keys("other") == []


def test_a_replay_is_refused_when_old_and_a_duplicate_when_fresh(stack: Stack) -> None:
    old_key, fresh_key = unique("tenant-a/old"), unique("tenant-a/fresh")
    two_hours_ago = time.time() - 7200
    old = json.dumps(
        notification(stack, s3_body(s3_record(old_key, "0055AED6DCD90281E8")), two_hours_ago)
    ).encode()
    fresh = json.dumps(
        notification(stack, s3_body(s3_record(fresh_key, "0055AED6DCD90281E9")))
    ).encode()
    duplicates_before = stack.worker.metric("storage_events_duplicates_total", instance="tenant-a")

    assert stack.post(old, fresh, fresh) == [401, 202, 202]

    stack.wait_emitted("tenant-a", fresh_key.removeprefix("tenant-a/"))
    stack.worker.wait_metric(
        "storage_events_duplicates_total", duplicates_before + 1, instance="tenant-a"
    )
    keys = stack.keys("tenant-a")
    assert keys.count(fresh_key.removeprefix("tenant-a/")) == 1
    assert old_key.removeprefix("tenant-a/") not in keys
    assert old not in [read.value for read in stack.read(stack.names.raw)]
