"""Non-idempotent handler behind the Redis dedupe store: "send an email" once per change.

    python -m examples.send_email --bootstrap 127.0.0.1:9092 --instance default \
        --redis redis://127.0.0.1:6379/0 --outbox var/examples/outbox.txt

Sending an email cannot be undone or safely repeated, so the handler runs behind
`RedisDedupeStore`: an event whose id the group already handled (within `--ttl-hours`) is
skipped, and an id is recorded only after the handler succeeded. The "email" is a line
appended to `--outbox`, so you can count what was sent. What remains (a crash between the
send and the record) is discussed in fileevents/README.md, "Dedupe".
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from datetime import timedelta
from pathlib import Path

import redis.asyncio as redis

from fileevents import FileEvent, FileEvents, RedisDedupeStore


def build(
    bootstrap: str, instance: str, group: str, store: RedisDedupeStore, outbox: Path, ttl: timedelta
) -> FileEvents:
    events = FileEvents(
        bootstrap_servers=bootstrap,
        instance=instance,
        group_id=group,
        dedupe=store,
        dedupe_ttl=ttl,
    )
    outbox.parent.mkdir(parents=True, exist_ok=True)

    @events.on("created")
    async def send_email(event: FileEvent) -> None:
        with outbox.open("a") as mail:
            mail.write(
                f"To: owner@example.com | New file {event.key} ({event.size} bytes)"
                f" | event {event.id}\n"
            )

    return events


async def run(args: argparse.Namespace) -> None:
    client = redis.Redis.from_url(args.redis)
    try:
        store = RedisDedupeStore(client, prefix="examples:sent:")
        events = build(
            args.bootstrap,
            args.instance,
            args.group,
            store,
            args.outbox,
            timedelta(hours=args.ttl_hours),
        )
        await events.run()
    finally:
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    )
    parser.add_argument("--instance", default="default")
    parser.add_argument("--group", default="example-send-email")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--outbox", type=Path, default=Path("var/examples/outbox.txt"))
    parser.add_argument("--ttl-hours", type=float, default=24.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
