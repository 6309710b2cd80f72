"""The webhook bridge under a steady request rate while its broker is down for 30 s.

Every request answered 2xx must be in Kafka; every other one got 5xx (and is retried by the
provider until it gets a 2xx). Prints acknowledged vs published for the run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from support.kafka_io import read_topic
from support.local_broker import PrivateBroker
from support.webhook_signing import settings_for

from connectors.publisher import RawPublisher
from connectors.webhook import create_app

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

TOKEN = "t0ken"
RATE_PER_S = 20
OUTAGE_S = 30.0


def test_steady_traffic_through_a_30_s_outage(
    tmp_path: Path, chaos_report: Callable[[str], None]
) -> None:
    kafka = PrivateBroker(tmp_path / "kafka")
    bootstrap = kafka.bootstrap
    topic = "steady.raw"
    settings = settings_for(
        bootstrap,
        topic,
        {"routes": {"minio": {"secret_env": "MINIO_TOKEN"}}},
        publish_timeout_s=2.0,
    )
    answers: dict[bytes, list[int]] = {}

    async def scenario() -> None:
        publisher = RawPublisher(bootstrap, topic, 2.0)
        app = create_app(settings, publisher, {"MINIO_TOKEN": TOKEN})
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:

            async def deliver(body: bytes) -> None:
                # The provider: retry until a 2xx, as MinIO's webhook target does.
                while True:
                    async with client.post(
                        "/hooks/minio", data=body, headers={"Authorization": f"Bearer {TOKEN}"}
                    ) as r:
                        answers.setdefault(body, []).append(r.status)
                        if r.status < 300:
                            return
                    await asyncio.sleep(0.5)

            async def outage() -> None:
                await asyncio.sleep(5)
                await asyncio.to_thread(kafka.run, "stop")
                await asyncio.sleep(OUTAGE_S)
                await asyncio.to_thread(kafka.run, "start")

            deliveries = []
            outage_task = asyncio.create_task(outage())
            started = time.monotonic()
            n = 0
            while not outage_task.done() or time.monotonic() - started < OUTAGE_S + 15:
                body = f'{{"Records":[],"n":{n}}}'.encode()
                deliveries.append(asyncio.create_task(deliver(body)))
                n += 1
                await asyncio.sleep(1 / RATE_PER_S)
            await outage_task
            await asyncio.wait_for(asyncio.gather(*deliveries), 120)

    kafka.run("start")
    try:
        asyncio.run(scenario())
        published = [read.value for read in asyncio.run(read_topic(bootstrap, topic, 60))]
    finally:
        kafka.run("stop")

    acknowledged = {body for body, statuses in answers.items() if statuses[-1] < 300}
    refused = sum(status >= 500 for statuses in answers.values() for status in statuses)
    statuses = {status for statuses in answers.values() for status in statuses}
    chaos_report(
        f"webhook, {OUTAGE_S:.0f} s broker outage at {RATE_PER_S} req/s: "
        f"deliveries {len(answers)}, acknowledged {len(acknowledged)}, "
        f"published {len(set(published))} distinct ({len(published)} records), "
        f"503 answers {refused}"
    )
    assert statuses <= {202, 503}
    assert refused > 0, "the outage produced no 503 at all"
    assert acknowledged == set(answers), "every delivery is acknowledged in the end"
    assert acknowledged <= set(published), "a 2xx whose record Kafka does not hold"
