"""Reconcile against a listing: `python -m connectors reconcile --instance NAME`.

Some notifications are sent once and never retried (Supabase Database Webhooks), and any
provider can lose one. Reconcile finds what the stream missed and publishes it:

1. **List** the instance's bucket with the provider's own list API (one module per provider
   in `connectors.reconcile.listings`: the S3 API for S3, MinIO, Supabase and B2; GCS; Azure
   Blob; the REST list APIs of Box, Cloudinary and Appwrite), under the instance's prefix,
   live objects only (a versioned bucket compares its live versions). `--provider` picks the
   listing; by default the instance's one source does (`sources = ["gcs"]`), else the S3 API.
   Each listed key goes through the instance's own rules (`streams.core.rules.apply_rules`),
   so keys the stream never emits (plugin-internal prefixes such as `.versions/`) are ignored,
   and ETags compare as the stream emits them.
2. **Read what the stream knows** (`connectors.reconcile.stream`: any `StreamKnowledge`). By
   default (`--known-from state`) the worker's per-key state: its keys changelog
   (`<app_id>-keys-changelog`, compacted per key), this instance's and bucket's records, into a
   temporary RocksDB (`connectors.reconcile.knownset.SpilledKnown`); `--known-from output`
   reads the last event per key of the instance's output topic instead (a worker older than
   per-key state: the default run names that case). A key whose last word is `created` is
   *known* (present, per the stream).
3. **Drift**, per key (`connectors.reconcile.drift.compare`, streamed: memory does not grow
   with the bucket; the listing and the drift are spooled to temporary files):
   * listed, and the stream has no event, or its last is `deleted`, or a `created` with another
     ETag (both known) -> a synthetic `created` with the listing's ETag, size, last-modified;
   * not listed, and the stream's last event is `created` -> a synthetic `deleted`.
   Listing is done before the stream is read: a change made during the run then shows up in
   the stream rather than as drift, and the synthetic event's time (`observed_at`, the start
   of the listing) makes ordering prefer any real event newer than the listing over it.
4. **Check the safety bound** (`drift.refusal`): a run that would delete anything from an
   empty listing, or more than `--max-delete-share` (default 10%) of the known keys, publishes
   nothing and says why (exit 3), unless `--max-deletes N` allows that many or `--force`. A
   listing that fails part-way publishes nothing at all (exit 1): the keys it did not reach
   would otherwise all read as deleted.
5. **Publish** one synthetic delivery per drift (`source=reconcile`, `transport=reconcile`;
   body, instance and id rule in `streams.core.normalizers.reconcile`) to `--topic`, else the
   first raw topic that carries `reconcile` to the instance (`reconcile_topic`), each only
   once Kafka acknowledged it. Nothing with `--dry-run`, which prints the same summary.

A second run once the stream has caught up (the worker turned the first run's deliveries into
output events) finds no drift and publishes nothing. Two runs before it caught up publish the
same ids, which the stream drops as duplicates.

Output on stdout: one line per drift (`created <key> (<reason>)`, `deleted <key> (not-listed)`,
each ending `: not published (refused)` or `(dry run)` when the run publishes nothing), then
the summary: `reconcile instance=... bucket=... listed=N known=N in_sync=N created=N
deleted=N published=N` (`listed`: keys the instance keeps; `known`: keys present per the
stream), with ` (dry run)` or ` (refused)` after it. On stderr, every `--progress-interval`
seconds of a long run (default 10), a progress line: the phase (listing, reading, comparing,
publishing), keys listed, changelog records read, keys compared, drift found, published, the
phase's rate and, where its total is known (reading, comparing, publishing), its ETA.
Exit codes: 0 done; 1 with one line on stderr when the listing, the credentials
or Kafka fail (a topic this principal may not read is named as a permission problem), or
when a delivery was not acknowledged (run again: the ids are stable); 2 for a configuration
mistake; 3 refused by the safety bound.

Metrics: with `--pushgateway URL` (or RECONCILE_PUSHGATEWAY_URL) the run pushes what it found
to that Prometheus Pushgateway when it ends, grouped by job and instance
(`connectors.reconcile.report`: last run, last success, drift by kind, published, drift runs
in a row). A push that fails changes no exit code: it is a warning on stderr and a last
stdout line `reconcile metrics not pushed: <why>`. `python -m streams cronjobs` generates
the CronJob that runs this on a schedule per instance (streams.cronjobs).

Limits: one bucket per run (`--bucket` for an instance that takes every bucket; Box and
Cloudinary have none); the synthetic events are kept only by the instance they name (each
instance's run fixes its own output: an overlapping catch-all instance needs a run of its
own); times compare across the reconcile host's clock and the provider's, so keep clocks in
sync. Reconcile events are ordered against the provider's notifications only when the instance
names that one provider in `sources` (state is scoped by provider: see
streams.core.emitting); otherwise among themselves, and the command says so on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import orjson

from connectors.command import BridgeCommand, add_publishing_arguments
from connectors.publisher import PublishFailed, RawPublisher, raw_headers
from connectors.reconcile import listings, report
from connectors.reconcile.drift import (
    DEFAULT_MAX_DELETE_SHARE,
    Drift,
    Known,
    Listed,
    Plan,
    compare,
    plan,
    refusal,
)
from connectors.reconcile.knownset import KnownSet, MemoryKnown
from connectors.reconcile.listings import ListingError
from connectors.reconcile.stream import (
    KeysChangelogKnowledge,
    OutputTopicKnowledge,
    StreamKnowledge,
    StreamReadError,
    last_events,
)
from streams.config import ConfigError, InstanceConfig, Settings
from streams.core.normalizers.reconcile import SOURCE

__all__ = ["COMMAND", "Known", "Listed", "Plan", "last_events", "plan", "refusal"]

log = logging.getLogger(__name__)

TRANSPORT = "reconcile"
PUBLISH_CONCURRENCY = 100
EXIT_REFUSED = 3


class ReconcileError(Exception):
    """What stops a run, as one line."""


class Progress:
    """Counts of a run, printed to `out` at most every `interval_s` seconds (0: every step):
    what each phase has done, its rate, and its ETA where its total is known."""

    def __init__(self, interval_s: float, out: TextIO = sys.stderr) -> None:
        self.interval_s = interval_s
        self.out = out
        self.started = time.monotonic()
        self.last = self.started
        self.listed = 0
        self.read = 0
        self.compared = 0
        self.drift = 0
        self.published = 0
        self.phase = "listing"
        self.total: int | None = None
        """What the phase will reach, when known."""
        self._phase_started = self.started
        self._phase_from = 0

    def done(self) -> int:
        """The current phase's count."""
        return {
            "listing": self.listed,
            "reading": self.read,
            "comparing": self.compared,
            "publishing": self.published,
        }.get(self.phase, 0)

    def enter(self, phase: str, total: int | None = None) -> None:
        if self.last != self.started:  # a long run: where the phase ended, too
            self.last = time.monotonic()
            self.report(self.last)
        self.phase = phase
        self.total = total
        self._phase_started = time.monotonic()
        self._phase_from = self.done()

    def step(self) -> None:
        now = time.monotonic()
        if now - self.last >= self.interval_s:
            self.last = now
            self.report(now)

    def report(self, now: float | None = None) -> None:
        now = now or time.monotonic()
        elapsed = max(now - self.started, 1e-9)
        in_phase = max(now - self._phase_started, 1e-9)
        rate = (self.done() - self._phase_from) / in_phase
        eta = ""
        if self.total is not None and rate > 0:
            eta = f" eta={max(self.total - self.done(), 0) / rate:.0f}s"
        total = f"/{self.total}" if self.total is not None else ""
        phase = f" phase={self.done()}{total} ({rate:.0f}/s){eta}" if self.phase != "done" else ""
        print(
            f"reconcile progress: {self.phase} listed={self.listed} "
            f"({self.listed / elapsed:.0f}/s) read={self.read} compared={self.compared} "
            f"drift={self.drift} published={self.published} elapsed={elapsed:.0f}s{phase}",
            file=self.out,
            flush=True,
        )

    def listed_one(self) -> None:
        self.listed += 1
        self.step()


