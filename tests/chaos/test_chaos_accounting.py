"""The chaos harness's accounting, without Kafka: a loss, a wrongful stale, an order violation
and a missing dead letter are each caught (so a PASS of the slow run means something)."""

from __future__ import annotations

import json

from benchmarks.chaos import Read, Result, Workload, build_workload, compare
from streams.core.normalizers import normalize
from streams.core.records import RawRecord, delivery_from_raw, output_record, stale_record


def events_by_id(work: Workload) -> dict[str, object]:
    found = {}
    for item in work.deliveries:
        if item.change is None:
            continue
        delivery = delivery_from_raw(RawRecord("raw", item.value, dict(item.headers)), None)
        for event in normalize(delivery):
            found.setdefault(event.id, event)
    return found


def as_read(record: object, offset: int) -> Read:
    return Read(0, offset, record.key, record.value, dict(record.headers))  # type: ignore[attr-defined]


def perfect(work: Workload) -> tuple[list[Read], list[Read], list[Read]]:
    """What a correct stream writes: every change in per-key order, malformed dead-lettered."""
    events = events_by_id(work)
    ordered = sorted(work.changes, key=lambda change: (change.bucket, change.key, change.token))
    outputs = [
        as_read(output_record("out", "default", events[change.event_id]), n)  # type: ignore[arg-type]
        for n, change in enumerate(ordered)
    ]
    dead = [
        Read(0, n, None, item.value, {}) for n, item in enumerate(work.deliveries) if item.token
    ]
    return outputs, [], dead


def figures(work: Workload, outputs: list[Read], stale: list[Read], dead: list[Read]) -> Result:
    result = Result()
    compare(work, outputs, stale, dead, result)
    return result


def test_a_perfect_stream_passes() -> None:
    work = build_workload(400, 50, seed=3)
    result = figures(work, *perfect(work))
    assert result.failures == [], result.failures
    assert result.emitted == result.changes_sent == len(work.changes)
    assert result.malformed_sent == result.malformed_dead_lettered > 0


def test_a_missing_change_is_lost_and_a_copy_is_a_duplicate() -> None:
    work = build_workload(400, 50, seed=3)
    outputs, stale, dead = perfect(work)
    result = figures(work, [outputs[0], *outputs[2:], outputs[5]], stale, dead)
    assert result.lost == 1 and result.duplicated == 1
    assert any("lost" in failure for failure in result.failures)


def test_stale_counts_only_when_a_newer_change_of_the_key_was_emitted() -> None:
    work = build_workload(400, 50, seed=3)
    outputs, _, dead = perfect(work)
    events = events_by_id(work)
    # the oldest change of a key with two or more changes, set aside instead of emitted
    first = outputs[0]
    event = json.loads(first.value or b"")
    newer = [o for o in outputs[1:] if json.loads(o.value or b"")["key"] == event["key"]]
    stale = [as_read(stale_record("stale", "default", events[event["id"]], "older"), 0)]  # type: ignore[arg-type]
    result = figures(work, outputs[1:], stale, dead)
    if newer:
        assert result.lost == 0 and result.stale == 1
    # without the newer one emitted, the same stale record is a wrongful drop
    alone = [o for o in outputs[1:] if json.loads(o.value or b"")["key"] != event["key"]]
    result = figures(work, alone, stale, dead)
    assert result.wrongly_stale == 1 and result.lost >= 1


def test_an_older_event_after_a_newer_one_is_an_order_violation() -> None:
    work = build_workload(400, 50, seed=3)
    outputs, stale, dead = perfect(work)
    keys = [json.loads(o.value or b"")["key"] for o in outputs]
    index = next(n for n in range(1, len(keys)) if keys[n] == keys[n - 1])
    swapped = [*outputs[: index - 1], outputs[index], outputs[index - 1], *outputs[index + 1 :]]
    result = figures(work, swapped, stale, dead)
    assert result.order_violations == 1
    assert result.lost == 0


def test_a_malformed_delivery_missing_from_the_dead_letters_fails() -> None:
    work = build_workload(400, 50, seed=3)
    outputs, stale, dead = perfect(work)
    result = figures(work, outputs, stale, dead[1:])
    assert result.malformed_dead_lettered == result.malformed_sent - 1
    assert any("dead-letter" in failure for failure in result.failures)
