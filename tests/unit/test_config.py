"""streams.config: the TOML file, environment overrides, durations, instances, and the errors.

Every mistake must raise ConfigError naming the field and where it came from (the file, or
the environment variable that overrode it).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from streams.config import (
    DEFAULT_DEDUPE_TTL_S,
    ConfigError,
    InstanceConfig,
    Settings,
    load_settings,
    parse_duration,
)


def write(tmp_path: Path, text: str, name: str = "streams.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> Settings:
    return load_settings(write(tmp_path, text), environ or {})


def config_error(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> str:
    """The message of the ConfigError the config raises; it must name the file."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ or {})
    message = str(caught.value)
    assert str(path) in message
    return message


# --- where the configuration comes from ----------------------------------------------------


def test_no_file_gives_one_default_instance_taking_every_bucket() -> None:
    settings = load_settings(None, {})
    assert [instance.name for instance in settings.instances] == ["default"]
    default = settings.instances[0]
    assert (default.bucket, default.prefix, default.plugins) == (None, "", ())
    assert default.dedupe_ttl == DEFAULT_DEDUPE_TTL_S == 86400.0
    assert default.output_topic == "files.events.default"
    assert default.stale_output_topic == "files.stale.default"
    assert settings.kafka.bootstrap_servers == "127.0.0.1:9092"


def test_file_named_by_argument(tmp_path: Path) -> None:
    settings = load(tmp_path, '[[instances]]\nname = "tenant-a"\nbucket = "uploads"\n')
    assert [(i.name, i.bucket) for i in settings.instances] == [("tenant-a", "uploads")]


def test_file_named_by_streams_config(tmp_path: Path) -> None:
    path = write(tmp_path, '[[instances]]\nname = "from-env"\n')
    settings = load_settings(None, {"STREAMS_CONFIG": str(path)})
    assert settings.instances[0].name == "from-env"


def test_argument_wins_over_streams_config(tmp_path: Path) -> None:
    argument = write(tmp_path, '[[instances]]\nname = "argument"\n', "a.toml")
    variable = write(tmp_path, '[[instances]]\nname = "variable"\n', "b.toml")
    settings = load_settings(argument, {"STREAMS_CONFIG": str(variable)})
    assert settings.instances[0].name == "argument"


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    text = '[kafka]\nbootstrap_servers = "file:9092"\n[stream]\npartitions = 2\n'
    environ = {
        "KAFKA_BOOTSTRAP_SERVERS": "env-a:9092,env-b:9092",
        "STREAMS_PARTITIONS": "8",
        "STREAMS_APP_ID": "other-app",
        "WEBHOOK_PORT": "9090",
        "WEBHOOK_INSECURE_SOURCES": "s3, minio,",
    }
    settings = load(tmp_path, text, environ)
    assert settings.kafka.bootstrap_servers == "env-a:9092,env-b:9092"
    assert settings.stream.partitions == 8
    assert settings.stream.app_id == "other-app"
    assert settings.webhook.port == 9090
    assert settings.webhook.insecure_sources == ("s3", "minio")


def test_environment_overrides_without_a_file() -> None:
    settings = load_settings(None, {"STREAMS_DATA_DIR": "/data/streams"})
    assert settings.stream.data_dir == Path("/data/streams")


def test_empty_environment_variable_does_not_override(tmp_path: Path) -> None:
    settings = load(tmp_path, "[stream]\npartitions = 3\n", {"STREAMS_PARTITIONS": ""})
    assert settings.stream.partitions == 3


def test_bad_environment_value_names_the_field_and_the_variable(tmp_path: Path) -> None:
    message = config_error(tmp_path, "[stream]\npartitions = 2\n", {"STREAMS_PARTITIONS": "many"})
    assert "stream.partitions" in message
    assert "STREAMS_PARTITIONS" in message


def test_bad_environment_value_without_a_file() -> None:
    with pytest.raises(ConfigError, match=r"webhook\.port.*WEBHOOK_PORT"):
        load_settings(None, {"WEBHOOK_PORT": "0"})


