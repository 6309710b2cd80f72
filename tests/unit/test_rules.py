"""streams.core.rules: which events an instance keeps (bucket, prefix, plugins) and how it sees
them."""

from __future__ import annotations

import posixpath
import re
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.config import InstanceConfig
from streams.core.event import FileEvent
from streams.core.rules import (
    Filtered,
    apply_rules,
    escapes_root,
    open_instances_warning,
    under_prefix,
)
from streams.policies import instance_rules


def apply_instance(event: FileEvent, instance: InstanceConfig) -> FileEvent | Filtered:
    """The event as `instance` sees it: its rules as the worker builds them, applied."""
    return apply_rules(event, instance_rules(instance))


def event(key: str, bucket: str | None = "uploads", **fields: Any) -> FileEvent:
    values: dict[str, Any] = {
        "id": "s3:1",
        "type": "created",
        "key": key,
        "bucket": bucket,
        "size": 10,
        "etag": "abc",
        "version_id": "v1",
        "time": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        "sequencer": "0055AED6DCD90281E5",
        "provider": "s3",
        "raw": {"k": "v"},
    }
    return FileEvent(**(values | fields))


def instance(**fields: Any) -> InstanceConfig:
    return InstanceConfig.model_validate({"name": "t"} | fields)


def kept(result: FileEvent | Filtered) -> FileEvent:
    assert isinstance(result, FileEvent), result
    return result


# --- under_prefix --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "prefix", "expected"),
    [
        ("users/a.txt", "users", "a.txt"),
        ("users/a/b.txt", "users", "a/b.txt"),
        ("users/a/", "users", "a/"),
        ("a/b/c", "a/b", "c"),
        ("anything", "", "anything"),
        ("", "", ""),
        ("users-archive/x", "users", None),
        ("usersx", "users", None),
        ("users", "users", None),
        ("users/", "users", None),
        ("other/users/x", "users", None),
        ("Users/x", "users", None),
        ("a/bc/d", "a/b", None),
    ],
)
def test_under_prefix(key: str, prefix: str, expected: str | None) -> None:
    assert under_prefix(key, prefix) == expected


SEGMENT = st.text(alphabet="ab-_.", min_size=1, max_size=4)
PREFIXES = st.lists(SEGMENT, min_size=1, max_size=3).map("/".join)
KEYS = st.text(alphabet="ab-_./", max_size=12)


@given(key=KEYS, prefix=PREFIXES)
def test_under_prefix_only_returns_keys_inside_the_prefix(key: str, prefix: str) -> None:
    relative = under_prefix(key, prefix)
    inside = key.startswith(prefix + "/") and len(key) > len(prefix) + 1
    assert (relative is not None) == inside
    if relative is not None:
        assert relative != ""
        assert key == f"{prefix}/{relative}"


@given(prefix=PREFIXES, relative=KEYS.filter(bool))
def test_under_prefix_strips_exactly_the_prefix(prefix: str, relative: str) -> None:
    assert under_prefix(f"{prefix}/{relative}", prefix) == relative


@given(prefix=PREFIXES, other=PREFIXES, rest=KEYS)
def test_a_sibling_sharing_the_first_letters_never_matches(
    prefix: str, other: str, rest: str
) -> None:
    # `users` vs `users-archive/...`: the same characters but not the same path segment.
    key = f"{prefix}{other}/{rest}"
    assert under_prefix(key, prefix) is None


# --- buckets -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("configured", "event_bucket", "keeps"),
    [
        ("uploads", "uploads", True),
        ("uploads", "other", False),
        ("uploads", None, True),
        ("*", "uploads", True),
        ("*", "other", True),
        ("*", None, True),
        (None, "anything", True),
        (None, None, True),
    ],
)
def test_bucket_rule(configured: str | None, event_bucket: str | None, keeps: bool) -> None:
    config = instance() if configured is None else instance(bucket=configured)
    result = apply_instance(event("a.txt", bucket=event_bucket), config)
    if keeps:
        assert kept(result).bucket == event_bucket
    else:
        assert result == Filtered("bucket")


def test_bucket_is_checked_before_the_prefix() -> None:
    result = apply_instance(event("elsewhere/a", bucket="other"), instance(bucket="b", prefix="u"))
    assert result == Filtered("bucket")


