"""fileevents' `decode_event` alone: CPU µs per event over benchmarks.consumer's events.

The 100,000 record values `benchmarks.consumer` writes (`FileEvent.model_dump_json` of its
`fill` events), decoded by `fileevents.codec.decode_event` in a process of their own; with
`--baseline GIT_REF`, also by fileevents as of GIT_REF (its package from `git archive`, first
on PYTHONPATH), the two alternating round by round: before and after side by side in one run.

    python -m benchmarks.decode_event --rounds 5 --baseline 97b5050~1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def values(count: int, keys: int) -> list[bytes]:
    """The record values of benchmarks.consumer's `fill`, in its order."""
    from benchmarks.consumer import bench_events

    return [event.model_dump_json().encode() for event in bench_events(count, keys)]


def run_round(count: int, keys: int) -> dict[str, float | str]:
    """One round in this process: every value decoded once (after a warm-up of 1,000)."""
    from fileevents import codec

    records = values(count, keys)
    for value in records[:1000]:
        codec.decode_event(value)
    started = time.process_time()
    for value in records:
        codec.decode_event(value)
    cpu = time.process_time() - started
    return {"us_per_event": cpu / count * 1e6, "codec": codec.__file__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", default="bench", choices=["bench", "round"])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=12_494)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", metavar="GIT_REF")
    args = parser.parse_args()
    if args.role == "round":
        print(json.dumps(run_round(args.count, args.keys)))
        return

    from benchmarks.consumer import baseline_package

    variants: list[tuple[str, Path | None]] = [("working tree", None)]
    if args.baseline:
        baseline = baseline_package(args.baseline, Path(tempfile.mkdtemp(prefix="fileevents-")))
        variants.insert(0, (f"as of {args.baseline}", baseline))
    print(f"load average at the start: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    figures: dict[str, list[float]] = {label: [] for label, _ in variants}
    for number in range(args.rounds):
        for label, package in variants:
            env = dict(os.environ)
            if package is not None:
                env["PYTHONPATH"] = os.pathsep.join([str(package), env.get("PYTHONPATH", "")])
            command = [sys.executable, "-m", "benchmarks.decode_event", "--role", "round",
                       "--count", str(args.count), "--keys", str(args.keys)]  # fmt: skip
            result = json.loads(
                subprocess.run(
                    command, cwd=ROOT, env=env, capture_output=True, text=True, check=True
                ).stdout
            )
            figures[label].append(float(result["us_per_event"]))
            print(f"round {number + 1}, {label}: {result['us_per_event']:.2f} µs per event "
                  f"({result['codec']})", flush=True)  # fmt: skip
    print(f"load average at the end: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| decode_event | CPU µs per event, each round | median |\n|---|---|---|")
    for label, rounds in figures.items():
        each = " / ".join(f"{x:.2f}" for x in rounds)
        print(f"| fileevents, {label} | {each} | {statistics.median(rounds):.2f} |")


if __name__ == "__main__":
    main()
