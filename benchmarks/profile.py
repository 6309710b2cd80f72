"""Where a worker's time goes, from a py-spy profile (`make bench` writes one with `--profile`).

    python -m benchmarks.profile PROFILE.txt

Reads py-spy's `raw` output (collapsed stacks: `frame;frame;...;leaf count`, one per line)
and attributes every sample of an event-loop thread to one part of the pipeline, per process
(the worker, and its emit child when the stages run in two): walking from the innermost
frame outwards, the first frame that names a part decides. Samples of other threads (the
clients' poll and report threads, Faust's consumer thread) are left out. Prints the share of
each part.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

# (part, substrings of a frame that belong to it), innermost match wins; order breaks ties
# within one frame only.
PARTS: list[tuple[str, tuple[str, ...]]] = [
    ("idle: event loop waiting for I/O", ("select (selectors.py", "poll (selectors.py")),
    ("normalize (normalizers, pure)", ("streams/core/normalizers/",)),
    ("rules + routing", ("streams/core/rules.py", "streams/core/routing.py")),
    ("keyed record out (event JSON)", ("keyed_record (streams/core/records.py", "event_json")),
    ("keyed record in (parse)", ("parse_keyed (streams/core/records.py",)),
    ("ordering", ("streams/core/ordering.py",)),
    ("RocksDB state", ("streams/engine/store.py",)),
    ("dedupe/order plan", ("streams/core/emitting.py",)),
    ("records: headers, dead letters", ("streams/core/records.py",)),
    ("produce (librdkafka: produce calls, reports)", ("streams/engine/librdkafka/producer.py",)),
    ("transactions (librdkafka)", ("streams/engine/librdkafka/transactions.py",)),
    ("restore (aiokafka fetch, decode)", ("aiokafka/consumer/", "aiokafka/record/")),
    (
        "consume (librdkafka: hand-over to the loop)",
        ("streams/engine/librdkafka/consumer.py",),
    ),
    ("Kafka network (aiokafka conn)", ("aiokafka/conn.py", "aiokafka/client.py")),
    ("metrics (prometheus_client)", ("prometheus_client/",)),
    (
        "stage loops",
        ("streams/engine/batches.py", "streams/stages/", "streams/worker.py"),
    ),
    ("Faust/mode runtime", ("/faust/", "/mode/")),
    ("asyncio runtime", ("asyncio/",)),
]


OTHER_THREAD_ROOT = "Thread._bootstrap (threading.py"


def part_of(stack: list[str]) -> str:
    for frame in reversed(stack):
        for part, needles in PARTS:
            if any(needle in frame for needle in needles):
                return part
    return "other"


PROCESS_FRAME = "process "
"""py-spy's `--subprocesses` prefixes each stack with its process chain (`process PID:"cmd"`)."""


def process_name(command: str) -> str:
    """A process of the worker, by its command line: the worker or its stage child."""
    if "streams.stages.child" in command:
        return "emit child process"
    return "worker process"


def summarise(path: Path) -> dict[str, Counter[str]]:
    """Per process (the worker, its emit child when the stages run in two), the samples of
    its main thread per part."""
    samples: dict[str, Counter[str]] = {}
    for line in path.read_text(errors="replace").splitlines():
        stack_text, _, count = line.rpartition(" ")
        if not stack_text or not count.isdigit():
            continue
        stack = stack_text.split(";")
        processes = [frame for frame in stack if frame.startswith(PROCESS_FRAME)]
        stack = stack[len(processes) :]
        if not stack or stack[0].startswith(OTHER_THREAD_ROOT):
            continue
        name = process_name(processes[-1]) if processes else "worker process"
        samples.setdefault(name, Counter())[part_of(stack)] += int(count)
    return samples


def report(path: Path) -> list[str]:
    lines = []
    for name, parts in sorted(summarise(path).items(), reverse=True):
        total = sum(parts.values()) or 1
        lines.append(f"profile {path.name}: {total:,} samples of the {name}'s main thread")
        lines += [f"  {count / total:6.1%}  {part}" for part, count in parts.most_common()]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=Path)
    args = parser.parse_args(argv)
    print("\n".join(report(args.profile)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
