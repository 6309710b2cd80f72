"""streams.migrations around the plan's state reader, and the pure core's policies.

* State as earlier releases wrote it (ids in `seen` before per-key state, ids and marks under
  keys without scopes, `marks` entries moved into `keys` records at the restore) still dedupes
  and orders through `UpgradeReads`, the plan's default reader; the current layout's reader
  (`StateReads`) does not read it; once the windows are closed both decide alike (the
  condition for removing the wrappers: streams.migrations).
* The plan takes an `EmitPolicy` (streams.policies builds it from the settings) and decides
  exactly as with the settings; routing's rules likewise (`apply_rules` of `instance_rules`).
* streams.core's decision modules and streams.migrations import no shell module.
* Stage two's metric children are looked up once per configured instance.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from itertools import product
from typing import Any

import pytest
from support.rules_reference import apply_instance

from streams import metrics
from streams.config import InstanceConfig, Settings
from streams.core.emitting import (
    KEYS,
    MARKS,
    SEEN,
    EmitPlan,
    EmitPolicy,
    KeyedInput,
    mark_key,
    migrated_mark,
    plan_batch,
    seen_key,
)
from streams.core.event import FileEvent
from streams.core.ordering import mark_for
from streams.core.records import keyed_record
from streams.core.rules import InstanceRules, apply_rules
from streams.core.state import OFFSET_KEY, StateReads, encode_expiry
from streams.migrations import LEGACY_UNTIL_KEY, SEEN_UNTIL_KEY, UpgradeReads
from streams.policies import emit_policy, instance_rules
from streams.stages.emit import MetricChildren

NOW = 1_800_000_000.0
SETTINGS = Settings.model_validate(
    {
        "instances": [
            {"name": "a", "dedupe_ttl": "60s"},
            {"name": "b", "dedupe_ttl": "1h", "topic": "out.b", "stale_topic": "late.b"},
        ]
    }
)
REPARTITION = SETTINGS.stream.repartition_topic


class MemoryState:
    def __init__(self) -> None:
        self.data: dict[tuple[str, int, bytes], bytes] = {}

    def get(self, table: str, partition: int, key: bytes) -> bytes | None:
        return self.data.get((table, partition, key))

    def put(self, table: str, partition: int, key: bytes, value: bytes) -> None:
        self.data[(table, partition, key)] = value

    def apply(self, plan: EmitPlan) -> None:
        for (table, partition), values in plan.writes.items():
            for key, value in values.items():
                self.put(table, partition, key, value)


def event(sequencer: str, **fields: Any) -> FileEvent:
    values: dict[str, Any] = {
        "id": f"s3:{sequencer}",
        "type": "created",
        "key": "photos/red flower.jpg",
        "bucket": "uploads",
        "time": datetime(2026, 11, 30, 0, 8, 7, tzinfo=UTC),
        "sequencer": sequencer,
        "provider": "s3",
        "raw": {"eventName": "ObjectCreated:Put"},
    }
    return FileEvent(**(values | fields))


def azure(sequencer: str, request: str) -> FileEvent:
    return FileEvent(
        id=request,
        type="created",
        key="photos/blue flower.jpg",
        bucket="uploads",
        time=datetime(2026, 11, 30, 0, 8, 7, tzinfo=UTC),
        sequencer=sequencer,
        provider="azure",
        raw={
            "topic": "/subscriptions/x/resourceGroups/y/providers/Microsoft.Storage/"
            "storageAccounts/acc"
        },
    )


def keyed(item: FileEvent, instance: str = "a") -> KeyedInput:
    record = keyed_record(REPARTITION, instance, item, None)
    assert record.value is not None
    return KeyedInput(REPARTITION, 0, record.key, record.value, dict(record.headers))


def written_by_the_previous_releases(*emitted: FileEvent) -> MemoryState:
    """A partition as the releases before per-key state and scopes left it, restored by this
    one: ids `a/<id>` (pre-scope) and `a|<scope>|<id>` in `seen`, its marks `a/<bucket>/<key>`
    moved from `marks` into `keys` records (`migrated_mark`), changelog offsets in each table."""
    state = MemoryState()
    for table in (SEEN, MARKS, KEYS):
        state.put(table, 0, OFFSET_KEY, b"41")
    for item in emitted:
        if item.provider == "azure":
            state.put(SEEN, 0, seen_key("a", item.id, "azure@acc"), encode_expiry(NOW + 30))
        state.put(SEEN, 0, seen_key("a", item.id), encode_expiry(NOW + 30))
        stored_mark = json.dumps(mark_for(item).to_json()).encode()
        record = migrated_mark(f"a/{item.bucket}/{item.key}".encode(), stored_mark)
        assert record is not None
        state.put(KEYS, 0, f"a/{item.bucket}/{item.key}".encode(), record)
    return state


def outcomes(plan: EmitPlan) -> dict[tuple[str, str], int]:
    return dict(plan.outcomes)


# --- the wrapper around the state reader ------------------------------------------------------


def test_state_of_the_previous_formats_dedupes_and_orders_through_the_upgrade_reader() -> None:
    old_s3 = event("0055AED6DCD9028200")
    old_azure = azure("0000000000000442000000000002896B", "9f1c")
    state = written_by_the_previous_releases(old_s3, old_azure)
    older = event("0055AED6DCD90281E5")
    batch = [keyed(old_s3), keyed(old_azure), keyed(older)]
    result = plan_batch(batch, SETTINGS, state, NOW, UpgradeReads)
    assert outcomes(result) == {("a", "duplicate"): 2, ("a", "stale"): 1}
    assert result.writes[(KEYS, 0)][SEEN_UNTIL_KEY] == encode_expiry(NOW + 3600)
    assert result.writes[(KEYS, 0)][LEGACY_UNTIL_KEY] == encode_expiry(NOW + 3600)
    # The default reader is the upgrade reader.
    assert outcomes(plan_batch(batch, SETTINGS, state, NOW)) == outcomes(result)


def test_the_current_layout_s_reader_alone_reads_none_of_it() -> None:
    old_s3 = event("0055AED6DCD9028200")
    state = written_by_the_previous_releases(old_s3)
    result = plan_batch([keyed(old_s3)], SETTINGS, state, NOW, StateReads)
    assert outcomes(result) == {("a", "emitted"): 1}
    assert set(result.writes[(KEYS, 0)]) == {mark_key("a", old_s3, "s3")}  # no markers


def test_once_the_windows_closed_the_upgrade_reader_decides_as_the_current_one() -> None:
    """The removal condition of streams.migrations' windows: past them, the wrapper changes no
    decision (the same outcomes, outputs and writes, markers aside)."""
    old = [event("0055AED6DCD9028200"), azure("0000000000000442000000000002896B", "9f1c")]
    state = written_by_the_previous_releases(*old)
    new_id = event("0057", id="s3-id-of-no-provider-form")  # reads past its scoped key
    opened = plan_batch([keyed(item) for item in [*old, new_id]], SETTINGS, state, NOW)
    assert {SEEN_UNTIL_KEY, LEGACY_UNTIL_KEY} <= set(opened.writes[(KEYS, 0)])
    state.apply(opened)
    later = NOW + 3600
    batch = [keyed(item) for item in [*old, event("0055AED6DCD90281E5"), event("0056")]]
    upgraded = plan_batch(batch, SETTINGS, state, later, UpgradeReads)
    current = plan_batch(batch, SETTINGS, state, later, StateReads)
    assert outcomes(upgraded) == outcomes(current)
    assert [(r.topic, r.key, r.value) for r in upgraded.outputs] == [
        (r.topic, r.key, r.value) for r in current.outputs
    ]
    assert upgraded.writes == current.writes


# --- policies ----------------------------------------------------------------------------------


def test_the_plan_decides_alike_with_the_policy_and_with_the_settings() -> None:
    policy = emit_policy(SETTINGS)
    assert isinstance(policy, EmitPolicy)
    assert SETTINGS.emit_policy() is SETTINGS.emit_policy()  # built once per settings
    items = [
        event("0003"),
        event("0001"),
        event("0003"),
        event("0004", type="deleted"),
        azure("0001", "r1"),
    ]
    batch = [keyed(item, instance) for item in items for instance in ("a", "b")]
    batch.append(KeyedInput(REPARTITION, 0, b"k", b"not json"))
    with_settings = plan_batch(batch, SETTINGS, MemoryState(), NOW)
    with_policy = plan_batch(batch, policy, MemoryState(), NOW)
    assert outcomes(with_policy) == outcomes(with_settings)
    assert [(r.topic, r.key, r.value, r.headers) for r in with_policy.outputs] == [
        (r.topic, r.key, r.value, r.headers) for r in with_settings.outputs
    ]
    assert with_policy.writes == with_settings.writes


def test_the_deleted_mark_grace_is_the_setting_else_the_instance_s_ttl() -> None:
    assert emit_policy(SETTINGS).grace("a") == 60.0
    assert emit_policy(SETTINGS).grace("gone") == 3600.0  # the longest TTL
    chosen = Settings.model_validate(
        {"stream": {"deleted_mark_grace_s": 90}, "instances": [{"name": "a"}]}
    )
    assert emit_policy(chosen).grace("a") == emit_policy(chosen).grace("gone") == 90.0


PLUGINS: list[list[dict[str, Any]]] = [
    [],
    [{"name": "versioning", "prefix": ".versions"}],
    [{"name": "dedup", "prefix": ".dedup"}, {"name": "encryption"}],
    [{"name": "softDelete", "prefix": ".trash"}, {"name": "compression"}],
]
INSTANCES = [
    InstanceConfig.model_validate({"name": "a", **fields, "plugins": plugins})
    for fields, plugins in product(
        [{}, {"bucket": "uploads", "prefix": "tenant", "sources": ["s3"]}, {"prefix": "t"}],
        PLUGINS,
    )
]
KEYS_SEEN = [
    "tenant/x.jpg",
    "tenant/.versions/x",
    "tenant/.dedup/blob",
    "tenant/.trash",
    "tenant/../other/x",
    "t/a",
    "other",
    ".dedup/y",
]


@pytest.mark.parametrize("instance", INSTANCES)
def test_routing_s_rules_decide_alike_from_the_policy_and_from_the_configuration(
    instance: InstanceConfig,
) -> None:
    rules = instance_rules(instance)
    assert isinstance(rules, InstanceRules)
    for key, provider, size, bucket in product(
        KEYS_SEEN, ["s3", "gcs", "reconcile"], [None, 0, 5], ["uploads", "other"]
    ):
        item = FileEvent(
            id="x", type="created", key=key, bucket=bucket, size=size, etag="e", provider=provider
        )
        assert apply_rules(item, rules) == apply_instance(item, instance), (key, provider)


# --- purity -----------------------------------------------------------------------------------


def test_the_core_and_the_migrations_import_no_shell_module() -> None:
    modules = [
        "streams.core.emitting",
        "streams.core.rules",
        "streams.core.keystate",
        "streams.core.ordering",
        "streams.core.partitioning",
        "streams.core.state",
        "streams.migrations",
    ]
    code = (
        "import sys\n"
        f"for name in {modules!r}: __import__(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[:2] in "
        "(['streams', 'engine'], ['streams', 'stages'], ['streams', 'config'])))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout


# --- metric children ---------------------------------------------------------------------------


def test_stage_two_takes_each_configured_instance_s_metric_children_once() -> None:
    children = MetricChildren(["a", "b"])
    assert children.latency("a") is children.latency("a") is metrics.LATENCY.labels("a")
    assert children.outcome("b", "stale") is metrics.OUTCOME_COUNTERS["stale"].labels("b")
    children.latency("unknown")  # answered, never kept: the cache is bounded by the instances
    assert set(children.latencies) == {"a"}
    assert set(children.outcomes) == {("b", "stale")}
    assert children.current() is children