def _guarded(items: Iterator[Listed], progress: Progress) -> Iterator[Listed]:
    """The listing, its failures as one line saying that nothing was published."""
    try:
        yield from items
    except ListingError as exc:
        if progress.listed == 0:  # nothing listed: nothing to say beyond the error
            raise ReconcileError(str(exc)) from None
        raise ReconcileError(
            f"{exc} (after {progress.listed} objects); nothing published: a listing cut "
            "short would read every key it did not reach as deleted"
        ) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ReconcileError(
            f"listing failed on an unexpected answer ({type(exc).__name__}: {exc}) after "
            f"{progress.listed} objects; nothing published"
        ) from None


async def publish_all(
    publisher: RawPublisher, drifts: Iterable[Drift], timeout_s: float, progress: Progress
) -> int:
    """Publish every drift, at most PUBLISH_CONCURRENCY in flight (the drifts are read as they
    go out, never all held); the number Kafka acknowledged."""
    try:
        await asyncio.wait_for(publisher.start(), timeout_s)
    except TimeoutError:
        await publisher.stop()
        raise ReconcileError(
            f"cannot reach Kafka at {publisher.bootstrap_servers} to publish"
        ) from None
    slots = asyncio.Semaphore(PUBLISH_CONCURRENCY)
    acknowledged = 0

    async def one(drift: Drift) -> None:
        nonlocal acknowledged
        headers = raw_headers(SOURCE, TRANSPORT, delivery_id=drift.body["id"])
        try:
            await publisher.publish(drift.value(), headers)
        except PublishFailed as exc:
            log.warning("%s %r not acknowledged: %s", drift.type, drift.key, exc)
            return
        finally:
            slots.release()
        acknowledged += 1
        progress.published += 1
        progress.step()

    pending: set[asyncio.Task[None]] = set()
    try:
        for drift in drifts:
            await slots.acquire()
            task = asyncio.create_task(one(drift))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            await asyncio.gather(*pending)
    finally:
        for task in pending:
            task.cancel()
        await publisher.stop()
    return acknowledged


