"""Prometheus metrics of a consumer: what each handler did, how long it took, and what
became of each record.

A library must not register into the application's global registry on its own (two
`FileEvents` in one process would collide there), so `FileEventsMetrics` is a collector of
its own: `FileEvents` serves it on `metrics_port` when asked, and an application that
already serves `/metrics` registers it there (`prometheus_client.REGISTRY.register(
events.metrics)`). Several `FileEvents` of one process share one by passing it as
`metrics=`; their series differ by `topic` and `group`.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from fileevents.errors import DECODE

_HANDLER_LABELS = ("topic", "group", "handler")

HANDLER_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
"""From a few milliseconds (a row upsert) to the default timeout and past it."""


class RunTally:
    """One handler's successful runs and run durations, counted by the event loop in plain
    ints and moved into its Prometheus series when they are collected (`settle`).

    `Counter.inc` and `Histogram.observe` take a lock each: about 2 µs per event together,
    more than the rest of a no-op handler's run. The loop is the only writer of the counts
    here, which only grow; `settle` (under its collector's lock, from whichever thread
    scrapes) adds what grew since it last looked, so a scrape sees every run done before it.
    """

    __slots__ = ("_handled", "_moved", "_seconds", "bounds", "counts", "handled", "sum")

    def __init__(self, handled: Any, seconds: Any) -> None:
        self._handled = handled
        self._seconds = seconds
        self.bounds = tuple(seconds._upper_bounds)
        """The histogram's upper bounds, +Inf last: a run of `s` seconds falls in the first
        bucket whose bound is >= s, as `Histogram.observe` counts it."""
        self.handled = 0
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0
        self._moved: list[float] = [0, 0.0, *([0] * len(self.bounds))]
        """What `settle` has added so far: handled, sum, then each bucket's count."""

    @staticmethod
    def fits(seconds: Any) -> bool:
        """Whether this prometheus-client's histogram children can be added to in bulk (its
        `_sum` and `_buckets`, stable since 0.4); else runs are observed one by one."""
        return isinstance(getattr(seconds, "_buckets", None), list) and hasattr(seconds, "_sum")

    def ran(self, seconds: float, succeeded: bool) -> None:
        """One run that took `seconds` (a failed one's duration is counted too)."""
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds
        if succeeded:
            self.handled += 1

    def settle(self) -> None:
        """Add to the Prometheus series what was counted since the last call."""
        moved = self._moved
        handled = self.handled
        if handled != moved[0]:
            self._handled.inc(handled - moved[0])
            moved[0] = handled
        total = self.sum
        if total != moved[1]:
            self._seconds._sum.inc(total - moved[1])
            moved[1] = total
        buckets = self._seconds._buckets
        for index, count in enumerate(self.counts):
            if count != moved[index + 2]:
                buckets[index].inc(count - moved[index + 2])
                moved[index + 2] = count


class OutcomeTally:
    """A consumer's records by outcome, as it counts them (`FileEvents.outcomes`), moved into
    `fileevents_records_total` when collected: one dict increment per record on the event
    loop instead of a locked `Counter.inc`."""

    def __init__(self, records: Counter, topic: str, group: str, counts: Mapping[str, int]):
        self._records = records
        self._topic = topic
        self._group = group
        self._counts = counts
        self._moved: dict[str, int] = {}

    def settle(self) -> None:
        """Add to the series what was counted since the last call."""
        moved = self._moved
        for outcome, count in list(self._counts.items()):  # one C call: the loop may add keys
            done = moved.get(outcome, 0)
            if count != done:
                self._records.labels(self._topic, self._group, outcome).inc(count - done)
                moved[outcome] = count


