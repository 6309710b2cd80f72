"""Kafka never acknowledges (nothing listens at the broker address): an authentic delivery is
answered 503 within the publish timeout, so the provider delivers it again."""

from __future__ import annotations

import asyncio
import socket
import time

from aiohttp.test_utils import TestClient, TestServer
from support.webhook_signing import settings_for

from connectors.publisher import RawPublisher
from connectors.webhook import create_app


def test_authentic_delivery_gets_503_quickly_when_kafka_does_not_acknowledge() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"  # bound, never listening
        settings = settings_for(
            dead,
            "test.webhook.down",
            {"routes": {"minio": {"secret_env": "MINIO_TOKEN"}}},
            publish_timeout_s=1.0,
        )

        async def go() -> tuple[list[int], float, dict[str, bool]]:
            publisher = RawPublisher(dead, settings.webhook.raw_topic, 1.0)
            app = create_app(settings, publisher, {"MINIO_TOKEN": "t0ken"})
            async with TestClient(TestServer(app, host="127.0.0.1")) as client:
                started = time.monotonic()
                statuses = []
                for _ in range(2):
                    async with client.post(
                        "/hooks/minio",
                        data=b'{"Records":[]}',
                        headers={"Authorization": "Bearer t0ken"},
                    ) as response:
                        statuses.append(response.status)
                elapsed = time.monotonic() - started
                async with client.get("/healthz") as response:
                    health = await response.json()
            return statuses, elapsed, health

        statuses, elapsed, health = asyncio.run(go())
    assert statuses == [503, 503]
    assert elapsed < 5.0
    assert health == {"ok": True, "kafka": False}