def test_bucket_names_are_compared_exactly() -> None:
    assert apply_instance(event("a", bucket="Uploads"), instance(bucket="uploads")) == Filtered(
        "bucket"
    )


# --- prefix --------------------------------------------------------------------------------


@pytest.mark.parametrize("configured", ["users", "/users/", "users/"])
def test_prefix_is_stripped(configured: str) -> None:
    original = event("users/photos/a b.jpg")
    result = kept(apply_instance(original, instance(prefix=configured)))
    assert result.key == "photos/a b.jpg"
    # Nothing else changes.
    assert result.model_dump(exclude={"key"}) == original.model_dump(exclude={"key"})


@pytest.mark.parametrize("key", ["users-archive/x", "users", "users/", "other/users/x", "x"])
def test_outside_the_prefix_is_filtered(key: str) -> None:
    assert apply_instance(event(key), instance(prefix="users")) == Filtered("prefix")


def test_no_prefix_keeps_the_key() -> None:
    assert kept(apply_instance(event("users/a"), instance())).key == "users/a"


def test_nested_prefix() -> None:
    config = instance(prefix="tenants/a")
    assert kept(apply_instance(event("tenants/a/x/y"), config)).key == "x/y"
    assert apply_instance(event("tenants/ab/x"), config) == Filtered("prefix")


# --- plugins -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("plugin", "internal"),
    [("versioning", ".versions"), ("softDelete", ".trash"), ("dedup", ".dedup")],
)
@pytest.mark.parametrize(
    "relative", ["{p}/x", "{p}/a/b", "{p}", "{p}/"], ids=["child", "deep", "itself", "marker"]
)
def test_dropping_plugins_drop_their_prefix_relative_to_the_instance_prefix(
    plugin: str, internal: str, relative: str
) -> None:
    key = "users/" + relative.format(p=internal)
    result = apply_instance(event(key), instance(prefix="users", plugins=[plugin]))
    assert result == Filtered(f"plugin:{plugin}")


@pytest.mark.parametrize(
    ("plugin", "internal"),
    [("versioning", ".versions"), ("softDelete", ".trash"), ("dedup", ".dedup")],
)
def test_dropping_plugins_leave_lookalikes_alone(plugin: str, internal: str) -> None:
    config = instance(prefix="users", plugins=[plugin])
    for relative in (f"{internal}x/a", f"a/{internal}/b", f"x{internal}", f"{internal}-old"):
        assert kept(apply_instance(event(f"users/{relative}"), config)).key == relative


def test_plugin_prefix_outside_the_instance_prefix_is_a_prefix_drop() -> None:
    config = instance(prefix="users", plugins=["versioning"])
    assert apply_instance(event(".versions/users/a"), config) == Filtered("prefix")


def test_without_the_plugin_its_prefix_is_an_ordinary_key() -> None:
    config = instance(plugins=["softDelete"])
    assert kept(apply_instance(event(".versions/a"), config)).key == ".versions/a"


def test_custom_plugin_prefixes() -> None:
    config = instance(
        plugins=[
            {"name": "versioning", "prefix": "_history"},
            {"name": "softDelete", "prefix": "/bin/"},
            {"name": "dedup", "prefix": "blobs/store"},
        ]
    )
    assert apply_instance(event("_history/a"), config) == Filtered("plugin:versioning")
    assert apply_instance(event("bin/a"), config) == Filtered("plugin:softDelete")
    assert apply_instance(event("blobs/store/abc"), config) == Filtered("plugin:dedup")
    for key in (".versions/a", ".trash/a", ".dedup/a", "blobs/other"):
        assert kept(apply_instance(event(key), config)).key == key


@pytest.mark.parametrize("size", [0, None])
def test_dedup_clears_size_and_etag_of_empty_or_unsized_objects(size: int | None) -> None:
    result = kept(apply_instance(event("a", size=size), instance(plugins=["dedup"])))
    assert (result.size, result.etag) == (None, None)
    assert result.version_id == "v1"


def test_dedup_keeps_size_and_etag_of_sized_objects() -> None:
    result = kept(apply_instance(event("a", size=1), instance(plugins=["dedup"])))
    assert (result.size, result.etag) == (1, "abc")


def test_without_dedup_an_empty_object_keeps_its_etag() -> None:
    result = kept(apply_instance(event("a", size=0), instance(plugins=["versioning"])))
    assert (result.size, result.etag) == (0, "abc")


