"""Idempotent handler: keep an SQLite copy of an instance's events and of its live files.

    python -m examples.sqlite_upsert --bootstrap 127.0.0.1:9092 --instance default \
        --db var/examples/files.sqlite

Each event is written in one SQLite transaction that (1) upserts the event by `event.id`
and (2) applies it to the `files` table (created: upsert the row; deleted: remove it unless
only a noncurrent version went). Running it twice for one event leaves the same rows, so a
redelivery (after a crash, before the commit) does no harm and no dedupe store is needed:
redeliveries come in offset order, and applying a suffix of one key's events again in order
ends in the same state.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sqlite3
from pathlib import Path

from fileevents import FileEvent, FileEvents

SCHEMA = """
create table if not exists file_events (
    id text primary key, type text not null, bucket text, key text not null,
    size integer, etag text, version_id text, time text, provider text not null
);
create table if not exists files (
    bucket text not null, key text not null, size integer, etag text, version_id text,
    updated_by text not null references file_events(id),
    primary key (bucket, key)
);
"""


def connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(path)
    connection.executescript(SCHEMA)
    return connection


def apply(connection: sqlite3.Connection, event: FileEvent) -> None:
    """Record `event` and its effect in one transaction; a second run changes nothing."""
    row = event.model_dump(mode="json")
    bucket = event.bucket or ""
    with connection:  # one transaction: both tables, or neither
        connection.execute(
            """insert into file_events
               values (:id, :type, :bucket, :key, :size, :etag, :version_id, :time, :provider)
               on conflict (id) do nothing""",
            row,
        )
        if event.type == "created":
            connection.execute(
                """insert into files values (?, ?, ?, ?, ?, ?)
                   on conflict (bucket, key) do update set size = excluded.size,
                   etag = excluded.etag, version_id = excluded.version_id,
                   updated_by = excluded.updated_by""",
                (bucket, event.key, event.size, event.etag, event.version_id, event.id),
            )
        elif not event.version_only:  # True: an old version went, the key lives on
            connection.execute(
                "delete from files where bucket = ? and key = ?", (bucket, event.key)
            )


def build(bootstrap: str, instance: str, group: str, db: Path) -> FileEvents:
    events = FileEvents(bootstrap_servers=bootstrap, instance=instance, group_id=group)
    connection = connect(db)

    @events.on("*")
    async def upsert(event: FileEvent) -> None:
        # SQLite is fast and local; a remote database would use an async driver instead.
        apply(connection, event)

    return events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    )
    parser.add_argument("--instance", default="default")
    parser.add_argument("--group", default="example-sqlite-upsert")
    parser.add_argument("--db", type=Path, default=Path("var/examples/files.sqlite"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(build(args.bootstrap, args.instance, args.group, args.db).run())


if __name__ == "__main__":
    main()
