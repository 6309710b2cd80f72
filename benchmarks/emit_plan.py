"""The emit stage's decisions in-process: `plan_batch` over the bench workload, no Kafka.

    python -m benchmarks.emit_plan [--deliveries 100000] [--batch 500]

Normalizes `benchmarks.pipeline.workload` into keyed records (untimed), spreads them over 4
partitions by key, then times (process CPU) what the emit stage does per batch besides its
Kafka calls: `plan_batch` against a real `StateStore` (rocksdict, a temporary directory), the
changelog records of its writes, and the writes applied. Prints µs per event and the changelog
records the plan produced. Compare two versions by running it in a worktree of each
(`PYTHONPATH=<worktree>`), alternating; `STORAGE_EVENTS_PURE=1` for the interpreted core.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import zlib
from pathlib import Path

from benchmarks.pipeline import worker_config, workload
from streams import core
from streams.config import load_settings
from streams.core import emitting
from streams.core.emitting import KeyedInput, plan_batch
from streams.core.normalizers import normalize
from streams.core.records import RawRecord, delivery_from_raw, keyed_record
from streams.engine.store import StateStore

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deliveries", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500, help="records per partition's batch")
    args = parser.parse_args()
    inputs = keyed_inputs(args.deliveries)
    with tempfile.TemporaryDirectory(prefix="emit-plan-") as tmp:
        config, _ = worker_config(Path(tmp), "emit-plan", "raw")
        settings = load_settings(config, environ={})
        tables = [name for name in ("keys", "seen", "marks") if hasattr(emitting, name.upper())]
        store = StateStore(Path(tmp) / "state", {name: f"{name}-changelog" for name in tables})
        store.open(range(PARTITIONS))
        by_partition: dict[int, list[KeyedInput]] = {}
        for item in inputs:
            by_partition.setdefault(item.partition, []).append(item)
        outputs = changelog = 0
        now = time.time()
        started = time.process_time()
        for items in by_partition.values():
            for start in range(0, len(items), args.batch):
                plan = plan_batch(items[start : start + args.batch], settings, store, now)
                changelog += len(store.changelog_records(plan.writes))
                outputs += len(plan.outputs)
                store.apply(plan.writes, [])
        cpu = time.process_time() - started
        store.close()
    build = getattr(getattr(core, "compiled", None), "STATE", "interpreted")
    print(
        f"emit plan ({', '.join(tables)}; core {build}): {len(inputs):,} events, {outputs:,} "
        f"outputs, {changelog:,} changelog records; CPU {cpu:.2f} s = "
        f"{cpu / len(inputs) * 1e6:.1f} µs per event"
    )


if __name__ == "__main__":
    main()