def _bucket(args: argparse.Namespace, instance: InstanceConfig, bucketless: bool) -> str | None:
    if bucketless:
        if args.bucket:
            raise ConfigError("this provider has no buckets: drop --bucket")
        return None
    if args.bucket and instance.bucket and args.bucket != instance.bucket:
        raise ConfigError(
            f"instance {instance.name!r} keeps bucket {instance.bucket!r} only, not {args.bucket!r}"
        )
    bucket = args.bucket or instance.bucket
    if bucket is None:
        raise ConfigError(
            f"instance {instance.name!r} takes every bucket; name the one to list with --bucket"
        )
    return bucket


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


def reconcile(
    args: argparse.Namespace,
    settings: Settings,
    knowledge: StreamKnowledge | None = None,
    metrics: report.RunMetrics | None = None,
) -> int:
    """One run; `knowledge` replaces the keys-changelog read (what the stream knows); `metrics`
    records what it found (connectors.reconcile.report)."""
    instance = settings.instance(args.instance)
    listing = listings.chosen(args, instance)
    bucket = _bucket(args, instance, listing.bucketless)
    raw_topic = reconcile_topic(settings, instance.name, args.topic)
    if args.max_deletes is not None and args.max_deletes < 0:
        raise ConfigError("--max-deletes must be 0 or more")
    if not 0 <= args.max_delete_share <= 1:
        raise ConfigError("--max-delete-share must be between 0 and 1")
    if instance.reconciled_source is None:
        print(
            f"connectors reconcile: instance {instance.name!r} names no single provider in "
            "`sources`: its reconcile events are ordered among themselves only, not against "
            f"the provider's notifications; set instances.{instance.name}.sources = "
            '["<provider>"] (e.g. "supabase")',
            file=sys.stderr,
        )

    progress = Progress(args.progress_interval)
    observed_at = datetime.now(UTC)
    with tempfile.TemporaryDirectory(prefix="reconcile-") as scratch:
        listing_file = Path(scratch) / "listing"
        drifts_file = Path(scratch) / "drifts"
        # The whole listing before the stream is read (see the module's docstring, step 3),
        # spooled to a file, not held.
        with listing_file.open("wb") as spool:
            for item in _listed(listing.open(args, instance, bucket), progress):
                spool.write(_listed_line(item))
        if knowledge is None:
            knowledge = _knowledge(args, settings, instance, bucket, progress)
        progress.enter("reading")
        try:
            known = _known_set(knowledge())
        except StreamReadError as exc:
            raise ReconcileError(str(exc)) from None
        try:
            progress.enter("comparing", progress.listed)

            def compared() -> None:
                progress.compared += 1
                progress.step()

            with drifts_file.open("wb") as found:

                def sink(drift: Drift) -> None:
                    progress.drift += 1
                    found.write(_drift_line(drift))

                result = compare(
                    _spooled(listing_file),
                    known,
                    instance,
                    bucket,
                    observed_at,
                    sink,
                    on_listed=compared,
                    on_unlisted=progress.step,
                )
        finally:
            known.close()
        listing_file.unlink()

        refused = refusal(result, args.max_delete_share, args.max_deletes, args.force)
        # A run that publishes nothing says so on every drift line, not only in its summary.
        held = " (dry run)" if args.dry_run else " (refused)" if refused is not None else ""
        for drift in _drifts(drifts_file):
            mark = f": not published{held}" if held else ""
            print(f"{drift.type} {drift.key} ({drift.reason}){mark}")
        published = 0
        if result.drift_count and not args.dry_run and refused is None:
            progress.enter("publishing", result.drift_count)
            publisher = RawPublisher(settings.kafka, raw_topic, args.publish_timeout)
            published = asyncio.run(
                publish_all(publisher, _drifts(drifts_file), args.read_timeout, progress)
            )
    if metrics is not None:
        metrics.compared(result, published)
    if progress.last != progress.started:  # a long run: its last figures too
        progress.enter("done")
        progress.report()
    note = " (dry run)" if args.dry_run else " (refused)" if refused is not None else ""
    print(
        f"reconcile instance={instance.name} bucket={bucket or '-'} listed={result.listed} "
        f"known={result.known} in_sync={result.in_sync} created={result.count('created')} "
        f"deleted={result.count('deleted')} published={published}{note}",
        flush=True,
    )
    if refused is not None:
        verb = "a real run would publish nothing" if args.dry_run else "published nothing"
        print(f"connectors reconcile: {verb}: {refused}", file=sys.stderr)
        return 0 if args.dry_run else EXIT_REFUSED
    if published < result.drift_count and not args.dry_run:
        print(
            f"connectors reconcile: {result.drift_count - published} of {result.drift_count} "
            "deliveries not acknowledged by Kafka; run again",
            file=sys.stderr,
        )
        return 1
    return 0


