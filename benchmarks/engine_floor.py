"""A Faust app whose one agent consumes a topic and does nothing else: the engine's floor.

    BENCH_TOPIC=<topic> BENCH_APP_ID=<id> BENCH_DATA_DIR=<dir> \
        faust -A benchmarks.engine_floor worker -l info

Used by `benchmarks.pipeline`, which reads its progress from `/count` on the web port.
"""

from __future__ import annotations

import os
from typing import Any

import faust

from streams.kafka_settings import KafkaSettings

app = faust.App(
    os.environ.get("BENCH_APP_ID", "engine-floor"),
    **KafkaSettings.from_environ().faust_args(),  # KAFKA_*: address, TLS, SASL
    web_port=int(os.environ.get("BENCH_WEB_PORT", "6099")),
    consumer_auto_offset_reset="earliest",
    datadir=os.environ.get("BENCH_DATA_DIR", "var/engine-floor"),  # not the working directory
)
topic = app.topic(
    os.environ.get("BENCH_TOPIC", "bench.raw"),
    key_type=bytes,
    value_type=bytes,
    key_serializer="raw",
    value_serializer="raw",
)
consumed = 0


@app.agent(topic)
async def consume(stream: Any) -> None:
    global consumed
    async for batch in stream.take_events(2000, within=0.05):
        consumed += len(batch)


@app.page("/count")
async def count(web: Any, request: Any) -> Any:
    return web.json({"consumed": consumed})
