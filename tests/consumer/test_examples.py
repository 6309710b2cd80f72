"""The examples do what fileevents/README.md says, against the real broker (and Redis, and
moto's S3 for the re-read example)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
import redis.asyncio as redis
from consumer_support import create_topics, event, produce_events, run_until, unique
from support.redis_server import RedisServer
from support.worker import ROOT, free_port

from fileevents import FileEvents, RedisDedupeStore

if str(ROOT) not in sys.path:  # `python -m pytest` has it; a bare `pytest` may not
    sys.path.insert(0, str(ROOT))

from examples import reread_truth, send_email, sqlite_upsert

pytestmark = pytest.mark.kafka


def records_done(events: FileEvents, count: int) -> bool:
    return sum(events.outcomes.values()) >= count


def test_sqlite_upsert_is_idempotent(kafka_bootstrap: str, tmp_path: Path) -> None:
    instance = unique("sqlite")
    db = tmp_path / "files.sqlite"
    a1, b2, a3 = event("a.txt", 1), event("b.txt", 2), event("a.txt", 3, "deleted")

    async def scenario() -> None:
        await create_topics(kafka_bootstrap, (f"files.events.{instance}", 2))
        await produce_events(kafka_bootstrap, f"files.events.{instance}", [a1, b2, a3, b2])
        events = sqlite_upsert.build(kafka_bootstrap, instance, unique("group"), db)
        events.handle_signals = False
        await run_until(events, lambda: records_done(events, 4), "4 records")

    asyncio.run(scenario())
    connection = sqlite3.connect(db)
    assert connection.execute("select bucket, key, size, updated_by from files").fetchall() == [
        ("uploads", "b.txt", 12, b2.id)
    ]
    # Applying every event once more (a redelivery) changes nothing.
    before = connection.execute("select * from file_events order by id").fetchall()
    for item in (a1, b2, a3):
        sqlite_upsert.apply(connection, item)
    assert connection.execute("select * from file_events order by id").fetchall() == before
    assert len(before) == 3


def test_send_email_sends_once_per_change(
    kafka_bootstrap: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    instance = unique("mail")
    outbox = tmp_path / "outbox.txt"
    first, second = event("report.pdf", 1), event("report.pdf", 2)

    async def scenario() -> None:
        await create_topics(kafka_bootstrap, (f"files.events.{instance}", 2))
        await produce_events(
            kafka_bootstrap, f"files.events.{instance}", [first, first, second, first]
        )
        client = redis.Redis.from_url(redis_server.url)
        try:
            store = RedisDedupeStore(client, prefix=unique("sent") + ":")
            events = send_email.build(
                kafka_bootstrap, instance, unique("group"), store, outbox, timedelta(hours=1)
            )
            events.handle_signals = False
            await run_until(events, lambda: records_done(events, 4), "4 records")
        finally:
            await client.aclose()

    asyncio.run(scenario())
    lines = outbox.read_text().splitlines()
    assert [line.rsplit(" ", 1)[-1] for line in lines] == [first.id, second.id]


@pytest.fixture
def s3() -> Iterator[Any]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{port}",
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
    finally:
        server.stop()


def test_reread_truth_reports_the_object_as_it_is_now(
    kafka_bootstrap: str, s3: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    instance = unique("truth")
    s3.create_bucket(Bucket="uploads")
    s3.put_object(Bucket="uploads", Key="tenant-a/kept.txt", Body=b"twelve bytes")
    kept, gone = event("kept.txt", 1), event("gone.txt", 2)  # gone.txt: deleted since

    async def scenario() -> None:
        await create_topics(kafka_bootstrap, (f"files.events.{instance}", 1))
        await produce_events(kafka_bootstrap, f"files.events.{instance}", [kept, gone])
        events = reread_truth.build(
            kafka_bootstrap, instance, unique("group"), s3, prefix="tenant-a/"
        )
        events.handle_signals = False
        await run_until(events, lambda: records_done(events, 2), "2 records")

    asyncio.run(scenario())
    # Two keys: handled concurrently, so printed in either order.
    lines = sorted(
        (json.loads(line) for line in capsys.readouterr().out.splitlines()),
        key=lambda line: line["key"] != "kept.txt",
    )
    assert [(line["key"], line["said"], line["now"]["exists"]) for line in lines] == [
        ("kept.txt", "created", True),
        ("gone.txt", "created", False),
    ]
    assert lines[0]["now"]["size"] == 12