def test_environment_override_of_a_section_that_is_not_a_table(tmp_path: Path) -> None:
    # Used to crash with TypeError while applying the override.
    message = config_error(tmp_path, 'kafka = "oops"\n', {"KAFKA_BOOTSTRAP_SERVERS": "h:1"})
    assert "kafka" in message


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="no such file") as caught:
        load_settings(missing, {})
    assert str(missing) in str(caught.value)


def test_missing_file_named_by_streams_config_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="STREAMS_CONFIG") as caught:
        load_settings(None, {"STREAMS_CONFIG": str(missing)})
    assert str(missing) in str(caught.value)


def test_directory_instead_of_a_file(tmp_path: Path) -> None:
    # Used to escape as IsADirectoryError.
    with pytest.raises(ConfigError, match="cannot be read") as caught:
        load_settings(tmp_path, {})
    assert str(tmp_path) in str(caught.value)


@pytest.mark.parametrize(
    "content",
    [b"[[instances]\nname = 1\n", b"name = \n", b'[kafka]\nbootstrap_servers = "\xff"\n'],
    ids=["broken-table", "missing-value", "not-utf8"],
)
def test_not_toml(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "streams.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match="not valid TOML") as caught:
        load_settings(path, {})
    assert str(path) in str(caught.value)


# --- durations -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("24h", 86400.0),
        ("90s", 90.0),
        ("1h30m", 5400.0),
        ("1d", 86400.0),
        ("1.5h", 5400.0),
        ("250ms", 0.25),
        (" 2m ", 120.0),
        ("1h 30m", 5400.0),
        (3600, 3600.0),
        (0.5, 0.5),
    ],
)
def test_parse_duration(value: object, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    "value",
    [
        "",
        "   ",
        "24",
        "h",
        "1w",
        "-1h",
        "0s",
        "1h-",
        "abc",
        "1h30",
        0,
        -5,
        True,
        None,
        [1],
        math.nan,
        math.inf,
    ],
)
def test_parse_duration_rejects(value: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


@given(
    days=st.integers(0, 30),
    hours=st.integers(0, 48),
    minutes=st.integers(0, 120),
    seconds=st.integers(0, 120),
)
def test_parse_duration_adds_its_parts(days: int, hours: int, minutes: int, seconds: int) -> None:
    total = days * 86400 + hours * 3600 + minutes * 60 + seconds
    text = f"{days}d{hours}h{minutes}m{seconds}s"
    if total == 0:
        with pytest.raises(ValueError):
            parse_duration(text)
    else:
        assert parse_duration(text) == total


@pytest.mark.parametrize(
    ("toml_value", "seconds"), [('"90s"', 90.0), ("3600", 3600.0), ('"1h30m"', 5400.0)]
)
def test_dedupe_ttl_from_file(tmp_path: Path, toml_value: str, seconds: float) -> None:
    settings = load(tmp_path, f'[[instances]]\nname = "a"\ndedupe_ttl = {toml_value}\n')
    assert settings.instances[0].dedupe_ttl == seconds


@pytest.mark.parametrize("toml_value", ['"soon"', "0", "-60", '""', "nan", "inf", "true"])
def test_bad_dedupe_ttl_names_the_field(tmp_path: Path, toml_value: str) -> None:
    message = config_error(
        tmp_path,
        f'[[instances]]\nname = "a"\n[[instances]]\nname = "b"\ndedupe_ttl = {toml_value}\n',
    )
    assert "instances.1.dedupe_ttl" in message
    assert "instances.0" not in message


# --- instances -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [("/users/", "users"), ("users/", "users"), ("users", "users"), ("//a/b//", "a/b"), ("/", "")],
)
def test_prefix_normalised(prefix: str, expected: str) -> None:
    assert InstanceConfig(name="a", prefix=prefix).prefix == expected