def _listed(items: Iterator[Listed], progress: Progress) -> Iterator[Listed]:
    for item in _guarded(items, progress):
        progress.listed_one()
        yield item


def _listed_line(item: Listed) -> bytes:
    modified = item.last_modified.isoformat() if item.last_modified is not None else None
    return orjson.dumps([item.key, item.etag, item.size, modified]) + b"\n"


def _spooled(path: Path) -> Iterator[Listed]:
    with path.open("rb") as spool:
        for line in spool:
            key, etag, size, modified = orjson.loads(line)
            when = datetime.fromisoformat(modified) if modified is not None else None
            yield Listed(key, etag, size, when)


def _drift_line(drift: Drift) -> bytes:
    return orjson.dumps([drift.type, drift.key, drift.reason, drift.body]) + b"\n"


def _drifts(path: Path) -> Iterator[Drift]:
    with path.open("rb") as spool:
        for line in spool:
            yield Drift(*orjson.loads(line))


KNOWN_FROM = ("state", "output")


def _knowledge(
    args: argparse.Namespace,
    settings: Settings,
    instance: InstanceConfig,
    bucket: str | None,
    progress: Progress,
) -> StreamKnowledge:
    """`--known-from state` (the default): the worker's keys changelog; `output`: the output
    topic's last event per key (a worker older than per-key state)."""
    if args.known_from == "output":
        return OutputTopicKnowledge(
            settings.kafka, instance.output_topic, bucket, args.read_timeout
        )
    from streams.engine.topics import KEYS_TABLE, changelog_topic

    def read(records: int) -> None:
        progress.read = records
        progress.step()

    def total(offsets: int) -> None:
        progress.total = offsets

    return KeysChangelogKnowledge(
        settings.kafka,
        changelog_topic(settings, KEYS_TABLE),
        instance.output_topic,
        instance.name,
        bucket,
        args.read_timeout,
        on_records=read,
        on_total=total,
    )