@pytest.mark.parametrize("plugin", ["encryption", "compression"])
@pytest.mark.parametrize("kind", ["created", "deleted"])
@pytest.mark.parametrize("size", [0, 5, None])
def test_size_changing_plugins_clear_size_on_every_event(
    plugin: str, kind: str, size: int | None
) -> None:
    result = kept(apply_instance(event("a", type=kind, size=size), instance(plugins=[plugin])))
    assert result.size is None
    assert result.etag == "abc"
    assert result.type == kind


def test_dedup_with_encryption() -> None:
    config = instance(plugins=["dedup", "encryption"])
    sized = kept(apply_instance(event("a", size=7), config))
    assert (sized.size, sized.etag) == (None, "abc")
    empty = kept(apply_instance(event("a", size=0), config))
    assert (empty.size, empty.etag) == (None, None)


def test_the_input_event_is_not_changed() -> None:
    original = event("users/a", size=0)
    result = kept(apply_instance(original, instance(prefix="users", plugins=["dedup"])))
    assert (result.key, result.size) == ("a", None)
    assert (original.key, original.size, original.etag) == ("users/a", 0, "abc")


# --- sources ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "bucket", "reason"),
    [
        ("box", None, "source"),  # no bucket: it would pass the bucket filter
        ("cloudinary", None, "source"),
        ("appwrite", "uploads", "source"),  # names the instance's bucket
        ("minio", "uploads", "source"),
        ("s3", "other", "bucket"),
    ],
)
def test_an_instance_with_sources_keeps_only_their_events(
    provider: str, bucket: str | None, reason: str
) -> None:
    config = instance(bucket="uploads", prefix="tenant-a", sources=["s3", "eventbridge"])
    result = apply_instance(event("tenant-a/x", bucket=bucket, provider=provider), config)
    assert result == Filtered(reason)


@pytest.mark.parametrize("provider", ["s3", "eventbridge", "reconcile"])
def test_listed_sources_and_reconcile_are_kept(provider: str) -> None:
    config = instance(bucket="uploads", sources=["s3", "eventbridge"])
    assert kept(apply_instance(event("x", provider=provider), config)).key == "x"


def test_a_reconcile_delivery_is_kept_by_the_instance_whose_run_found_it_only() -> None:
    # A Box or Cloudinary drift names no bucket: without the pin it reached every instance.
    found_by_a = event("x", bucket=None, provider="reconcile", raw={"instance": "a"})
    assert kept(apply_instance(found_by_a, instance(name="a"))).key == "x"
    assert apply_instance(found_by_a, instance(name="b")) == Filtered("instance")
    assert apply_instance(found_by_a, instance(name="b", bucket="uploads")) == Filtered("instance")
    # A provider's own event naming an "instance" field is not pinned by it.
    boxed = event("x", bucket=None, provider="box", raw={"instance": "a"})
    assert kept(apply_instance(boxed, instance(name="b"))).key == "x"


def test_without_sources_every_source_is_kept() -> None:
    assert kept(apply_instance(event("x", bucket=None, provider="box"), instance())).key == "x"


def test_a_warning_names_the_bucket_bound_instances_without_sources() -> None:
    instances = [
        instance(name="open", bucket="uploads"),
        instance(name="closed", bucket="uploads", sources=["s3"]),
        instance(name="everything"),
    ]
    warning = open_instances_warning(instances)
    assert warning is not None and "open" in warning and "closed" not in warning
    assert "everything" not in warning and "sources" in warning
    assert open_instances_warning(instances[1:]) is None


def test_the_warning_names_twenty_instances_and_counts_the_others() -> None:
    instances = [instance(name=f"tenant-{n}", bucket="uploads") for n in range(10_000)]
    warning = open_instances_warning(instances)
    assert warning is not None
    assert "tenant-19 and 9,980 more take one bucket" in warning and "tenant-20," not in warning


