"""The handler and outcome series counted in plain ints on the event loop and moved into
Prometheus at each collect (fileevents.metrics RunTally, OutcomeTally): a scrape sees exactly
what `Histogram.observe` / `Counter.inc` per run would have shown, and nothing twice."""

from __future__ import annotations

from collections import Counter

import pytest
from prometheus_client import Histogram

from fileevents.metrics import FileEventsMetrics, RunTally
from fileevents.processing import _HandlerMetrics


def _value(metrics: FileEventsMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry().get_sample_value(name, labels)


def test_runs_counted_in_a_tally_scrape_as_observed_runs_would() -> None:
    tallied = FileEventsMetrics()
    observed = Histogram("reference", "", buckets=tallied.handler_seconds._upper_bounds[:-1])
    tally = tallied.tally("t", "g", "h")
    assert tally is not None
    runs = [0.0, 0.005, 0.0051, 0.3, 7.0, 1000.0]  # on a bound, just past one, past the last
    for seconds in runs:
        tally.ran(seconds, succeeded=seconds < 100)
        observed.observe(seconds)
    labels = {"topic": "t", "group": "g", "handler": "h"}
    for _ in range(2):  # a second scrape adds nothing
        for bound in ("0.005", "0.01", "0.5", "10.0", "+Inf"):
            expected = next(
                sample.value
                for family in observed.collect()
                for sample in family.samples
                if sample.name == "reference_bucket" and sample.labels["le"] == bound
            )
            got = _value(tallied, "fileevents_handler_seconds_bucket", le=bound, **labels)
            assert got == expected, bound
        assert _value(tallied, "fileevents_handler_seconds_count", **labels) == len(runs)
        assert _value(tallied, "fileevents_handler_seconds_sum", **labels) == sum(runs)
        assert _value(tallied, "fileevents_handled_total", **labels) == len(runs) - 1
    tally.ran(0.02, succeeded=True)  # counted after a scrape: the next one has it
    assert _value(tallied, "fileevents_handler_seconds_count", **labels) == len(runs) + 1
    assert _value(tallied, "fileevents_handled_total", **labels) == len(runs)


def test_one_tally_per_series() -> None:
    metrics = FileEventsMetrics()
    assert metrics.tally("t", "g", "h") is metrics.tally("t", "g", "h")
    assert metrics.tally("t", "g", "h") is not metrics.tally("t", "g2", "h")


def test_a_histogram_without_bulk_fields_is_observed_run_by_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert RunTally.fits(FileEventsMetrics().handler_seconds.labels("t", "g", "h"))
    # A prometheus-client whose children lack `_buckets` / `_sum`: no tally, each run
    # observed and counted at once.
    monkeypatch.setattr(RunTally, "fits", staticmethod(lambda seconds: False))
    metrics = FileEventsMetrics()
    assert metrics.tally("t", "g", "h") is None
    series = _HandlerMetrics(metrics, "t", "g", "h")
    series.ran(0.3, succeeded=True)
    series.ran(0.1, succeeded=False)
    labels = {"topic": "t", "group": "g", "handler": "h"}
    assert _value(metrics, "fileevents_handler_seconds_count", **labels) == 2
    assert _value(metrics, "fileevents_handled_total", **labels) == 1


def test_outcomes_follow_the_consumers_counter() -> None:
    metrics = FileEventsMetrics()
    first: Counter[str] = Counter()
    metrics.follow_outcomes("t", "g", first)
    first["handled"] += 3
    labels = {"topic": "t", "group": "g"}
    assert _value(metrics, "fileevents_records_total", outcome="handled", **labels) == 3
    first["handled"] += 1
    first["duplicate"] += 2
    assert _value(metrics, "fileevents_records_total", outcome="handled", **labels) == 4
    assert _value(metrics, "fileevents_records_total", outcome="duplicate", **labels) == 2
    # A second consumer of the same topic and group sharing the metrics: the two add up.
    first["handled"] += 5  # not yet scraped when the second one follows
    second: Counter[str] = Counter()
    metrics.follow_outcomes("t", "g", second)
    second["handled"] += 1
    assert _value(metrics, "fileevents_records_total", outcome="handled", **labels) == 10
    first["handled"] += 2
    assert _value(metrics, "fileevents_records_total", outcome="handled", **labels) == 12
