"""The emit stage's decisions in-process: `plan_batch` over the bench workload, no Kafka.

    python -m benchmarks.emit_plan [--deliveries 100000] [--batch 500] [--rounds 1]

Normalizes `benchmarks.pipeline.workload` into keyed records (untimed), spreads them over 4
partitions by key, settles the cyclic collector as the worker does once its stages run
(streams.stages.pipeline.settle_collector), then times (process CPU) what the emit stage does
per batch besides its Kafka calls: `plan_batch` against a real `StateStore` (rocksdict, a
temporary directory; key records kept decoded across batches where the stage keeps them), the
changelog records of its writes, the writes applied, and the per-instance metrics of the
batch's outcomes and latencies, updated as the stage updates them (streams.stages.emit).
Prints µs per event per round and the changelog records the plan produced.

Compare two versions side by side by running this file against a tree of each, alternating:
from a directory holding only this `benchmarks/` package, `PYTHONPATH=<tree> python -m
benchmarks.emit_plan`, one tree then the other, round after round (the figures of one
machine's run are comparable, not its absolute µs). `STORAGE_EVENTS_PURE=1` for the
interpreted core.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from benchmarks.pipeline import worker_config, workload
from streams import core, metrics
from streams.config import Settings, load_settings
from streams.core import emitting, keystate
from streams.core.emitting import EmitPlan, KeyedInput, plan_batch
from streams.core.normalizers import normalize
from streams.core.records import RawRecord, delivery_from_raw, keyed_record
from streams.engine.store import StateStore
from streams.stages import emit as emit_stage
from streams.stages.pipeline import settle_collector

PARTITIONS = 4


def keyed_inputs(deliveries: int) -> list[KeyedInput]:
    inputs: list[KeyedInput] = []
    for _, value, headers in workload(deliveries, 1):
        delivery = delivery_from_raw(RawRecord("raw", value, dict(headers)), None)
        for event in normalize(delivery):
            keyed = keyed_record("by-key", "default", event, b"1700000000.0")
            partition = zlib.crc32(keyed.key or b"") % PARTITIONS
            inputs.append(
                KeyedInput("by-key", partition, keyed.key, keyed.value or b"", dict(keyed.headers))
            )
    return inputs


class StageMetrics:
    """A batch's metrics as the emit stage of the tree under test updates them: through its
    cached children (`MetricChildren`) where it has them, else `labels()` per update."""

    def __init__(self, settings: Settings) -> None:
        children = getattr(emit_stage, "MetricChildren", None)
        self.children: Any = (
            children(instance.name for instance in settings.instances) if children else None
        )

    def record(self, plan: EmitPlan, acknowledged_at: float) -> None:
        for (instance, outcome), count in plan.outcomes.items():
            if outcome == "dead_letter":
                metrics.DEAD_LETTERED.labels("emit").inc(count)
            elif self.children is not None:
                self.children.outcome(instance, outcome).inc(count)
            else:
                metrics.OUTCOME_COUNTERS[outcome].labels(instance).inc(count)
        for instance, received_at in plan.received_at:
            with contextlib.suppress(ValueError):
                seconds = acknowledged_at - float(received_at)
                if self.children is not None:
                    self.children.latency(instance).observe(seconds)
                else:
                    metrics.LATENCY.labels(instance).observe(seconds)


def one_round(
    inputs: list[KeyedInput], settings: Settings, tmp: Path, batch: int, round_: int
) -> tuple[float, int, int]:
    """(CPU seconds, outputs, changelog records) of one pass over `inputs` with empty state."""
    tables = [name for name in ("keys", "seen", "marks") if hasattr(emitting, name.upper())]
    store = StateStore(tmp / f"state-{round_}", {name: f"{name}-changelog" for name in tables})
    store.open(range(PARTITIONS))
    by_partition: dict[int, list[KeyedInput]] = {}
    for item in inputs:
        by_partition.setdefault(item.partition, []).append(item)
    stage_metrics = StageMetrics(settings)
    # Key records kept decoded across batches, as the stage of the tree under test keeps them.
    kept: dict[str, Any] = {"decoded": keystate.Decoded()} if hasattr(keystate, "Decoded") else {}
    outputs = changelog = 0
    now = time.time()
    started = time.process_time()
    for items in by_partition.values():
        for start in range(0, len(items), batch):
            plan = plan_batch(items[start : start + batch], settings, store, now, **kept)
            changelog += len(store.changelog_records(plan.writes))
            outputs += len(plan.outputs)
            store.apply(plan.writes, [])
            stage_metrics.record(plan, now)
    cpu = time.process_time() - started
    store.close()
    return cpu, outputs, changelog


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deliveries", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500, help="records per partition's batch")
    parser.add_argument("--rounds", type=int, default=1, help="passes, each on empty state")
    args = parser.parse_args()
    inputs = keyed_inputs(args.deliveries)
    build = getattr(getattr(core, "compiled", None), "STATE", "interpreted")
    with tempfile.TemporaryDirectory(prefix="emit-plan-") as tmp:
        config, _ = worker_config(Path(tmp), "emit-plan", "raw")
        settings = load_settings(config, environ={})
        settle_collector()  # after the inputs and settings: the worker's heap at its start
        for round_ in range(args.rounds):
            cpu, outputs, changelog = one_round(inputs, settings, Path(tmp), args.batch, round_)
            print(
                f"emit plan (core {build}; {emitting.__file__}): {len(inputs):,} events, "
                f"{outputs:,} outputs, {changelog:,} changelog records; CPU {cpu:.2f} s = "
                f"{cpu / len(inputs) * 1e6:.1f} µs per event",
                flush=True,
            )


if __name__ == "__main__":
    main()
