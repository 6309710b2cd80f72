"""Re-read the truth: on each event, ask the storage about the object instead of trusting
the event.

    python -m examples.reread_truth --bootstrap 127.0.0.1:9092 --instance default \
        [--endpoint-url http://127.0.0.1:5000] [--prefix tenant-a/] [--bucket uploads]

An event says that something happened to a key; by the time you handle it, more may have
happened (a `created` for an object deleted since, an overwrite after it). Handlers that
must act on the current state (index it, scan it, copy it) call S3 `HeadObject` and act on
what it says: the object's current size, ETag and version, or its absence. The event then
only tells *which* key to look at. A 404 is an answer ("gone"), not an error; any other S3
error raises, so the event is retried and, in the end, dead-lettered.

`event.key` is the caller-facing key with the instance prefix stripped: `--prefix` puts it
back for the storage call. `--endpoint-url` points boto3 at MinIO, moto or another S3 API.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
from typing import Any

import boto3
from botocore.exceptions import ClientError

from fileevents import FileEvent, FileEvents

logger = logging.getLogger("examples.reread_truth")


def head(client: Any, bucket: str, key: str) -> dict[str, Any] | None:
    """The object's current metadata, or None when it does not exist (any more)."""
    try:
        answer: dict[str, Any] = client.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
            return None
        raise
    return answer


def build(
    bootstrap: str,
    instance: str,
    group: str,
    client: Any,
    prefix: str = "",
    bucket: str | None = None,
) -> FileEvents:
    events = FileEvents(bootstrap_servers=bootstrap, instance=instance, group_id=group)

    @events.on("*")
    async def reconcile(event: FileEvent) -> None:
        where = bucket or event.bucket
        if where is None:
            raise ValueError(f"event {event.id} names no bucket: pass --bucket")
        # boto3 blocks: run it in a thread, the other partitions go on meanwhile.
        found = await asyncio.to_thread(head, client, where, prefix + event.key)
        truth = (
            {"exists": False}
            if found is None
            else {
                "exists": True,
                "size": found.get("ContentLength"),
                "etag": str(found.get("ETag", "")).strip('"') or None,
                "version_id": found.get("VersionId"),
            }
        )
        print(
            json.dumps({"event": event.id, "said": event.type, "key": event.key, "now": truth}),
            flush=True,
        )

    return events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    )
    parser.add_argument("--instance", default="default")
    parser.add_argument("--group", default="example-reread-truth")
    parser.add_argument("--endpoint-url", default=None, help="an S3-compatible endpoint")
    parser.add_argument("--prefix", default="", help="the instance prefix, to put back")
    parser.add_argument("--bucket", default=None, help="instead of the event's bucket")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    client = boto3.client("s3", endpoint_url=args.endpoint_url)
    events = build(args.bootstrap, args.instance, args.group, client, args.prefix, args.bucket)
    asyncio.run(events.run())


if __name__ == "__main__":
    main()
