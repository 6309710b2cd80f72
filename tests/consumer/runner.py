"""A consumer process for the commit tests: `python tests/consumer/runner.py --help`.

Its one handler records each event in SQLite when it starts and when it finishes, so the
test sees across processes what ran; for the event named by `--block-id` it waits, between
the two, until a line arrives on stdin (the test controls when, or never: then it kills us).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sqlite3
import sys
from datetime import timedelta
from pathlib import Path

from fileevents import EventContext, FileEvent, FileEvents

SCHEMA = """
create table if not exists runs (
    step text not null, event_id text not null, pid integer not null,
    partition integer not null, offset integer not null
)
"""


def record(db: Path, step: str, event: FileEvent, context: EventContext) -> None:
    with sqlite3.connect(db, timeout=30) as connection:
        connection.execute(
            "insert into runs values (?, ?, ?, ?, ?)",
            (step, event.id, os.getpid(), context.partition, context.offset),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--member", required=True, help="static group membership id")
    parser.add_argument("--block-id", help="the event whose handler waits for a stdin line")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(message)s")
    with sqlite3.connect(args.db) as connection:
        connection.execute(SCHEMA)

    events = FileEvents(
        bootstrap_servers=args.bootstrap,
        topic=args.topic,
        group_id=args.group,
        commit_interval=timedelta(milliseconds=50),
        # A restarted process takes its predecessor's place at once (static membership).
        consumer_config={"group_instance_id": args.member, "session_timeout_ms": 10000},
    )

    @events.on("*")
    async def handle(event: FileEvent, context: EventContext) -> None:
        record(args.db, "started", event, context)
        if event.id == args.block_id:
            print(f"blocked on {event.id}", file=sys.stderr, flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        record(args.db, "finished", event, context)

    asyncio.run(events.run())


if __name__ == "__main__":
    main()
