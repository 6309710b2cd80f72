"""Issue 33: the per-instance metrics stay bounded with thousands of instances: per instance up
to `stream.instance_metrics_limit` instances, one `instance="*"` series above it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from streams import metrics
from streams.config import ConfigError, load_settings


@pytest.fixture(autouse=True)
def per_instance_again() -> Iterator[None]:
    yield
    metrics.ByInstance.per_instance = True


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_up_to_the_limit_every_instance_has_its_series() -> None:
    metrics.start_at_zero(["limit-a", "limit-b"], [], instance_metrics_limit=2)
    assert metrics.ByInstance.per_instance
    assert sample("storage_events_emitted_total", instance="limit-b") == 0
    metrics.FILTERED.labels("limit-a", "source").inc()
    assert sample("storage_events_filtered_total", instance="limit-a", reason="source") == 1
    # What no instance's bucket and prefix hold is made at 0 too, for rate().
    assert sample("storage_events_filtered_total", instance="*", reason="no-instance") is not None


def test_above_the_limit_one_aggregate_series() -> None:
    names = [f"many-{n}" for n in range(3)]
    metrics.start_at_zero(names, [], instance_metrics_limit=2)
    assert not metrics.ByInstance.per_instance
    assert sample("storage_events_emitted_total", instance="many-0") is None
    before = sample("storage_events_emitted_total", instance="*") or 0.0
    metrics.EMITTED.labels("many-1").inc(2)
    metrics.OUTCOME_COUNTERS["emitted"].labels("many-2").inc()
    metrics.LATENCY.labels("many-0").observe(0.2)
    assert sample("storage_events_emitted_total", instance="*") == before + 3
    assert sample("storage_events_emitted_total", instance="many-1") is None
    assert sample("storage_events_latency_seconds_count", instance="many-0") is None
    assert (sample("storage_events_latency_seconds_count", instance="*") or 0) >= 1


def test_the_limit_is_a_setting() -> None:
    environ = {"STREAMS_INSTANCE_METRICS_LIMIT": "0"}
    assert load_settings(environ=environ).stream.instance_metrics_limit == 0
    assert load_settings(environ={}).stream.instance_metrics_limit == 1000
    with pytest.raises(ConfigError, match=r"stream\.instance_metrics_limit"):
        load_settings(environ={"STREAMS_INSTANCE_METRICS_LIMIT": "-1"})