def test_prefix_normalised_from_file(tmp_path: Path) -> None:
    settings = load(tmp_path, '[[instances]]\nname = "a"\nprefix = "/users/"\n')
    assert settings.instances[0].prefix == "users"


@pytest.mark.parametrize(("bucket", "expected"), [("*", None), (None, None), ("up", "up")])
def test_bucket_star_means_every_bucket(bucket: str | None, expected: str | None) -> None:
    assert InstanceConfig(name="a", bucket=bucket).bucket == expected


def test_plugins_as_strings_get_default_prefixes(tmp_path: Path) -> None:
    text = (
        '[[instances]]\nname = "a"\n'
        'plugins = ["dedup", "versioning", "softDelete", "encryption", "compression"]\n'
    )
    instance = load(tmp_path, text).instances[0]
    assert [(plugin.name, plugin.prefix) for plugin in instance.plugins] == [
        ("dedup", ".dedup"),
        ("versioning", ".versions"),
        ("softDelete", ".trash"),
        ("encryption", None),
        ("compression", None),
    ]


def test_plugins_as_tables(tmp_path: Path) -> None:
    text = (
        '[[instances]]\nname = "a"\n'
        'plugins = [{ name = "dedup", prefix = "/.blobs/" }, { name = "versioning" },\n'
        '  "softDelete"]\n'
    )
    instance = load(tmp_path, text).instances[0]
    assert [(plugin.name, plugin.prefix) for plugin in instance.plugins] == [
        ("dedup", ".blobs"),
        ("versioning", ".versions"),
        ("softDelete", ".trash"),
    ]
    dedup = instance.plugin("dedup")
    assert dedup is not None and dedup.prefix == ".blobs"
    assert instance.plugin("encryption") is None


def test_unknown_plugin_names_the_field(tmp_path: Path) -> None:
    message = config_error(tmp_path, '[[instances]]\nname = "a"\nplugins = ["versioning", "zip"]\n')
    assert "instances.0.plugins.1.name" in message


def test_unknown_key_in_a_plugin_table_names_the_field(tmp_path: Path) -> None:
    text = '[[instances]]\nname = "a"\nplugins = [{ name = "dedup", prefx = ".b" }]\n'
    assert "instances.0.plugins.0.prefx" in config_error(tmp_path, text)


def test_topics_default_from_the_name() -> None:
    instance = InstanceConfig(name="tenant-a")
    assert instance.output_topic == "files.events.tenant-a"
    assert instance.stale_output_topic == "files.stale.tenant-a"


def test_topics_configured(tmp_path: Path) -> None:
    text = '[[instances]]\nname = "a"\ntopic = "out.a"\nstale_topic = "late.a"\n'
    instance = load(tmp_path, text).instances[0]
    assert (instance.output_topic, instance.stale_output_topic) == ("out.a", "late.a")


@pytest.mark.parametrize("topic", ["bad topic", "", "a/b", "é", "x" * 250, ".", ".."])
@pytest.mark.parametrize("field", ["topic", "stale_topic"])
def test_invalid_instance_topic_names_the_field(tmp_path: Path, field: str, topic: str) -> None:
    message = config_error(tmp_path, f'[[instances]]\nname = "a"\n{field} = "{topic}"\n')
    assert f"instances.0.{field}" in message
    assert "not a valid Kafka topic name" in message


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('[stream]\nraw_topics = ["files.raw", "bad topic"]\n', "stream.raw_topics.1.name"),
        ('[stream]\nraw_topics = [{ name = ".." }]\n', "stream.raw_topics.0.name"),
        ('[stream]\ndead_letter_topic = "dead letter"\n', "stream.dead_letter_topic"),
        ('[stream]\nrepartition_topic = "by/key"\n', "stream.repartition_topic"),
        ('[webhook]\nraw_topic = "raw topic"\n', "webhook.raw_topic"),
    ],
)
def test_invalid_stream_topic_names_the_field(tmp_path: Path, text: str, field: str) -> None:
    message = config_error(tmp_path, text)
    assert field in message
    assert "not a valid Kafka topic name" in message


