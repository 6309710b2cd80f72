"""Issue 33: the indexed router (streams.core.routing.InstanceIndex) decides exactly what trying
every instance decided, on random configurations and events.

`linear_fan_out` below is the router before the index, kept as the reference: every event
tried against every instance in configuration order, every drop counted. The indexed one must
give the same records, in the same order (instances in configuration order), and raise the
same way; its `filtered` counts are the reference's restricted to the candidates (the
instances whose bucket and prefix hold the event), plus one `("*", "no-instance")` per event
that had none.

Configurations mix overlapping and nested prefixes (`a`, `a/b`, `ab`, `a//b`), `bucket = "*"`,
instances without a bucket, plugins and `sources`; raw topics pin `instances`; events name a
bucket or none, come from several providers (reconcile ones naming an instance), and have keys
with dot segments, percent-escapes, backslashes and absolute parts after a prefix (the
`prefix-escape` reasons of streams.core.rules).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.rules_reference import apply_instance

from streams.config import InstanceConfig, RawTopicConfig, Settings
from streams.core import routing
from streams.core.event import FileEvent
from streams.core.normalizers import MalformedDelivery
from streams.core.records import OutRecord, event_record_bytes, keyed_record
from streams.core.routing import NO_INSTANCE, Routed, TooLarge
from streams.core.rules import Filtered, under_prefix
from streams.engine.topics import EVENT_MAX_MESSAGE_BYTES
from streams.stages.normalize import raw_topic_policy, route_policy

PREFIXES = ["", "a", "a/b", "a/b/c", "ab", "a//b", "/a/", "b", "a.b", "tenant-1", "tenant-10", "."]
BUCKETS = [None, "*", "b1", "b2", ""]
EVENT_BUCKETS = [None, "b1", "b2", "b3", ""]
SOURCES = ["s3", "gcs", "minio", "box", "reconcile"]
PROVIDERS = ["s3", "gcs", "box", "reconcile"]
PLUGINS = ["versioning", "softDelete", "dedup", "encryption", "compression"]
KEY_SEGMENTS = [
    "a",
    "b",
    "c",
    "ab",
    "a.b",
    "tenant-1",
    "tenant-10",
    "",
    ".",
    "..",
    "%2e%2e",
    "%2F",
    "..%2F",
    "\\",
    "x\\..\\..",
    "C:",
    "c:x",
    ".versions",
    ".trash",
    ".dedup",
    ".blobs",
]

key_strategy = st.lists(
    st.sampled_from(KEY_SEGMENTS) | st.text(alphabet="ab/.\\%:", max_size=4), min_size=1, max_size=6
).map("/".join)


@st.composite
def configurations(draw: Any) -> Settings:
    count = draw(st.integers(1, 8))
    names = [f"i{n}" for n in range(count)]
    instances = []
    for name in names:
        instance: dict[str, Any] = {"name": name, "prefix": draw(st.sampled_from(PREFIXES))}
        bucket = draw(st.sampled_from(BUCKETS))
        if bucket is not None:
            instance["bucket"] = bucket
        if draw(st.booleans()):
            instance["sources"] = draw(st.lists(st.sampled_from(SOURCES), min_size=1, max_size=3))
        plugins = draw(st.lists(st.sampled_from(PLUGINS), unique=True, max_size=3))
        if plugins and draw(st.booleans()):  # one of them with a prefix of its own
            plugins[0] = {"name": plugins[0], "prefix": draw(st.sampled_from(["b", ".blobs/"]))}
        instance["plugins"] = plugins
        instances.append(instance)
    topics: list[Any] = ["files.raw"]
    for number in range(draw(st.integers(0, 2))):
        pinned = draw(st.lists(st.sampled_from(names), min_size=1, max_size=count, unique=True))
        topics.append({"name": f"pinned.{number}", "instances": pinned})
    return Settings.model_validate({"stream": {"raw_topics": topics}, "instances": instances})


@st.composite
def events(draw: Any, names: list[str]) -> FileEvent:
    provider = draw(st.sampled_from(PROVIDERS))
    raw: dict[str, Any] | None = None
    if provider == "reconcile" or draw(st.booleans()):
        raw = {"instance": draw(st.sampled_from([*names, "elsewhere", 7]))}
    return FileEvent(
        id=f"{provider}:{draw(st.integers(0, 99))}",
        type=draw(st.sampled_from(["created", "deleted"])),
        key=draw(key_strategy),
        bucket=draw(st.sampled_from(EVENT_BUCKETS)),
        size=draw(st.sampled_from([None, 0, 10])),
        etag=draw(st.sampled_from([None, "e"])),
        provider=provider,
        raw=raw,
    )


def linear_fan_out(
    routed: Routed,
    events: list[FileEvent],
    received_at: bytes | None,
    settings: Settings,
    topic: RawTopicConfig | None,
    only: str | None,
) -> None:
    """streams.core.routing._fan_out before issue 33: every instance, for every event."""
    routed.events = len(events)
    routed.filtered = Counter(routed.filtered)
    for event in events:
        for instance in settings.instances:
            if topic is not None and not topic.reaches(instance.name):
                routed.filtered[(instance.name, "topic")] += 1
                continue
            if only is not None and instance.name != only:
                routed.filtered[(instance.name, "instance")] += 1
                continue
            kept = apply_instance(event, instance)
            if isinstance(kept, Filtered):
                routed.filtered[(instance.name, kept.reason)] += 1
            else:
                keyed = keyed_record(
                    settings.stream.repartition_topic, instance.name, kept, received_at
                )
                size = event_record_bytes(instance.name, kept, keyed)
                if size > EVENT_MAX_MESSAGE_BYTES:
                    raise TooLarge(f"{instance.name}: {size}")
                routed.records.append(keyed)


def linear_reconcile_instance(
    event: FileEvent, topic: RawTopicConfig | None, settings: Settings
) -> str:
    """streams.core.routing.reconcile_instance before issue 33 (a scan of the instances)."""
    named = event.raw.get("instance") if isinstance(event.raw, dict) else None
    if named is not None and not isinstance(named, str):
        raise MalformedDelivery("instance is not a string")
    pinned = topic.instances if topic is not None else None
    if named is None:
        if pinned is None or len(pinned) != 1:
            raise MalformedDelivery("names no instance")
        named = pinned[0]
    if named not in [instance.name for instance in settings.instances]:
        raise MalformedDelivery("not configured")
    if topic is not None and not topic.reaches(named):
        raise MalformedDelivery("not reached")
    return named


def holds(instance: InstanceConfig, event: FileEvent) -> bool:
    """Whether the instance's bucket and prefix hold the event: it is a candidate."""
    bucket = instance.bucket is None or event.bucket is None or event.bucket == instance.bucket
    return bucket and under_prefix(event.key, instance.prefix) is not None


