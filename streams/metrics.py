"""Prometheus metrics of the worker, per instance; served on the worker's web port at /metrics.

Every event the stream does not emit is counted here with why: filtered (bucket, prefix or
plugin), duplicate, stale or dead-lettered.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECEIVED = Counter("storage_events_received", "Raw deliveries read from the raw topics", ["source"])
NORMALIZED = Counter(
    "storage_events_normalized", "Canonical events found in raw deliveries", ["source"]
)
FILTERED = Counter(
    "storage_events_filtered", "Events an instance does not keep, by reason", ["instance", "reason"]
)
EMITTED = Counter(
    "storage_events_emitted", "Events written to an instance's output topic", ["instance"]
)
DUPLICATES = Counter(
    "storage_events_duplicates",
    "Events dropped because their id was seen within the TTL",
    ["instance"],
)
STALE = Counter(
    "storage_events_stale", "Events older than one already emitted for their key", ["instance"]
)
DEAD_LETTERED = Counter(
    "storage_events_dead_lettered", "Records sent to the dead-letter topic", ["stage"]
)
EXPIRED = Counter("storage_events_dedupe_expired", "Dedupe entries removed after their TTL")
SEND_RETRIES = Counter(
    "storage_events_send_retries",
    "Writes to Kafka tried again after a failure: batches, transactions, producer start-ups",
)
LATENCY = Histogram(
    "storage_events_latency_seconds",
    "From the bridge receiving a delivery to its event being acknowledged on the output topic",
    ["instance"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)

OUTCOME_COUNTERS = {"emitted": EMITTED, "duplicate": DUPLICATES, "stale": STALE}
STAGE_SECONDS = Counter(
    "storage_events_stage_seconds",
    "Wall-clock time of each stage's loop by phase: waiting for records (fetch), deciding and "
    "writing a batch until Kafka acknowledged it (handle), committing offsets (commit)",
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