def test_raw_topics_as_strings_and_tables(tmp_path: Path) -> None:
    text = (
        '[stream]\nraw_topics = ["files.raw",\n'
        '  { name = "minio.events", default_source = "minio" }]\n'
    )
    topics = load(tmp_path, text).stream.raw_topics
    assert [(topic.name, topic.default_source) for topic in topics] == [
        ("files.raw", None),
        ("minio.events", "minio"),
    ]


def test_what_a_raw_topic_carries_and_reaches(tmp_path: Path) -> None:
    text = (
        '[stream]\nraw_topics = [{ name = "files.raw", sources = ["s3", "minio"] },\n'
        '  { name = "minio.events", default_source = "minio" },\n'
        '  { name = "files.reconcile.a", sources = ["reconcile"], instances = ["a"] }]\n'
        '[[instances]]\nname = "a"\n[[instances]]\nname = "b"\n'
    )
    stream = load(tmp_path, text).stream
    raw, minio, reconcile = stream.raw_topics
    assert (raw.carries("s3"), raw.carries("reconcile"), raw.reaches("b")) == (True, False, True)
    assert (minio.carried_sources, minio.carries("s3")) == (("minio",), False)
    assert (reconcile.reaches("a"), reconcile.reaches("b")) == (True, False)
    assert stream.raw_topic_for("reconcile", "a") == "files.reconcile.a"
    assert stream.raw_topic_for("reconcile", "b") is None
    assert stream.events_bound("minio") == 1


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        (
            '[stream]\nraw_topics = [{ name = "r", instances = ["nope"] }]\n',
            "stream.raw_topics.0.instances",
            "no instance named 'nope'",
        ),
        (
            '[stream]\nraw_topics = [{ name = "r", sources = ["dropbox"] }]\n',
            "stream.raw_topics.0.sources",
            "unknown source 'dropbox'",
        ),
        (
            '[stream]\nraw_topics = [{ name = "r", default_source = "minio", sources = ["s3"] }]\n',
            "stream.raw_topics.0",
            "default_source: 'minio' is not one of the topic's sources",
        ),
        (
            '[stream]\nraw_topics = [{ name = "files.raw", sources = ["minio"] }]\n'
            '[webhook]\ninsecure_sources = ["s3"]\n',
            "webhook.raw_topic",
            "files.raw does not carry s3",
        ),
        (
            "[stream]\nmax_events_per_delivery = { s3 = 0 }\n",
            "stream.max_events_per_delivery",
            "not a positive number",
        ),
        (
            "[stream]\nmax_events_per_delivery = { dropbox = 3 }\n",
            "stream.max_events_per_delivery",
            "unknown source 'dropbox'",
        ),
    ],
)
def test_a_raw_topic_mistake_names_the_field(
    tmp_path: Path, text: str, field: str, message: str
) -> None:
    error = config_error(tmp_path, text)
    assert field in error and message in error, error


def test_duplicate_instance_names(tmp_path: Path) -> None:
    text = (
        '[[instances]]\nname = "a"\n[[instances]]\nname = "b"\n'
        '[[instances]]\nname = "a"\nprefix = "x"\n'
    )
    message = config_error(tmp_path, text)
    assert "instances" in message
    assert "unique" in message
    assert "repeated: a" in message


def test_no_instances(tmp_path: Path) -> None:
    assert "at least one instance" in config_error(tmp_path, "instances = []\n")


