"""The normalize stage's decisions in-process: `route` over the bench workload, no Kafka.

    python -m benchmarks.route_plan [--deliveries 50000] [--rounds 5]

The counterpart of benchmarks.emit_plan for stage one: `make bench`'s workload (S3, S3 through
SNS, GCS and Azure deliveries, streams.core.routing.route with the bench's config) timed
whole, then in parts: reading the delivery from the raw record, the normalizer per source,
and the rest of `route` (bounds, rules, fan-out, the keyed record and its headers). Best of
three passes, this process's CPU, with the collector as the worker sets it
(streams.stages.pipeline.settle_collector). `STORAGE_EVENTS_PURE=1` times the interpreted
core instead of the compiled one.

Then stage two's reading of the keyed records route wrote (streams.core.records.parse_keyed):
from their head (streams.core.keyedhead) against from the event's JSON (the same records
without the head, as the previous release wrote them), in alternating rounds, median.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.pipeline import worker_config, workload
from streams import core
from streams.config import load_settings
from streams.core.delivery import Delivery
from streams.core.normalizers import normalize
from streams.core.records import (
    KEYED_HEAD_HEADER,
    RawRecord,
    delivery_from_raw,
    headers_dict,
    parse_keyed,
)
from streams.core.routing import route
from streams.stages.normalize import route_policy
from streams.stages.pipeline import settle_collector


def best_of_three(work: Callable[[], object]) -> float:
    """The least CPU seconds of three runs of `work`."""
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        work()
        best = min(best, time.process_time() - started)
    return best


def normalize_all(deliveries: list[Delivery]) -> None:
    for delivery in deliveries:
        normalize(delivery)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deliveries", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5, help="of the keyed-record reading")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="route-plan-") as tmp:
        config, _ = worker_config(Path(tmp), "route-plan", "raw")
        settings = load_settings(config, environ={})
    raws = [
        (RawRecord("raw", value, headers_dict(headers)), key)
        for key, value, headers in workload(args.deliveries, 1)
    ]
    deliveries = [delivery_from_raw(raw, None) for raw, _ in raws]
    settle_collector()
    count = len(raws)
    build = getattr(getattr(core, "compiled", None), "STATE", "interpreted")
    policy = route_policy(settings)
    whole = best_of_three(lambda: [route(raw, key, policy) for raw, key in raws])
    reading = best_of_three(lambda: [delivery_from_raw(raw, None) for raw, _ in raws])
    print(f"route (core {build}): {count:,} deliveries, {whole / count * 1e6:.1f} µs per delivery")
    print(f"  reading the delivery      {reading / count * 1e6:5.1f} µs")
    by_source: dict[str, list[Delivery]] = {}
    for delivery in deliveries:
        wrapped = delivery.source == "s3" and b'"Type"' in delivery.body[:200]
        by_source.setdefault(delivery.source + (" (SNS)" if wrapped else ""), []).append(delivery)
    normalizing = 0.0
    for source, group in sorted(by_source.items()):
        spent = best_of_three(functools.partial(normalize_all, group))
        normalizing += spent
        print(
            f"  normalizer {source:<14} {spent / len(group) * 1e6:5.1f} µs "
            f"({len(group) / count:.0%} of deliveries)"
        )
    rest = whole - reading - normalizing
    print(f"  normalizers, all          {normalizing / count * 1e6:5.1f} µs")
    print(f"  the rest of route         {rest / count * 1e6:5.1f} µs (bounds, rules, keyed record)")
    keyed = [
        (record.value or b"", dict(record.headers))
        for raw, key in raws
        for record in route(raw, key, policy).records
        if record.topic == policy.repartition_topic
    ]
    parse_keyed_rounds(keyed, args.rounds)


def parse_keyed_rounds(keyed: list[tuple[bytes, dict[str, bytes]]], rounds: int) -> None:
    """Stage two's parse_keyed of `keyed` from the head, and of the same records without it
    (from the event's JSON), alternating; the median of `rounds` each."""
    without = [
        (value, {name: data for name, data in headers.items() if name != KEYED_HEAD_HEADER})
        for value, headers in keyed
    ]

    def read(records: list[tuple[bytes, dict[str, bytes]]]) -> float:
        started = time.process_time()
        for value, headers in records:
            parse_keyed(value, headers)
        return time.process_time() - started

    head: list[float] = []
    json: list[float] = []
    for _ in range(rounds):
        json.append(read(without))
        head.append(read(keyed))
    head.sort()
    json.sort()
    count = len(keyed)
    middle = rounds // 2
    print(
        f"stage two, parse_keyed of {count:,} keyed records (median of {rounds} alternating "
        f"rounds): from the head {head[middle] / count * 1e6:.2f} µs, from the JSON "
        f"{json[middle] / count * 1e6:.2f} µs ({json[middle] / head[middle]:.2f}x)"
    )


if __name__ == "__main__":
    main()
