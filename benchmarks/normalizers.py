"""Normalizer throughput: records per second per source, on one core.

For every registered source (`streams.core.normalizers.SOURCES`) this takes the source's fixture
payloads from `tests/normalizers/fixtures/<source>/`, keeps those the normalizer accepts and
turns into at least one event, and times a fixed number of `normalize` calls over them:
after a warm-up it works out how many whole passes over the inputs fill `--seconds`, then
times exactly that many calls. Deliveries are built as the tests build them: a bare S3
record list is wrapped in `{"Records": ...}`, GCS attribute and object-resource fixtures
become pull deliveries, Appwrite's File model is sent with the `x-appwrite-webhook-events`
header of a create and of a delete, and Supabase (which has no public fixture) gets
INSERT/UPDATE/DELETE webhooks built from the documented shape, rendered as `jsonb::text`.

Output: the Python version and the CPU model line, then a table of source, inputs used,
deliveries/s, events/s and microseconds per delivery. Inputs are fixed files and fixed
values: no network, no Kafka, no clock in the inputs. The process pins itself to one CPU
where the OS allows it.

Run from the repository root:

    .venv/bin/python -m benchmarks.normalizers [--seconds 2] [--source s3 --source gcs]

(`make bench` runs the first form.)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streams.core.delivery import Delivery
from streams.core.event import FileEvent
from streams.core.normalizers import SOURCES, normalizer_for
from streams.core.normalizers.base import MalformedDelivery

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "normalizers" / "fixtures"

WARM_UP_SHARE = 0.1  # of --seconds, spent running (and timing) before the measured calls


# --- inputs ---------------------------------------------------------------------------------


def _plain(source: str, path: Path) -> list[Delivery]:
    return [Delivery(source=source, body=path.read_bytes())]


def _s3(source: str, path: Path) -> list[Delivery]:
    document = json.loads(path.read_bytes())
    if isinstance(document, list):  # a bare record list, as test_s3 wraps it
        return [Delivery(source=source, body=json.dumps({"Records": document}).encode())]
    return _plain(source, path)


def _gcs(source: str, path: Path) -> list[Delivery]:
    """Push envelopes as they are; attributes and object resources as pull deliveries."""
    document = json.loads(path.read_bytes())
    if "message" in document:
        return _plain(source, path)
    if "eventType" in document:  # message attributes only (test_gcs: payloadFormat NONE)
        return [Delivery(source=source, body=b"", attributes=document | {"payloadFormat": "NONE"})]
    # an object resource, as a pull subscriber receives it with its attributes
    return [
        Delivery(source=source, body=path.read_bytes(), attributes={"eventType": "OBJECT_FINALIZE"})
    ]


def _appwrite_events_header(action: str, bucket: str, file: str) -> str:
    """The patterns Appwrite's e2e tests assert, joined as Webhooks.php joins them."""
    return ",".join(
        [
            f"buckets.{bucket}.files.{file}.{action}",
            f"buckets.{bucket}.files.{file}",
            f"buckets.{bucket}.files.*.{action}",
            f"buckets.{bucket}.files.*",
            f"buckets.{bucket}",
            f"buckets.*.files.{file}.{action}",
            f"buckets.*.files.{file}",
            f"buckets.*.files.*.{action}",
            "buckets.*.files.*",
            "buckets.*",
        ]
    )


def _appwrite(source: str, path: Path) -> list[Delivery]:
    """The File model, delivered once as a create and once as a delete."""
    body = path.read_bytes()
    document = json.loads(body)
    return [
        Delivery(
            source=source,
            body=body,
            headers={
                "x-appwrite-webhook-id": "6560f3d1a2b3c4d5e6f7",
                "x-appwrite-webhook-events": _appwrite_events_header(
                    action, document["bucketId"], document["$id"]
                ),
            },
        )
        for action in ("create", "delete")
    ]


def _jsonb_text(value: Any) -> str:
    """What Postgres `jsonb::text` sends: keys by length then bytes, `", "` and `": "`."""
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda item: (len(item[0].encode()), item[0].encode()))
        inner = ", ".join(
            f"{json.dumps(key, ensure_ascii=False)}: {_jsonb_text(item)}" for key, item in items
        )
        return "{" + inner + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_jsonb_text(item) for item in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _supabase_row(name: str, version: str, etag: str, size: int) -> dict[str, Any]:
    """A `storage.objects` row as `to_jsonb` renders it (the shape test_supabase uses)."""
    stamp = "2024-05-01T10:00:00.123456+00:00"
    return {
        "id": "8a1a5a4e-0b8f-4c47-9a56-2f1f0e3c9d77",
        "bucket_id": "avatars",
        "name": name,
        "owner": "d8c7bce9-cfeb-497b-bd61-e66ce2cbdaa2",
        "owner_id": "d8c7bce9-cfeb-497b-bd61-e66ce2cbdaa2",
        "created_at": stamp,
        "updated_at": stamp,
        "last_accessed_at": stamp,
        "metadata": {
            "eTag": etag,
            "size": size,
            "mimetype": "image/png",
            "cacheControl": "max-age=3600",
            "lastModified": "2024-05-01T10:00:01.000Z",
            "contentLength": size,
            "httpStatusCode": 200,
        },
        "version": version,
        "user_metadata": None,
        "path_tokens": name.split("/"),
    }