def _known_set(known: KnownSet | Iterable[Known]) -> KnownSet:
    """A source's answer as a KnownSet: a set as it is; one word per key (a later one for a key
    replacing an earlier), into memory as today's output-topic reader holds it anyway."""
    if isinstance(known, KnownSet):
        return known
    return MemoryKnown({last.key: last for last in known})


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--instance", required=True, help="the configured instance to reconcile")
    parser.add_argument(
        "--endpoint-url",
        help="the provider's API endpoint (S3-compatible: MinIO, Supabase, B2, moto; an "
        "emulator for GCS; the API root for Box, Cloudinary, Appwrite)",
    )
    parser.add_argument(
        "--bucket", help="the bucket to list (default: the instance's; required if it has none)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the drift, publish nothing")
    parser.add_argument(
        "--max-delete-share",
        type=float,
        default=DEFAULT_MAX_DELETE_SHARE,
        metavar="FRACTION",
        help="refuse a run deleting more than this share of the known keys (default 0.1)",
    )
    parser.add_argument(
        "--max-deletes",
        type=int,
        metavar="N",
        help="allow up to N deletes instead of the share (also from an empty listing)",
    )
    parser.add_argument("--force", action="store_true", help="publish whatever the deletes")
    parser.add_argument(
        "--progress-interval",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds between progress lines on stderr (default 10)",
    )
    add_publishing_arguments(parser, metrics=False)
    parser.add_argument(
        "--known-from",
        choices=KNOWN_FROM,
        default="state",
        help="what the stream knows: `state`, the worker's per-key state (its keys changelog, "
        "compacted per key; the default), or `output`, the last event per key of the "
        "instance's output topic (a worker older than per-key state)",
    )
    parser.add_argument(
        "--read-timeout",
        type=float,
        default=120.0,
        help="seconds without a record before reading Kafka fails (default 120)",
    )
    listings.add_arguments(parser)
    report.add_arguments(parser)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    """A run, then its metrics pushed (`--pushgateway`): a failed push is said, not returned."""
    metrics = report.from_args(args)
    code = 1  # an unexpected exception: pushed as a failed run, then raised
    try:
        code = _outcome(args, settings, metrics)
    finally:
        if metrics is not None:
            failed = metrics.push(code)
            for warning in metrics.warnings:
                print(f"connectors reconcile: metrics: {warning}", file=sys.stderr)
            if failed is not None:
                print(
                    f"connectors reconcile: metrics not pushed to {metrics.gateway}: {failed}; "
                    f"the run's result stands (exit {code})",
                    file=sys.stderr,
                )
                print(f"reconcile metrics not pushed: {failed}", flush=True)
    return code


def _outcome(
    args: argparse.Namespace, settings: Settings, metrics: report.RunMetrics | None
) -> int:
    for noisy in ("botocore", "azure", "google", "urllib3", "aiokafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)  # no per-request chatter
    try:
        return reconcile(args, settings, metrics=metrics)
    except ConfigError as exc:
        print(f"connectors reconcile: {exc}", file=sys.stderr)
        return 2
    except ReconcileError as exc:
        print(f"connectors reconcile: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # credentials and other client errors before the first page
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