# --- dot segments leaving the prefix ------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "tenant-a/../tenant-b/x",
        "tenant-a/x/../../tenant-b/x",
        "tenant-a/..%2Ftenant-b/x",
        "tenant-a/x%2F..%2F..%2Ftenant-b%2Fy",
        "tenant-a/%2e%2e/tenant-b/x",
        "tenant-a/%252E%252E/tenant-b/x",
        "tenant-a/..\\tenant-b\\x",
        "tenant-a/x%5C..%5C..%5Ctenant-b",
        "tenant-a/.",
        "tenant-a/x/..",
        "tenant-a//",
        "tenant-a/%2F",
    ],
)
def test_a_key_resolving_outside_the_prefix_is_dropped(key: str) -> None:
    result = apply_instance(event(key), instance(bucket="uploads", prefix="tenant-a"))
    assert result == Filtered("prefix-escape")
    assert kept(apply_instance(event(key), instance(bucket="uploads"))).key == key


@pytest.mark.parametrize(
    ("key", "relative"),
    [
        ("tenant-a/x/../y", "x/../y"),
        ("tenant-a/./y", "./y"),
        ("tenant-a/..y", "..y"),
        ("tenant-a/photo.v2..jpg", "photo.v2..jpg"),
        ("tenant-a/100%25.txt", "100%25.txt"),
        ("tenant-a/%zz/..", None),
    ],
)
def test_dot_segments_that_stay_inside_are_kept_verbatim(key: str, relative: str | None) -> None:
    result = apply_instance(event(key), instance(prefix="tenant-a"))
    if relative is None:
        assert result == Filtered("prefix-escape")
    else:
        assert kept(result).key == relative


# --- absolute keys after the prefix (issue 31, item 2) ---------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "tenant-a//etc/cron.d/pwn",  # POSIX root: a join with the consumer's root drops it
        "tenant-a/\\Windows\\pwn",  # the root of the current drive on Windows
        "tenant-a/C:pwn",  # a drive, relative to its current directory
        "tenant-a/c:/Windows/pwn",
        "tenant-a/Z:\\pwn",
        "tenant-a/\\\\server\\share\\pwn",  # UNC
        "tenant-a/\\\\?\\C:\\pwn",  # a Win32 device path
        "tenant-a///server/share/pwn",
        "tenant-a/%2Fetc/cron.d/pwn",  # each reading, as for dot segments: percent-decoded
        "tenant-a/%5CWindows%5Cpwn",
        "tenant-a/C%3Apwn",
        "tenant-a/%252Fetc/pwn",
    ],
)
def test_an_absolute_key_after_the_prefix_is_dropped_as_prefix_escape(key: str) -> None:
    result = apply_instance(event(key), instance(bucket="uploads", prefix="tenant-a"))
    assert result == Filtered("prefix-escape")
    # Without a prefix there is no root to leave: the key is the bucket's, verbatim.
    assert kept(apply_instance(event(key), instance(bucket="uploads"))).key == key


@pytest.mark.parametrize(
    ("key", "relative"),
    [
        ("tenant-a/x//etc/pwn", "x//etc/pwn"),  # not leading: inside the root
        ("tenant-a/x\\Windows", "x\\Windows"),
        ("tenant-a/x/C:pwn", "x/C:pwn"),
        ("tenant-a/ab:c", "ab:c"),  # no drive: one letter only
        ("tenant-a/1:x", "1:x"),
        ("tenant-a/\u00e9:x", "\u00e9:x"),  # drive letters are ASCII
        ("tenant-a/C", "C"),
        ("tenant-a/100%25.txt", "100%25.txt"),
    ],
)
def test_keys_naming_no_root_of_their_own_are_kept(key: str, relative: str) -> None:
    assert kept(apply_instance(event(key), instance(prefix="tenant-a"))).key == relative


@given(relative=st.text(alphabet="ab./\\%2eEF5Cc:3A", max_size=16))
def test_escapes_root_agrees_with_normpath_on_every_reading(relative: str) -> None:
    readings = [relative]
    while (decoded := unquote(readings[-1])) != readings[-1]:
        readings.append(decoded)
    readings += [reading.replace("\\", "/") for reading in readings]

    def outside(reading: str) -> bool:
        # Joined as a consumer joins it: a drive (Windows) or a root of its own (`join`
        # keeps an absolute path) replaces the consumer's root.
        if re.match(r"[A-Za-z]:", reading):
            return True
        parts = reading.split("/")
        for end in range(1, len(parts) + 1):
            here = posixpath.normpath(posixpath.join("/root", "/".join(parts[:end])))
            if here != "/root" and not here.startswith("/root/"):
                return True
        return posixpath.normpath(posixpath.join("/root", reading)) == "/root"

    assert escapes_root(relative) == any(outside(reading) for reading in readings)