@pytest.mark.parametrize(
    ("text", "shared"),
    [
        (
            '[[instances]]\nname = "a"\n[[instances]]\nname = "b"\ntopic = "files.events.a"\n',
            "files.events.a",
        ),
        ('[[instances]]\nname = "a"\nstale_topic = "files.events.a"\n', "files.events.a"),
        ('[[instances]]\nname = "a"\ntopic = "files.dead-letter"\n', "files.dead-letter"),
        ('[[instances]]\nname = "a"\nstale_topic = "files.raw"\n', "files.raw"),
    ],
    ids=["two-instances", "own-stale", "dead-letter", "raw"],
)
def test_shared_topics_are_refused(tmp_path: Path, text: str, shared: str) -> None:
    # Two tenants' events in one topic would leak keys across tenants.
    message = config_error(tmp_path, text)
    assert "instances" in message
    assert f"used twice: {shared}" in message


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('[[instances]]\nname = "a"\nbuckets = "x"\n', "instances.0.buckets"),
        ("[stream]\npartition = 4\n", "stream.partition"),
        ('[kafka]\nbootstrap = "h:1"\n', "kafka.bootstrap"),
        ('instance = "a"\n', "instance"),
        ('[webhook.routes.minio]\ntoken = "s3cr3t"\n', "webhook.routes.minio.token"),
    ],
)
def test_unknown_keys_name_the_field(tmp_path: Path, text: str, field: str) -> None:
    message = config_error(tmp_path, text)
    assert f"{field}: Extra inputs are not permitted" in message


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('[[instances]]\nbucket = "x"\n', "instances.0.name"),
        ('[[instances]]\nname = "a b"\n', "instances.0.name"),
        ('[[instances]]\nname = "a/b"\n', "instances.0.name"),
        ('[[instances]]\nname = "a"\nprefix = 3\n', "instances.0.prefix"),
        ("[stream]\npartitions = 0\n", "stream.partitions"),
        ("[webhook]\nport = 70000\n", "webhook.port"),
    ],
)
def test_bad_values_name_the_field(tmp_path: Path, text: str, field: str) -> None:
    assert f"{field}:" in config_error(tmp_path, text)


def test_every_mistake_is_reported_at_once(tmp_path: Path) -> None:
    text = '[[instances]]\nname = "a"\ndedupe_ttl = "x"\ntopic = "bad topic"\n'
    message = config_error(tmp_path, text)
    assert "instances.0.dedupe_ttl" in message
    assert "instances.0.topic" in message


def test_instance_lookup() -> None:
    settings = Settings(instances=(InstanceConfig(name="a"), InstanceConfig(name="b")))
    assert settings.instance("b").name == "b"
    with pytest.raises(ConfigError, match=r"no instance named 'c' \(configured: a, b\)"):
        settings.instance("c")


def test_ten_thousand_instances_validate_fast_and_errors_stay_one_short_line(
    tmp_path: Path,
) -> None:
    """Issue 33: the uniqueness checks were quadratic (13 s for 10,000 instances)."""
    names = [f"tenant-{n}" for n in range(10_000)]
    instances = [{"name": name, "bucket": "uploads", "prefix": name} for name in names]
    started = time.process_time()
    settings = Settings.model_validate({"instances": instances})
    assert time.process_time() - started < 2.0  # 0.05 s here; 13 s before
    assert settings.instance("tenant-9999").prefix == "tenant-9999"
    with pytest.raises(ConfigError) as unknown:
        settings.instance("nope")
    assert str(unknown.value).endswith("tenant-18, tenant-19 and 9,980 more)")
    repeated = [*instances, {"name": "tenant-7"}]
    with pytest.raises(ValidationError, match=r"names must be unique, repeated: tenant-7 \["):
        Settings.model_validate({"instances": repeated})
    config = tmp_path / "streams.toml"
    config.write_text(
        '[stream]\nraw_topics = [{ name = "r", instances = ["nope"] }]\n'
        + "".join(f'[[instances]]\nname = "{name}"\n' for name in names)
    )
    with pytest.raises(ConfigError) as pinned:
        load_settings(config, environ={})
    assert "stream.raw_topics.0.instances: no instance named 'nope'" in str(pinned.value)
    assert len(str(pinned.value)) < 1_000 and "and 9,980 more" in str(pinned.value)