def records(routed: Routed) -> list[tuple[Any, ...]]:
    found: list[OutRecord] = routed.records
    return [(r.topic, r.key, r.value, r.headers, r.partition) for r in found]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_index_decides_what_every_instance_decided(data: Any) -> None:
    config = data.draw(configurations())
    names = [instance.name for instance in config.instances]
    batch = data.draw(st.lists(events(names), min_size=1, max_size=6))
    topic = data.draw(st.sampled_from([None, *config.stream.raw_topics]))
    only = data.draw(st.sampled_from([None, *names]))
    received_at = data.draw(st.sampled_from([None, b"1764461287000"]))

    linear, indexed = Routed(), Routed()
    linear_fan_out(linear, batch, received_at, config, topic, only)
    policy = route_policy(config)
    chosen = policy.raw_topics[topic.name] if topic is not None else None
    routing._fan_out(indexed, batch, received_at, policy, chosen, only)

    assert records(indexed) == records(linear)
    assert indexed.events == linear.events
    expected: Counter[tuple[str, str]] = Counter()
    for event in batch:
        one = Routed()
        linear_fan_out(one, [event], received_at, config, topic, only)
        candidates = {instance.name for instance in config.instances if holds(instance, event)}
        expected.update({k: v for k, v in one.filtered.items() if k[0] in candidates})
        if not candidates:
            expected[NO_INSTANCE] += 1
    assert indexed.filtered == expected


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_reconcile_delivery_names_the_instance_it_did(data: Any) -> None:
    config = data.draw(configurations())
    names = [instance.name for instance in config.instances]
    event = data.draw(events(names))
    topic = data.draw(st.sampled_from([None, *config.stream.raw_topics]))
    try:
        expected: str | None = linear_reconcile_instance(event, topic, config)
    except MalformedDelivery:
        expected = None
    try:
        found: str | None = routing.reconcile_instance(
            event, raw_topic_policy(topic) if topic is not None else None, route_policy(config)
        )
    except MalformedDelivery:
        found = None
    assert found == expected


def test_the_index_is_built_once_per_settings_and_a_copy_builds_its_own() -> None:
    config = Settings.model_validate({"instances": [{"name": "a", "prefix": "a"}]})
    index = route_policy(config).index
    assert route_policy(config).index is index
    grown = config.model_copy(
        update={"instances": (*config.instances, InstanceConfig(name="b", prefix="b"))}
    )
    assert route_policy(grown).index is not index
    assert route_policy(grown).index.candidates(None, "b/x") == [1]
    assert index.candidates(None, "b/x") == []
