"""Prometheus metrics of the worker, per instance; served on the worker's web port at /metrics.

Every event the stream does not emit is counted here with why: filtered, duplicate, stale or
dead-lettered.

`filtered{instance, reason}` counts the events an instance was a candidate for and did not
keep (streams.core.routing): its bucket (or every bucket) and its prefix hold the event, and
`topic`, `instance`, `source`, `prefix-escape` or `plugin:<name>` says why it is not its. An
instance whose bucket or prefix does not hold an event counts nothing for it, so a tenant's
series grow with what it is sent, not with the number of tenants; an event that no instance's
bucket and prefix hold counts once, `filtered{instance="*", reason="no-instance"}`.

The per-instance metrics (`emitted`, `duplicates`, `stale`, `filtered`, `latency_seconds`)
are per instance while at most `stream.instance_metrics_limit` instances are configured (1,000
by default): with more, each is one series per other label with `instance="*"` (AGGREGATE),
so that /metrics stays the same size at 10,000 tenants (`start_at_zero` decides, once per
process).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge, Histogram

AGGREGATE = "*"
"""The `instance` label of a per-instance metric aggregated over every instance (and of
`filtered`'s `no-instance`); no instance's name (names are `[A-Za-z0-9._-]`)."""
DEFAULT_INSTANCE_METRICS_LIMIT = 1000

_Metric = TypeVar("_Metric", Counter, Histogram)


class ByInstance(Generic[_Metric]):
    """A metric whose first label is the storage instance: `labels(instance, ...)` gives that
    instance's child while the metrics are per instance, else the `instance="*"` one."""

    per_instance = True
    """Shared by every ByInstance (set by `start_at_zero`)."""

    def __init__(self, metric: _Metric) -> None:
        self.metric: _Metric = metric

    def labels(self, instance: str, *rest: str) -> _Metric:
        child: _Metric = self.metric.labels(
            instance if ByInstance.per_instance else AGGREGATE, *rest
        )
        return child


STAGES = ("normalize", "emit")
REFUSED_OUTCOMES = ("dead-lettered", "dropped")
"""What became of a record Kafka refused: replaced by a dead letter, or dropped
(streams/engine/outcomes.py)."""

RECEIVED = Counter("storage_events_received", "Raw deliveries read from the raw topics", ["source"])
NORMALIZED = Counter(
    "storage_events_normalized", "Canonical events found in raw deliveries", ["source"]
)
FILTERED = ByInstance(
    Counter(
        "storage_events_filtered",
        "Events an instance whose bucket and prefix hold them does not keep, by reason; "
        'instance="*", reason="no-instance": events no instance\'s bucket and prefix hold',
        ["instance", "reason"],
    )
)
EMITTED = ByInstance(
    Counter("storage_events_emitted", "Events written to an instance's output topic", ["instance"])
)
DUPLICATES = ByInstance(
    Counter(
        "storage_events_duplicates",
        "Events dropped because their id was seen within the TTL",
        ["instance"],
    )
)
STALE = ByInstance(
    Counter(
        "storage_events_stale", "Events older than one already emitted for their key", ["instance"]
    )
)
DEAD_LETTERED = Counter(
    "storage_events_dead_lettered", "Records sent to the dead-letter topic", ["stage"]
)
UNREADABLE = Counter(
    "storage_events_unreadable_records",
    "Records the Kafka client could not read whole (a compressed batch it cannot decompress, "
    "a header name that is not UTF-8), dead-lettered and stepped past",
    ["stage"],
)
STALLED_PARTITIONS = Gauge(
    "storage_events_stalled_partitions",
    "Partitions of a stage whose position has not moved for 10 s while records wait on "
    "them, about once a second",
    ["stage"],
)
EXPIRED = Counter("storage_events_dedupe_expired", "Dedupe entries removed after their TTL")
SEND_RETRIES = Counter(
    "storage_events_send_retries",
    "Writes to Kafka tried again after a failure: batches, transactions, producer start-ups",
)
LATENCY = ByInstance(
    Histogram(
        "storage_events_latency_seconds",
        "From the bridge receiving a delivery to its event being acknowledged on the output topic",
        ["instance"],
        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    )
)

OUTCOME_COUNTERS = {"emitted": EMITTED, "duplicate": DUPLICATES, "stale": STALE}
STAGE_SECONDS = Counter(
    "storage_events_stage_seconds",
    "Wall-clock time of each stage's loop by phase: waiting for records (fetch), deciding and "
    "writing a batch until Kafka acknowledged it (handle), committing offsets (commit); for "
    "stage emit also its transactions' phases: producing (txn-produce), "
    "send_offsets_to_transaction (txn-offsets), commit_transaction (txn-commit)",
    ["stage", "phase"],
)
STAGE_BATCHES = Counter("storage_events_stage_batches", "Batches handled per stage", ["stage"])
STAGE_RECORDS = Counter("storage_events_stage_records", "Records handled per stage", ["stage"])
REFUSED = Counter(
    "storage_events_refused_records",
    "Records Kafka refused as too large (or invalid), replaced by a dead letter or dropped",
    ["topic", "outcome"],
)
STAGE_STUCK = Gauge(
    "storage_events_stage_stuck",
    "1 while a stage cannot make progress (Kafka away or refusing its writes), else 0",
    ["stage"],
)
STAGE_LAG = Gauge(
    "storage_events_stage_lag",
    "Records waiting on a stage's partitions (end it may read minus its position), about "
    "once a second; absent until the stage has partitions whose end is known",
    ["stage"],
)
RESTORING = Gauge(
    "storage_events_restoring_partitions",
    "Partitions whose state the emit stage is restoring from the changelogs right now",
)
RESTORE_SECONDS = Histogram(
    "storage_events_restore_seconds",
    "Duration of each state restore on assignment (until the changelogs' ends were read)",
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
RESTORED_RECORDS = Counter(
    "storage_events_restored_records",
    "Changelog records read by state restores",
)


def start_at_zero(
    instances: Iterable[str],
    written_topics: Iterable[str],
    instance_metrics_limit: int = DEFAULT_INSTANCE_METRICS_LIMIT,
) -> None:
    """Create, at 0, every series whose labels are known at start-up; and choose per-instance
    or aggregated series (`instance_metrics_limit`, the module docstring).

    A counter series that first appears with its first increment is invisible to
    `increase()` and `rate()` for that increment: the alerts on dead letters and refused
    records (k8s/monitoring/prometheusrule.yaml) would miss the first one after every start.
    """
    for stage in STAGES:
        DEAD_LETTERED.labels(stage)
        UNREADABLE.labels(stage)
        STAGE_STUCK.labels(stage).set(0)
        STALLED_PARTITIONS.labels(stage).set(0)
    names = list(instances)
    ByInstance.per_instance = len(names) <= instance_metrics_limit
    for instance in names if ByInstance.per_instance else [AGGREGATE]:
        for counter in (EMITTED, DUPLICATES, STALE):
            counter.labels(instance)
        LATENCY.labels(instance)
    FILTERED.labels(AGGREGATE, "no-instance")
    for topic in written_topics:
        for outcome in REFUSED_OUTCOMES:
            REFUSED.labels(topic, outcome)
