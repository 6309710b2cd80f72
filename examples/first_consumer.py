"""The README's consumer, runnable against what `make run` provides: print every change of an
instance as a handler sees it.

    python -m examples.first_consumer                                  # in-memory dedupe store
    python -m examples.first_consumer --redis redis://127.0.0.1:6379/0 # production: Redis

Kafka comes from the `KAFKA_*` variables (default 127.0.0.1:9092, the local broker of
`make run`; `KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:19093` when LOCAL_KAFKA_PORT moved it). The
in-memory store forgets on exit, so a restarted consumer handles what it had not committed
again; several processes of one group share what they handled only through Redis (the
production step: `pip install redis` comes with the project, the server is yours to run). A
store that does not answer stops it at start with one line.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from datetime import timedelta

import redis.asyncio as redis

from fileevents import (
    DedupeStore,
    DedupeStoreUnavailable,
    FileEvent,
    FileEvents,
    KafkaAccessError,
    MemoryDedupeStore,
    RedisDedupeStore,
)


def build(instance: str, group: str, dedupe: DedupeStore) -> FileEvents:
    """The consumer: one handler for every event of `instance`'s output topic."""
    events = FileEvents(
        instance=instance,  # reads files.events.<instance>, which `make run` creates
        group_id=group,
        dedupe=dedupe,  # skips an id the group already handled, within dedupe_ttl
        dedupe_ttl=timedelta(hours=24),
    )

    @events.on("*")
    async def show(event: FileEvent) -> None:
        print(f"{event.type} {event.key} ({event.size} bytes, event {event.id})", flush=True)

    return events


async def run(args: argparse.Namespace) -> None:
    client = redis.Redis.from_url(args.redis) if args.redis else None
    try:
        store = RedisDedupeStore(client) if client is not None else MemoryDedupeStore()
        await build(args.instance, args.group, store).run()  # until Ctrl-C or SIGTERM
    finally:
        if client is not None:
            await client.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instance", default="default")
    parser.add_argument("--group", default="example-first-consumer")
    parser.add_argument("--redis", help="a Redis URL: the dedupe store (default: in memory)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        asyncio.run(run(args))
    except (DedupeStoreUnavailable, KafkaAccessError) as exc:
        print(f"first_consumer: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
