"""Reconcile against a listing: `python -m connectors reconcile --instance NAME`.

Some notifications are sent once and never retried (Supabase Database Webhooks), and any
provider can lose one. Reconcile finds what the stream missed and publishes it:

1. **List** the instance's bucket through the S3-compatible API (boto3 `list_objects_v2`,
   paginated; AWS S3, MinIO, Supabase Storage's S3 endpoint, ...) under the instance's prefix.
   Each listed key goes through the instance's own rules (`streams.core.rules.apply_instance`), so
   keys the stream never emits (plugin-internal prefixes such as `.versions/`) are ignored,
   and ETags compare as the stream emits them.
2. **Read what the stream knows**: the instance's output topic (`files.events.<instance>`, or
   its configured `topic`), from the beginning to its end offsets at that moment, with
   `isolation.level=read_committed`, keeping the last event per key for this bucket. A
   `deleted` with `version_only: true` is skipped (a noncurrent version went; the key lives
   on). A key whose last event is `created` is *known* (present, per the stream).
   The output topic is the product's own contract, co-partitioned by key and holding exactly
   what consumers saw, so this compares the listing with what consumers were told. It needs
   the output topic to keep every key's last event (retention long enough, or unlimited):
   an event that aged out makes its key look unknown, and reconcile announces it once more.
3. **Drift**, per key:
   * listed, and the stream has no event, or its last is `deleted`, or a `created` with another
     ETag (both known) -> a synthetic `created` with the listing's ETag, size, last-modified;
   * not listed, and the stream's last event is `created` -> a synthetic `deleted`.
   Listing is done before the topic is read: a change made during the run then shows up in
   the topic rather than as drift, and the synthetic event's time (`observed_at`, the start of
   the listing) makes ordering prefer any real event newer than the listing over it.
4. **Publish** one synthetic delivery per drift (`source=reconcile`, `transport=reconcile`;
   body, instance and id rule in `streams.core.normalizers.reconcile`) to `--topic`, else the
   first raw topic that carries `reconcile` to the instance (`reconcile_topic`), each only
   once Kafka acknowledged it. Nothing with `--dry-run`.

A second run once the stream has caught up (the worker turned the first run's deliveries into
output events) finds no drift and publishes nothing. Two runs before it caught up publish the
same ids, which the stream drops as duplicates.

Output on stdout: one line per drift (`created <key> (<reason>)`, `deleted <key> (not-listed)`),
then the summary: `reconcile instance=... bucket=... listed=N known=N in_sync=N created=N
deleted=N published=N` (`listed`: keys the instance keeps; `known`: keys present per the
stream). Exit codes: 0 done; 1 with one line on stderr when the bucket, the credentials or
Kafka fail, or when a delivery was not acknowledged (run again: the ids are stable); 2 for a
configuration mistake.

Limits: one S3-compatible bucket per run (`--bucket` for an instance that takes every bucket);
the synthetic events reach every instance whose bucket and prefix cover the key, like any
delivery (an overlapping catch-all instance gets them too); times compare across the reconcile
host's clock and the provider's, so keep clocks in sync. Reconcile events are ordered against
the provider's notifications only when the instance names that one provider in `sources`
(state is scoped by provider: see streams.core.emitting); otherwise among themselves, and the
command says so on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from connectors.command import BridgeCommand, add_publishing_arguments
from connectors.publisher import PublishFailed, RawPublisher, raw_headers
from streams.config import ConfigError, InstanceConfig, Settings
from streams.core.event import FileEvent, format_time
from streams.core.normalizers.base import MalformedDelivery, parse_time, strip_quotes
from streams.core.normalizers.reconcile import SOURCE, reconcile_id
from streams.core.rules import Filtered, apply_instance
from streams.kafka_settings import KafkaSettings, check_access

log = logging.getLogger(__name__)

TRANSPORT = "reconcile"
PUBLISH_CONCURRENCY = 100


class ReconcileError(Exception):
    """What stops a run, as one line."""


@dataclass(frozen=True, slots=True)
class Listed:
    """One object of the listing, as the provider names it (full key, prefix included)."""

    key: str
    etag: str | None
    size: int | None
    last_modified: datetime | None


@dataclass(frozen=True, slots=True)
class Known:
    """The last event the stream emitted for a key (caller-facing, prefix stripped)."""

    key: str
    type: str
    etag: str | None
    time: datetime | None


@dataclass(frozen=True, slots=True)
class Drift:
    type: str
    key: str
    """The full provider key."""
    reason: str
    body: dict[str, Any]

    def value(self) -> bytes:
        return json.dumps(self.body, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass(slots=True)
class Plan:
    drifts: list[Drift] = field(default_factory=list)
    listed: int = 0
    ignored: int = 0
    """Listed keys the instance does not keep (its rules drop them)."""
    known: int = 0
    in_sync: int = 0

    def count(self, event_type: str) -> int:
        return sum(1 for drift in self.drifts if drift.type == event_type)


def full_key(instance: InstanceConfig, key: str) -> str:
    return f"{instance.prefix}/{key}" if instance.prefix else key


def _body(
    instance: InstanceConfig,
    event_type: str,
    bucket: str,
    key: str,
    etag: str | None,
    size: int | None,
    last_modified: datetime | None,
    observed_at: datetime,
    reason: str,
) -> dict[str, Any]:
    return {
        "type": event_type,
        "bucket": bucket,
        "key": key,
        "etag": etag,
        "size": size,
        "last_modified": format_time(last_modified) if last_modified is not None else None,
        "observed_at": format_time(observed_at),
        "id": reconcile_id(event_type, bucket, key, etag, last_modified),
        "instance": instance.name,
        "reason": reason,
    }


def plan(
    listed: Iterable[Listed],
    known: Mapping[str, Known],
    instance: InstanceConfig,
    bucket: str,
    observed_at: datetime,
) -> Plan:
    """The drifts between a listing and the stream's last events (pure)."""
    result = Plan(known=sum(1 for last in known.values() if last.type == "created"))
    seen: set[str] = set()
    for item in listed:
        etag = strip_quotes(item.etag)
        probe = FileEvent(
            id="listing",
            type="created",
            key=item.key,
            bucket=bucket,
            size=item.size,
            etag=etag,
            provider=SOURCE,
        )
        view = apply_instance(probe, instance)
        if isinstance(view, Filtered):
            result.ignored += 1
            continue
        result.listed += 1
        seen.add(view.key)
        last = known.get(view.key)
        if last is None:
            reason = "not-in-stream"
        elif last.type != "created":
            reason = "deleted-in-stream"
        elif view.etag and last.etag and view.etag != last.etag:
            reason = "etag-differs"
        else:
            result.in_sync += 1
            continue
        body = _body(
            instance,
            "created",
            bucket,
            item.key,
            etag,
            item.size,
            item.last_modified,
            observed_at,
            reason,
        )
        result.drifts.append(Drift("created", item.key, reason, body))
    for key in sorted(known):
        last = known[key]
        if last.type == "created" and key not in seen:
            provider_key = full_key(instance, key)
            body = _body(
                instance,
                "deleted",
                bucket,
                provider_key,
                last.etag,
                None,
                last.time,
                observed_at,
                "not-listed",
            )
            result.drifts.append(Drift("deleted", provider_key, "not-listed", body))
    return result


