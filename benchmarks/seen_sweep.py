"""How long one sweep turn holds the emit stage up over a big `seen` partition.

    python -m benchmarks.seen_sweep [--ids 2000000] [--expired-share 0.5] [--dir PATH]

No broker: one real RocksDB database (`streams.engine.store.StateStore`, the worker's options)
filled with `--ids` dedupe ids in the format `streams.core.emitting` writes (key
`default/s3:` + 32 hex digits, value the absolute expiry as an ASCII float), a share of them
already expired, interleaved in key order as hashed ids are, flushed to SST files. Then, with
the worker's decision (`seen_revision`) and bound (`SEEN_SWEEP_SCAN`), sweep turns are timed
one by one, each turn's removals applied locally as the worker applies them, until one whole
pass has gone by: the first turn, the slowest, the turns a pass takes, and what the whole pass
read. Last, one unbounded read of the whole table that is left (the live ids): what every sweep
read before the scan was bounded, when nothing had expired.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from streams.core.emitting import SEEN, SEEN_SWEEP_SCAN, encode_expiry, seen_revision
from streams.engine.store import Revision, StateStore

FILL_BATCH = 50_000
SWEEP_LIMIT = 50_000  # streams.worker.SWEEP_LIMIT (importing the worker builds the Faust app)


def fill(store: StateStore, ids: int, expired_share: float, now: float) -> int:
    """Write `ids` ids to partition 0, every id whose hash falls under `expired_share`
    already expired; returns how many are expired."""
    expired = 0
    for start in range(0, ids, FILL_BATCH):
        values: dict[bytes, bytes | None] = {}
        for index in range(start, min(start + FILL_BATCH, ids)):
            digest = hashlib.sha256(str(index).encode()).hexdigest()
            gone = int(digest[32:40], 16) < expired_share * 2**32
            expired += gone
            values[f"default/s3:{digest[:32]}".encode()] = encode_expiry(
                now - 60 if gone else now + 86_400
            )
        store.apply({(SEEN, 0): values})
    store.flush(SEEN, 0)
    return expired


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=2_000_000)
    parser.add_argument("--expired-share", type=float, default=0.5)
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (deleted)")
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="seen-sweep-"))
    store = StateStore(directory, {SEEN: "seen-changelog"})
    store.open([0])
    try:
        now = time.time()
        started = time.perf_counter()
        expired = fill(store, args.ids, args.expired_share, now)
        print(
            f"filled {args.ids:,} ids ({expired:,} expired) in "
            f"{time.perf_counter() - started:.1f} s",
            flush=True,
        )

        def revise(key: bytes, stored: bytes) -> Revision | None:
            return seen_revision(key, stored, now)

        turns: list[tuple[float, int, int]] = []
        while True:
            started = time.perf_counter()
            swept = store.revisions(SEEN, 0, SWEEP_LIMIT, revise, SEEN_SWEEP_SCAN)
            seconds = time.perf_counter() - started
            turns.append((seconds, swept.read, len(swept.changes)))
            if swept.changes:
                store.apply({(SEEN, 0): swept.changes})
            if swept.finished:
                break
        first, slowest = turns[0], max(turns)
        median = statistics.median(seconds for seconds, _, _ in turns)
        removed = sum(found for _, _, found in turns)
        print(
            f"one turn (SEEN_SWEEP_SCAN = {SEEN_SWEEP_SCAN:,}): first {first[0] * 1e3:.0f} ms "
            f"({first[1]:,} read, {first[2]:,} expired), median {median * 1e3:.0f} ms, "
            f"slowest {slowest[0] * 1e3:.0f} ms; "
            f"a pass: {len(turns)} turns, {sum(s for s, _, _ in turns):.1f} s in all, "
            f"{sum(read for _, read, _ in turns):,} read, {removed:,} removed",
            flush=True,
        )
        started = time.perf_counter()
        whole = store.revisions(SEEN, 0, SWEEP_LIMIT, revise)
        seconds = time.perf_counter() - started
        print(
            f"an unbounded read of what is left: {whole.read:,} ids in {seconds:.2f} s "
            f"= {seconds / max(whole.read, 1) * 1e6:.2f} us an id ({len(whole.changes)} expired)"
        )
        if removed != expired or whole.changes:
            raise SystemExit(f"the pass removed {removed:,} of {expired:,} expired ids")
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