class FileEventsMetrics(Collector):
    """The consumer's metrics; `collect` makes it a collector for any registry.

    Per handler (`handler` = `module.qualname`, or `<decode>` for records that are not
    events): runs that succeeded (`fileevents_handled_total`), runs that failed, timeouts
    included (`fileevents_failed_total`), of which timeouts (`fileevents_timed_out_total`),
    failures followed by a retry (`fileevents_retried_total`), records dead-lettered
    (`fileevents_dead_lettered_total`), and the duration of every run
    (`fileevents_handler_seconds`). Per record: its `Outcome` (`fileevents_records_total`).
    Per assigned partition: records up to its last stable offset not done with yet
    (`fileevents_lag`); and events running right now (`fileevents_in_flight`).

    Successful runs, run durations and outcomes are counted by the consumer's event loop in
    plain ints (`RunTally`, `OutcomeTally`) and moved into their series at each `collect`,
    so a scrape shows every run done before it.
    """

    def __init__(self) -> None:
        self.handled = Counter(
            "fileevents_handled",
            "Handler runs that succeeded",
            _HANDLER_LABELS,
            registry=None,
        )
        self.failed = Counter(
            "fileevents_failed",
            "Handler runs that raised or ran past their timeout",
            _HANDLER_LABELS,
            registry=None,
        )
        self.timed_out = Counter(
            "fileevents_timed_out",
            "Handler runs cancelled because they ran past their timeout (also counted failed)",
            _HANDLER_LABELS,
            registry=None,
        )
        self.retried = Counter(
            "fileevents_retried",
            "Failed handler runs that the event is retried after (at the failing handler)",
            _HANDLER_LABELS,
            registry=None,
        )
        self.dead_lettered = Counter(
            "fileevents_dead_lettered",
            "Records written to the dead-letter topic, by the handler that failed last",
            _HANDLER_LABELS,
            registry=None,
        )
        self.handler_seconds = Histogram(
            "fileevents_handler_seconds",
            "Duration of each handler run, failed and timed-out runs included",
            _HANDLER_LABELS,
            buckets=HANDLER_SECONDS_BUCKETS,
            registry=None,
        )
        self.records = Counter(
            "fileevents_records",
            "Records done with, by outcome (handled, duplicate, dead_lettered, no_handler, "
            "tombstone, interrupted)",
            ("topic", "group", "outcome"),
            registry=None,
        )
        self.lag = Gauge(
            "fileevents_lag",
            "Records of an assigned partition, up to its last stable offset, not done with yet",
            ("topic", "group", "partition"),
            registry=None,
        )
        self.in_flight = Gauge(
            "fileevents_in_flight",
            "Events whose handlers are running right now (at most max_concurrency)",
            ("topic", "group"),
            registry=None,
        )
        self._tallies: dict[tuple[str, str, str], RunTally] = {}
        self._outcomes: list[OutcomeTally] = []
        self._settling = threading.Lock()
        self._all = (
            self.handled,
            self.failed,
            self.timed_out,
            self.retried,
            self.dead_lettered,
            self.handler_seconds,
            self.records,
            self.lag,
            self.in_flight,
        )

    def start_at_zero(
        self, topic: str, group: str, handlers: Iterable[str], outcomes: Iterable[str]
    ) -> None:
        """Create the series of these handlers and outcomes at 0: a counter series that
        first appears with its first increment is invisible to `increase()` and `rate()` for
        that increment (an alert on dead letters would miss the first one)."""
        for handler in handlers:
            for counter in (self.handled, self.failed, self.timed_out, self.retried):
                counter.labels(topic, group, handler)
            self.dead_lettered.labels(topic, group, handler)
            self.handler_seconds.labels(topic, group, handler)
        self.dead_lettered.labels(topic, group, DECODE)
        for outcome in outcomes:
            self.records.labels(topic, group, outcome)
        self.in_flight.labels(topic, group)

    def tally(self, topic: str, group: str, handler: str) -> RunTally | None:
        """The `RunTally` of this handler's series (one per series, so a consumer started
        again counts on), settled at every collect; None when this prometheus-client cannot
        be added to in bulk (observe each run then). Its counts are written by one event
        loop: consumers sharing these metrics from several threads differ by topic or group."""
        seconds = self.handler_seconds.labels(topic, group, handler)
        if not RunTally.fits(seconds):
            return None
        with self._settling:
            tally = self._tallies.get((topic, group, handler))
            if tally is None:
                tally = RunTally(self.handled.labels(topic, group, handler), seconds)
                self._tallies[(topic, group, handler)] = tally
        return tally

    def follow_outcomes(self, topic: str, group: str, counts: Mapping[str, int]) -> None:
        """Count `fileevents_records_total{topic, group}` from `counts` (outcome -> records,
        only growing; one consumer's), settled at every collect: consumers of one topic and
        group sharing these metrics add up."""
        with self._settling:
            self._outcomes.append(OutcomeTally(self.records, topic, group, counts))

    def settle(self) -> None:
        """Move what the tallies counted into the series (`collect` does it first)."""
        with self._settling:
            for tally in self._tallies.values():
                tally.settle()
            for outcomes in self._outcomes:
                outcomes.settle()

    def collect(self) -> Iterator[Metric]:
        self.settle()
        for metric in self._all:
            yield from metric.collect()

    def describe(self) -> Iterator[Metric]:
        """The families without samples: a registry refuses a second collector with the
        same names at `register` (share one instead), rather than serving both."""
        for metric in self._all:
            yield from metric.describe()

    def registry(self) -> CollectorRegistry:
        """A registry holding these metrics alone (what `metrics_port` serves)."""
        registry = CollectorRegistry()
        registry.register(self)
        return registry


async def serve(metrics: FileEventsMetrics, host: str, port: int) -> web.AppRunner:
    """Serve `GET /metrics` on `host:port` until the returned runner is cleaned up.

    Raises `OSError` naming the address when it cannot listen there."""
    registry = metrics.registry()

    async def exposition(_: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(registry))
        response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
        response.charset = "utf-8"
        return response

    app = web.Application()
    app.router.add_get("/metrics", exposition)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise OSError(
            exc.errno, f"FileEvents metrics_port: cannot listen on {host}:{port} ({exc})"
        ) from exc
    return runner