def supabase_deliveries() -> list[Delivery]:
    """INSERT, overwrite UPDATE, move UPDATE and DELETE webhooks (no public fixture exists)."""
    v1 = _supabase_row("folder/cat.png", "6d1d2a1e-5f1c-4e0b-9d0a-3a0f6c1b2e11", '"c4ca"', 1024)
    v2 = _supabase_row("folder/cat.png", "b3c8f9e2-7a4d-4c61-8e52-0f9d4a7b6c22", '"c81e"', 2048)
    moved = v2 | {"name": "archive/cat.png", "path_tokens": ["archive", "cat.png"]}
    changes = [
        ("INSERT", v1, None),
        ("UPDATE", v2, v1),
        ("UPDATE", moved, v2),
        ("DELETE", None, v1),
    ]
    return [
        Delivery(
            source="supabase",
            body=_jsonb_text(
                {
                    "type": op,
                    "table": "objects",
                    "record": new,
                    "schema": "storage",
                    "old_record": old,
                }
            ).encode(),
        )
        for op, new, old in changes
    ]


_BUILDERS: dict[str, Callable[[str, Path], list[Delivery]]] = {
    "s3": _s3,
    "gcs": _gcs,
    "appwrite": _appwrite,
}


@dataclass(frozen=True)
class Inputs:
    """The deliveries one source is timed on, and how many events one pass over them makes."""

    deliveries: list[Delivery]
    events_per_pass: int
    skipped: int


def inputs_for(source: str) -> Inputs:
    """The source's fixture deliveries that give at least one event, in file-name order."""
    normalize = normalizer_for(source)
    candidates: list[Delivery] = []
    if source == "supabase":
        candidates = supabase_deliveries()
    build = _BUILDERS.get(source, _plain)
    for path in sorted((FIXTURES / source).glob("*.json")):
        candidates.extend(build(source, path))
    kept: list[Delivery] = []
    events = 0
    for delivery in candidates:
        try:
            produced = normalize(delivery)
        except MalformedDelivery:
            continue  # fixtures kept to show a rejection (redacted, foreign)
        if produced:
            kept.append(delivery)
            events += len(produced)
    return Inputs(kept, events, len(candidates) - len(kept))


# --- timing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    source: str
    inputs: int
    calls: int
    events: int
    seconds: float

    @property
    def deliveries_per_second(self) -> float:
        return self.calls / self.seconds

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds

    @property
    def microseconds_per_delivery(self) -> float:
        return self.seconds / self.calls * 1e6


def _run(
    normalize: Callable[[Delivery], list[FileEvent]], deliveries: Sequence[Delivery], passes: int
) -> float:
    gc.collect()
    start = time.perf_counter()
    for _ in range(passes):
        for delivery in deliveries:
            normalize(delivery)
    return time.perf_counter() - start


def measure(source: str, inputs: Inputs, seconds: float) -> Result:
    """Warm up, size the run to about `seconds`, then time that fixed number of calls."""
    normalize = normalizer_for(source)
    deliveries = inputs.deliveries
    warm_passes, warm_elapsed = 1, _run(normalize, deliveries, 1)
    budget = seconds * WARM_UP_SHARE
    while warm_elapsed < budget:  # doubling: a few rounds reach the warm-up budget
        warm_passes *= 2
        warm_elapsed = _run(normalize, deliveries, warm_passes)
    per_pass = warm_elapsed / warm_passes
    passes = max(1, round(seconds / per_pass))
    elapsed = _run(normalize, deliveries, passes)
    return Result(
        source=source,
        inputs=len(deliveries),
        calls=passes * len(deliveries),
        events=passes * inputs.events_per_pass,
        seconds=elapsed,
    )


# --- report ---------------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU model line of /proc/cpuinfo (Linux), else what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                name, _, value = line.partition(":")
                if name.strip() in ("model name", "Model", "cpu model", "Processor"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def pin_to_one_core() -> str:
    """Run on one CPU only, where the OS allows it; says which."""
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned (no sched_setaffinity here)"
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return f"pinned to CPU {cpu}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.normalizers",
        description="Normalizer throughput per source, on one core, from the test fixtures.",
    )
    parser.add_argument(
        "--seconds", type=float, default=2.0, help="measured time per source (default 2)"
    )
    parser.add_argument(
        "--source",
        action="append",
        choices=SOURCES,
        help="only this source (repeatable; default: every registered source)",
    )
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error("--seconds must be positive")

    print(f"Python {platform.python_version()} ({platform.python_implementation()}) {sys.platform}")
    print(f"CPU: {cpu_model()}")
    print(f"{pin_to_one_core()}; about {args.seconds:g} s per source after a warm-up")
    print()
    header = (
        f"{'source':<12} {'inputs':>6} {'deliveries/s':>13} {'events/s':>11} {'µs/delivery':>12}"
    )
    print(header)
    print("-" * len(header))
    left_out: list[str] = []
    for source in args.source or SOURCES:
        inputs = inputs_for(source)
        if inputs.skipped:
            left_out.append(f"{source} {inputs.skipped}")
        if not inputs.deliveries:
            print(f"{source:<12} {0:>6} {'no usable fixture':>38}")
            continue
        result = measure(source, inputs, args.seconds)
        print(
            f"{source:<12} {result.inputs:>6} {result.deliveries_per_second:>13,.0f} "
            f"{result.events_per_second:>11,.0f} {result.microseconds_per_delivery:>12.1f}",
            flush=True,
        )
    print()
    print("inputs: fixture deliveries that give at least one event; left out (no event or")
    print(f"rejected on purpose): {', '.join(left_out) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
