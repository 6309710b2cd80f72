"""What a reconcile run found, pushed to a Prometheus Pushgateway when it ends.

A reconcile run is a batch job: it exits before any scrape could see it, so it pushes its
figures once, at the end, to the Pushgateway named by `--pushgateway` (default: the
environment variable RECONCILE_PUSHGATEWAY_URL; unset: nothing is pushed), which Prometheus
scrapes with `honor_labels: true` (k8s/README.md, docs/reconcile.md "Metrics"). Grouping
key: `job="storage-events-reconcile"`, `instance=<storage instance>`, so each instance's
last run replaces its previous one and nothing else.

Pushed every run (HTTP POST: metrics not pushed this time keep their last value):

* `storage_events_reconcile_last_run_timestamp_seconds`, `..._last_run_exit_code` (0 done,
  1 failed, 2 configuration, 3 refused by the safety bound), `..._duration_seconds`, and
  `..._expected_interval_seconds` (`--expected-interval`: the longest gap between two
  scheduled runs, which the "no successful run" alert doubles).

Pushed by a run that compared the listing with the stream (exit 0, 3, or 1 when Kafka did
not acknowledge every delivery):

* `storage_events_reconcile_drift_keys{kind="created"|"deleted"}`: the drift it found;
  `..._published`: deliveries Kafka acknowledged; `..._listed_keys`, `..._known_keys`;
* `storage_events_reconcile_drift_runs`: how many comparing runs in a row found drift, the
  previous count read back from the Pushgateway (0 after a run that found none). Counting
  in the job, not in PromQL, holds however runs and scrapes interleave (two runs between
  two scrapes, a scrape missed). When the previous count cannot be read, it is not pushed
  (a warning says so) rather than restarted at 1;
* `storage_events_reconcile_last_success_timestamp_seconds`: only when the run published
  all its drift (exit 0).

A `--dry-run` pushes nothing: a trial must not move the series the alerts read. A push that
fails does not change the run's exit code: it is one warning on stderr and the line
`reconcile metrics not pushed: <why>` on stdout after the summary.
"""

from __future__ import annotations

import argparse
import os
import time
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Gauge, pushadd_to_gateway
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from connectors.reconcile.drift import Plan

JOB = "storage-events-reconcile"
ENVIRONMENT = "RECONCILE_PUSHGATEWAY_URL"
PREFIX = "storage_events_reconcile_"
DRIFT_RUNS = f"{PREFIX}drift_runs"


@dataclass(frozen=True)
class Compared:
    """What a run that compared found and did."""

    listed: int
    known: int
    created: int
    deleted: int
    published: int

    @property
    def drift(self) -> int:
        return self.created + self.deleted


def _url(gateway: str) -> str:
    return gateway if "://" in gateway else f"http://{gateway}"


class RunMetrics:
    """One run's metrics: `compared` once the drift is known, `push` when the run ends."""

    def __init__(
        self,
        gateway: str,
        instance: str,
        expected_interval_s: float | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.gateway = _url(gateway).rstrip("/")
        self.instance = instance
        self.expected_interval_s = expected_interval_s
        self.timeout_s = timeout_s
        self.started = time.time()
        self.found: Compared | None = None
        self.warnings: list[str] = []

    def compared(self, plan: Plan, published: int) -> None:
        self.found = Compared(
            plan.listed, plan.known, plan.count("created"), plan.count("deleted"), published
        )

    def previous_drift_runs(self) -> float:
        """The drift_runs this instance's group holds on the Pushgateway (0 when absent)."""
        with urllib.request.urlopen(f"{self.gateway}/metrics", timeout=self.timeout_s) as answer:
            text = answer.read().decode("utf-8")
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                if (
                    sample.name == DRIFT_RUNS
                    and labels.get("job") == JOB
                    and labels.get("instance") == self.instance
                ):
                    return float(sample.value)
        return 0.0

    def registry(self, exit_code: int, now: float) -> CollectorRegistry:
        registry = CollectorRegistry()

        def gauge(name: str, help_text: str, value: float) -> None:
            Gauge(PREFIX + name, help_text, registry=registry).set(value)

        gauge("last_run_timestamp_seconds", "When the last reconcile run ended", now)
        gauge("last_run_exit_code", "0 done, 1 failed, 2 configuration, 3 refused", exit_code)
        gauge("duration_seconds", "How long the last reconcile run took", now - self.started)
        if self.expected_interval_s is not None:
            gauge(
                "expected_interval_seconds",
                "The longest gap between two scheduled runs (--expected-interval)",
                self.expected_interval_s,
            )
        found = self.found
        if found is None:
            return registry
        drift = Gauge(
            PREFIX + "drift_keys",
            "Keys the last comparing run found drifted, by the event it publishes",
            ["kind"],
            registry=registry,
        )
        drift.labels(kind="created").set(found.created)
        drift.labels(kind="deleted").set(found.deleted)
        gauge(
            "published", "Deliveries Kafka acknowledged in the last comparing run", found.published
        )
        gauge("listed_keys", "Keys the instance keeps, per the last listing", found.listed)
        gauge("known_keys", "Keys present per the stream, in the last comparing run", found.known)
        runs: float | None = 0.0
        if found.drift:
            try:
                runs = self.previous_drift_runs() + 1
            except Exception as exc:
                self.warnings.append(f"previous drift_runs not read ({exc}); not pushed")
                runs = None
        if runs is not None:
            gauge("drift_runs", "Comparing runs in a row that found drift", runs)
        if exit_code == 0:
            gauge("last_success_timestamp_seconds", "When a run last published all its drift", now)
        return registry

    def push(self, exit_code: int) -> str | None:
        """Push this run's metrics; None when done, else why not (never raises)."""
        try:
            registry = self.registry(exit_code, time.time())
            pushadd_to_gateway(
                self.gateway,
                job=JOB,
                registry=registry,
                grouping_key={"instance": self.instance},
                timeout=self.timeout_s,
            )
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}".replace("\n", " ")
        return None


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("metrics")
    group.add_argument(
        "--pushgateway",
        metavar="URL",
        help=f"push the run's metrics to this Prometheus Pushgateway when it ends (default: "
        f"${ENVIRONMENT}; unset: no push)",
    )
    group.add_argument(
        "--expected-interval",
        type=_seconds,
        metavar="S",
        help="the longest gap between two scheduled runs, pushed for the missing-run alert",
    )


def from_args(args: argparse.Namespace) -> RunMetrics | None:
    gateway = args.pushgateway or os.environ.get(ENVIRONMENT)
    if not gateway or args.dry_run:
        return None
    return RunMetrics(gateway, args.instance, args.expected_interval)
