"""One Prometheus exposition from several processes' (the worker and its stage child,
streams.stages.supervisor): each family once, with each series' samples merged.

Counters, histograms and summaries are sums over the processes (each process counts its own
work; a series both have, e.g. one `streams.metrics.start_at_zero` made at 0 in both, adds
up). So are gauges (a stage's gauges are set by the process running it, the other's stay 0;
`process_resident_memory_bytes` is the worker's memory, all processes), except those where a
sum means nothing: `*_created` and `process_start_time_seconds` (the earliest),
`process_max_fds` and `python_info` (the first process').
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]
"""A sample's name and its labels, sorted."""

FIRST: Callable[[float, float], float] = lambda first, _later: first  # noqa: E731
MERGE_BY_NAME: dict[str, Callable[[float, float], float]] = {
    "process_start_time_seconds": min,
    "process_max_fds": FIRST,
    "python_info": FIRST,
}


def merge_rule(sample_name: str) -> Callable[[float, float], float]:
    """How two processes' values of one series become one."""
    if sample_name.endswith("_created"):
        return min
    return MERGE_BY_NAME.get(sample_name, lambda a, b: a + b)


def snapshot(registry: CollectorRegistry = REGISTRY) -> list[Metric]:
    """A registry's families now, as plain values a pipe carries (pickled): no exposition
    text to render in one process and parse in the other."""
    return list(registry.collect())


def samples(families: Iterable[Metric]) -> dict[SeriesKey, float]:
    """Every sample of `families` by name and labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in families
        for sample in family.samples
    }


def merge(processes: Iterable[Iterable[Metric]]) -> bytes:
    """The processes' families (the worker's first) as one exposition: families in the
    order first seen, each series once, its samples merged by `merge_rule`."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[SeriesKey, float]] = {}
    for process in processes:
        for family in process:
            known = families.setdefault(
                family.name, Metric(family.name, family.documentation, family.type, family.unit)
            )
            series = values.setdefault(known.name, {})
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key in series:
                    series[key] = merge_rule(sample.name)(series[key], sample.value)
                else:
                    series[key] = sample.value
    for name, family in families.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(families.values())))
    return generate_latest(registry)


class _Fixed:
    """A collector of given families (for generate_latest's rendering and escaping)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families
