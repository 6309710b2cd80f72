"""The upgrade to per-key state, on the real broker: a worker of this version starts on the
changelogs a worker of the previous version wrote (`seen`: scoped dedupe ids with their
expiry; `marks`: scoped ordering marks), with an empty state directory.

What must carry over: a redelivery of a change handled before the upgrade is a duplicate (its
id is in `seen`, read in the upgrade window); an older change of a key last emitted before it is
stale (its mark moved into the key's `keys` record); a newer change is emitted. The marks
changelog is emptied by tombstones; a restart reads the moved records from `keys` alone.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import orjson
import pytest
from support.kafka_io import produce, produce_to, raw, read_topic
from support.payloads import azure_event, s3_body, s3_record, sns_envelope
from support.worker import Topology, Worker

from streams.core.delivery import Delivery
from streams.core.emitting import mark_key, seen_key
from streams.core.event import FileEvent
from streams.core.keystate import decode
from streams.core.normalizers import normalize
from streams.core.ordering import mark_for, scope
from streams.core.partitioning import partition_for
from streams.engine.topics import (
    KEYS_TABLE,
    MARKS_TABLE,
    SEEN_TABLE,
    changelog_topic,
    ensure_topics,
    topology,
)

pytestmark = pytest.mark.kafka

ACCOUNT = "/subscriptions/0000/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/acct"


def event_of(value: bytes | str, source: str) -> FileEvent:
    body = value.encode() if isinstance(value, str) else value
    [event] = normalize(Delivery(source=source, body=body))
    return event


def test_state_of_two_tables_still_dedupes_and_orders_after_the_upgrade(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    names = Topology()
    config = names.config()
    settings = names.settings()
    tag = uuid.uuid4().hex[:10]
    s3_key, azure_key = f"old/{tag}/s3.bin", f"old/{tag}/azure.bin"
    old_s3 = s3_body(s3_record(s3_key, "0055AED6DCD9028200"))
    old_azure = azure_event(str(uuid.uuid4()), azure_key, "0000000000000442000000000002896B")
    old_azure["topic"] = ACCOUNT
    seen: list[tuple[int, bytes, bytes]] = []
    marks: list[tuple[int, bytes, bytes]] = []
    moved: list[tuple[int, bytes]] = []
    for event in (event_of(old_s3, "s3"), event_of(json.dumps(old_azure), "azure")):
        partition = partition_for(f"default/{event.bucket or ''}/{event.key}".encode(), 2)
        event_scope = scope(event)
        # As the previous version wrote them: an S3 id is the provider's own (`default/<id>`),
        # an Azure one is scoped to its storage account (`default|azure@acct|<id>`).
        id_key = seen_key("default", event.id, None if event_scope == "s3" else event_scope)
        seen.append((partition, id_key, f"{time.time() + 3600:.3f}".encode()))
        key = mark_key("default", event, event_scope)
        marks.append((partition, key, orjson.dumps(mark_for(event).to_json())))
        moved.append((partition, key))

    async def as_the_previous_version_left_it() -> None:
        await ensure_topics(kafka_bootstrap, topology(settings))
        await produce_to(kafka_bootstrap, changelog_topic(settings, SEEN_TABLE), seen)
        await produce_to(kafka_bootstrap, changelog_topic(settings, MARKS_TABLE), marks)

    asyncio.run(as_the_previous_version_left_it())
    redelivered_s3 = raw(sns_envelope(old_s3, "redelivery"), "s3")
    older_s3 = raw(s3_body(s3_record(s3_key, "0055AED6DCD90281E5")), "s3")
    newer_s3 = raw(s3_body(s3_record(s3_key, "0055AED6DCD9028300")), "s3")
    older_azure = azure_event(str(uuid.uuid4()), azure_key, "0000000000000442000000000002895A")
    newer_azure = azure_event(str(uuid.uuid4()), azure_key, "0000000000000442000000000002897A")
    for item in (older_azure, newer_azure):
        item["topic"] = ACCOUNT
    worker = Worker(kafka_bootstrap, config, tmp_path / "upgraded").start()
    try:
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
                [raw(json.dumps(item), "azure") for item in (old_azure, older_azure, newer_azure)],
                key=azure_key.encode(),
            )
        )
        worker.wait_metric("storage_events_emitted_total", 2)
        worker.wait_metric("storage_events_duplicates_total", 2)
        worker.wait_metric("storage_events_stale_total", 2)
    finally:
        assert worker.stop() == 0, worker.tail()

    def read(topic: str) -> list[dict[str, object]]:
        return [r.json() for r in asyncio.run(read_topic(kafka_bootstrap, topic))]

    emitted = sorted(str(e["id"]) for e in read(names.output("default")) if tag in str(e["key"]))
    newer_ids = [event_of(newer_s3[0], "s3").id, event_of(json.dumps(newer_azure), "azure").id]
    assert emitted == sorted(newer_ids)
    stale = sorted(str(e["id"]) for e in read(names.stale("default")) if tag in str(e["key"]))
    older_ids = [event_of(older_s3[0], "s3").id, event_of(json.dumps(older_azure), "azure").id]
    assert stale == sorted(older_ids)

    # The marks moved into `keys` (then the newer changes' records), and `marks` is emptied.
    marks_log = asyncio.run(read_topic(kafka_bootstrap, changelog_topic(settings, MARKS_TABLE)))
    for _, key in moved:
        assert [r.value for r in marks_log if r.key == key][-1] is None
    keys_log = asyncio.run(read_topic(kafka_bootstrap, changelog_topic(settings, KEYS_TABLE)))
    for _, key in moved:
        history = [decode(r.value) for r in keys_log if r.key == key]
        first_mark, last_mark = history[0].mark, history[-1].mark
        assert first_mark is not None and first_mark.event_id not in newer_ids  # as moved
        assert last_mark is not None and last_mark.event_id in newer_ids

    # A restart on an empty state directory: `keys` alone orders the key now.
    again = Worker(kafka_bootstrap, config, tmp_path / "restarted").start()
    try:
        asyncio.run(produce(kafka_bootstrap, names.raw, [older_s3], key=s3_key.encode()))
        again.wait_metric("storage_events_duplicates_total", 1)  # its id is in the record
    finally:
        assert again.stop() == 0, again.tail()
