"""The README's consumer, as the README shows it (tests/integration/test_first_hour_run.py
compares the two): print every change of the `default` instance as a handler sees it.

    python -m examples.first_consumer        # with `make run` going; `make send` makes a change

Kafka: the `KAFKA_*` variables when set, else the stack `make run` runs, wherever its ports
are (fileevents.localstack), else 127.0.0.1:9092. The in-memory dedupe store forgets on exit, so
a restarted consumer handles what it had not committed again; several processes of one group
share what they handled only through Redis (`RedisDedupeStore`, as in
examples/send_email.py).
"""

import asyncio
import logging
from datetime import timedelta

from fileevents import FileEvent, FileEvents, MemoryDedupeStore

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

events = FileEvents(
    instance="default",  # reads files.events.default, which `make run` creates
    group_id="first-consumer",
    dedupe=MemoryDedupeStore(),  # skips an id the group already handled, within dedupe_ttl
    dedupe_ttl=timedelta(hours=24),
)  # Kafka: the KAFKA_* variables, else the stack `make run` runs, else 127.0.0.1:9092


@events.on("*")  # every change: "created" or "deleted" for one kind
async def show(event: FileEvent) -> None:
    print(f"{event.type} {event.key} ({event.size} bytes, event {event.id})", flush=True)


asyncio.run(events.run())  # until Ctrl-C; graceful on SIGTERM