def last_events(values: Iterable[bytes | None], bucket: str) -> dict[str, Known]:
    """The last event per key among output-topic values (in offset order), for `bucket`."""
    known: dict[str, Known] = {}
    unreadable = 0
    for value in values:
        try:
            event = json.loads(value or b"")
            key, event_type = event["key"], event["type"]
            if not isinstance(key, str) or event_type not in ("created", "deleted"):
                raise ValueError("not a canonical event")
            if event.get("bucket") != bucket:
                continue
            if event_type == "deleted" and event.get("version_only") is True:
                continue  # a noncurrent version went; the key lives on
            etag = event.get("etag")
            known[key] = Known(
                key=key,
                type=event_type,
                etag=strip_quotes(etag) if isinstance(etag, str) else None,
                time=parse_time(event.get("time")),
            )
        except (ValueError, KeyError, TypeError, MalformedDelivery):
            unreadable += 1
    if unreadable:
        log.warning("%d output records are not canonical events; ignored", unreadable)
    return known


async def read_output(
    kafka: KafkaSettings | str, topic: str, timeout_s: float
) -> list[bytes | None]:
    """Every committed value of `topic`, per partition in offset order, up to its end offsets."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    kafka = KafkaSettings.of(kafka)
    bootstrap = kafka.bootstrap_servers
    problem = await check_access(kafka, timeout_s)
    if problem is not None:  # a refused password or certificate: one line naming the setting
        raise ReconcileError(problem[0])
    admin = AIOKafkaAdminClient(**kafka.aiokafka_args(), client_id="storage-events-reconcile")
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        if topic not in await admin.list_topics():  # all topics: creates none
            raise ReconcileError(
                f"output topic {topic} does not exist (has the worker run with this config?)"
            )
        [description] = await admin.describe_topics([topic])
        partitions = sorted(int(item["partition"]) for item in description["partitions"])
    except (KafkaError, TimeoutError) as exc:
        raise ReconcileError(f"cannot reach Kafka at {bootstrap}: {exc!r}") from None
    finally:
        await admin.close()

    consumer = AIOKafkaConsumer(
        **kafka.aiokafka_args(),
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        client_id="storage-events-reconcile",
    )
    try:
        await asyncio.wait_for(consumer.start(), timeout_s)
        assignment = [TopicPartition(topic, partition) for partition in partitions]
        consumer.assign(assignment)
        await consumer.seek_to_beginning(*assignment)
        ends = await consumer.end_offsets(assignment)
        values: dict[int, list[bytes | None]] = {partition: [] for partition in partitions}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            behind = [tp for tp in assignment if await consumer.position(tp) < ends[tp]]
            if not behind:
                break
            if loop.time() > deadline:
                raise ReconcileError(f"reading {topic} did not reach its end within {timeout_s} s")
            batches = await consumer.getmany(*behind, timeout_ms=500)
            for tp, messages in batches.items():
                values[tp.partition].extend(
                    message.value for message in messages if message.offset < ends[tp]
                )
        return [value for partition in partitions for value in values[partition]]
    except (KafkaError, TimeoutError) as exc:
        raise ReconcileError(f"reading {topic} failed: {exc!r}") from None
    finally:
        await consumer.stop()


def s3_client(endpoint_url: str | None, region: str | None) -> Any:
    """A boto3 S3 client; path-style addressing for a custom endpoint (MinIO, Supabase)."""
    import boto3
    from botocore.config import Config

    config = Config(
        retries={"mode": "standard", "max_attempts": 5},
        s3={"addressing_style": "path"} if endpoint_url else {},
    )
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint_url, region_name=region, config=config
    )


def list_bucket(client: Any, bucket: str, prefix: str) -> Iterator[Listed]:
    """Every object of `bucket` under `prefix` (on a path boundary), page by page."""
    from botocore.exceptions import BotoCoreError, ClientError

    paginator = client.get_paginator("list_objects_v2")
    try:
        for page in paginator.paginate(Bucket=bucket, Prefix=f"{prefix}/" if prefix else ""):
            for item in page.get("Contents", []):
                modified = item.get("LastModified")
                yield Listed(
                    key=item["Key"],
                    etag=item.get("ETag"),
                    size=item.get("Size"),
                    last_modified=modified.astimezone(UTC) if modified is not None else None,
                )
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code, message = error.get("Code", "?"), str(error.get("Message", "")).replace("\n", " ")
        raise ReconcileError(f"listing bucket {bucket} failed: {code}: {message}") from None
    except BotoCoreError as exc:
        raise ReconcileError(f"listing bucket {bucket} failed: {exc}") from None


async def publish_all(publisher: RawPublisher, drifts: list[Drift], timeout_s: float) -> int:
    """Publish every drift; the number Kafka acknowledged."""
    try:
        await asyncio.wait_for(publisher.start(), timeout_s)
    except TimeoutError:
        await publisher.stop()
        raise ReconcileError(
            f"cannot reach Kafka at {publisher.bootstrap_servers} to publish"
        ) from None
    slots = asyncio.Semaphore(PUBLISH_CONCURRENCY)

    async def one(drift: Drift) -> bool:
        headers = raw_headers(SOURCE, TRANSPORT, delivery_id=drift.body["id"])
        async with slots:
            try:
                await publisher.publish(drift.value(), headers)
                return True
            except PublishFailed as exc:
                log.warning("%s %s not acknowledged: %s", drift.type, drift.key, exc)
                return False

    try:
        outcomes = await asyncio.gather(*(one(drift) for drift in drifts))
    finally:
        await publisher.stop()
    return sum(outcomes)


def reconcile_topic(settings: Settings, instance: str, topic: str | None) -> str:
    """Where the drift of `instance` is published: `--topic`, else the first raw topic that
    carries `reconcile` to the instance; ConfigError when the topic named cannot."""
    chosen = topic or settings.stream.raw_topic_for(SOURCE, instance)
    if chosen is None:
        raise ConfigError(
            f"no [stream] raw_topics entry carries reconcile deliveries to instance "
            f'{instance!r}; add one, e.g. {{ name = "files.reconcile.{instance}", '
            f'sources = ["reconcile"], instances = ["{instance}"] }}'
        )
    configured = settings.stream.raw_topic(chosen)
    if configured is not None and not (configured.carries(SOURCE) and configured.reaches(instance)):
        raise ConfigError(
            f"--topic {chosen}: the worker dead-letters reconcile deliveries for instance "
            f"{instance!r} there (its sources or instances leave them out)"
        )
    return chosen


def reconcile(args: argparse.Namespace, settings: Settings) -> int:
    instance = settings.instance(args.instance)
    if args.bucket and instance.bucket and args.bucket != instance.bucket:
        raise ConfigError(
            f"instance {instance.name!r} keeps bucket {instance.bucket!r} only, not {args.bucket!r}"
        )
    bucket = args.bucket or instance.bucket
    if bucket is None:
        raise ConfigError(
            f"instance {instance.name!r} takes every bucket; name the one to list with --bucket"
        )
    raw_topic = reconcile_topic(settings, instance.name, args.topic)
    if instance.reconciled_source is None:
        print(
            f"connectors reconcile: instance {instance.name!r} names no single provider in "
            "`sources`: its reconcile events are ordered among themselves only, not against "
            f"the provider's notifications; set instances.{instance.name}.sources = "
            '["<provider>"] (e.g. "supabase")',
            file=sys.stderr,
        )

    observed_at = datetime.now(UTC)
    client = s3_client(args.endpoint_url, args.region)
    listing = list(list_bucket(client, bucket, instance.prefix))
    values = asyncio.run(read_output(settings.kafka, instance.output_topic, args.read_timeout))
    result = plan(listing, last_events(values, bucket), instance, bucket, observed_at)

    for drift in result.drifts:
        print(f"{drift.type} {drift.key} ({drift.reason})")
    published = 0
    if result.drifts and not args.dry_run:
        publisher = RawPublisher(settings.kafka, raw_topic, args.publish_timeout)
        published = asyncio.run(publish_all(publisher, result.drifts, args.read_timeout))
    print(
        f"reconcile instance={instance.name} bucket={bucket} listed={result.listed} "
        f"known={result.known} in_sync={result.in_sync} created={result.count('created')} "
        f"deleted={result.count('deleted')} published={published}"
        + (" (dry run)" if args.dry_run else ""),
        flush=True,
    )
    if published < len(result.drifts) and not args.dry_run:
        print(
            f"connectors reconcile: {len(result.drifts) - published} of {len(result.drifts)} "
            "deliveries not acknowledged by Kafka; run again",
            file=sys.stderr,
        )
        return 1
    return 0


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--instance", required=True, help="the configured instance to reconcile")
    parser.add_argument("--endpoint-url", help="S3-compatible endpoint (MinIO, Supabase, moto)")
    parser.add_argument("--region", help="region of the bucket (default: the usual AWS chain)")
    parser.add_argument(
        "--bucket", help="the bucket to list (default: the instance's; required if it has none)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the drift, publish nothing")
    add_publishing_arguments(parser, metrics=False)
    parser.add_argument(
        "--read-timeout",
        type=float,
        default=120.0,
        help="seconds to read the output topic to its end (default 120)",
    )


def _run(args: argparse.Namespace, settings: Settings) -> int:
    logging.getLogger("botocore").setLevel(logging.WARNING)  # no "Found credentials" chatter
    try:
        return reconcile(args, settings)
    except ConfigError as exc:
        print(f"connectors reconcile: {exc}", file=sys.stderr)
        return 2
    except ReconcileError as exc:
        print(f"connectors reconcile: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # credentials and other boto3 errors before the first page
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(exc, BotoCoreError | ClientError):
            print(f"connectors reconcile: {exc}".replace("\n", " "), file=sys.stderr)
            return 1
        raise


COMMAND = BridgeCommand(
    "publish what the stream missed, from a listing of the instance's bucket",
    _add_arguments,
    _run,
)
