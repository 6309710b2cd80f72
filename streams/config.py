"""Configuration: storage instances and the stream's settings, validated at start-up.

Sources, later ones winning: defaults, the TOML file named by `STREAMS_CONFIG`, then the
environment variables listed in `ENVIRONMENT`. A mistake stops start-up with a `ConfigError`
that names the field.

```toml
[kafka]
bootstrap_servers = "127.0.0.1:9092"      # env KAFKA_BOOTSTRAP_SERVERS wins
security_protocol = "SASL_SSL"            # TLS and SASL: streams.kafka_settings

[stream]
raw_topics = ["files.raw", { name = "minio.events", default_source = "minio" }]
# a topic may also say which sources its records may claim and which instances they reach:
# { name = "files.reconcile.tenant-a", sources = ["reconcile"], instances = ["tenant-a"] }
dead_letter_topic = "files.dead-letter"
max_events_per_delivery = { s3 = 10 }   # per source; default what its provider sends
partitions = 4
replication_factor = 1
min_insync_replicas = 1      # at most replication_factor; 2 of 3 in production
max_clock_skew_s = 300       # event times further ahead are not recorded for ordering

[[instances]]
name = "tenant-a"            # required; also names the output topics
bucket = "uploads"           # a bucket name, or "*" for every bucket; absent = every bucket
prefix = "tenant-a"          # optional
sources = ["s3"]             # optional: the only sources it accepts; absent = every source
plugins = ["versioning", "softDelete", { name = "dedup", prefix = ".blobs" }, "encryption"]
dedupe_ttl = "24h"           # seconds as a number, or a duration string; default 24 h
topic = "files.events.tenant-a"   # default files.events.<name>
# Its reconcile CronJob (python -m streams cronjobs): a cron schedule, or false for none;
# default: hourly when `sources` names supabase, none otherwise.
reconcile_schedule = "17 * * * *"
reconcile_endpoint_url = "https://example-project.supabase.co/storage/v1/s3"  # --endpoint-url
```
"""

from __future__ import annotations

import math
import os
import re
import tomllib
import zlib
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from streams.kafka_settings import ENVIRONMENT as KAFKA_ENVIRONMENT
from streams.kafka_settings import KafkaSettings
from streams.schedule import ScheduleError
from streams.schedule import parse as parse_schedule

if TYPE_CHECKING:
    from streams.core.emitting import EmitPolicy

TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DEFAULT_DEDUPE_TTL_S = 24 * 3600.0
MAX_BATCH_SIZE = 100_000
"""The most records a stage reads and handles at once (`batch_size`, `emit_batch_size`)."""
RECONCILED_BY_DEFAULT = ("supabase",)
"""Sources whose instances get a scheduled reconcile unless `reconcile_schedule = false`:
Supabase sends each Database Webhook once, so a missed one is found only by a listing."""

PluginName = Literal["dedup", "versioning", "softDelete", "encryption", "compression"]
PLUGIN_DEFAULT_PREFIXES: dict[str, str] = {
    "dedup": ".dedup",
    "versioning": ".versions",
    "softDelete": ".trash",
}

ENVIRONMENT = {
    **{variable: ("kafka", field) for variable, field in KAFKA_ENVIRONMENT.items()},
    "STREAMS_DATA_DIR": ("stream", "data_dir"),
    "STREAMS_WEB_PORT": ("stream", "web_port"),
    "STREAMS_WEB_HOST": ("stream", "web_host"),
    "STREAMS_PROCESSING_GUARANTEE": ("stream", "processing_guarantee"),
    "STREAMS_GROUP_INSTANCE_ID": ("stream", "group_instance_id"),
    "STREAMS_ENGINE": ("stream", "engine"),
    "STREAMS_GROUP_PROTOCOL": ("stream", "group_protocol"),
    "STREAMS_LEAVE_GROUP_ON_STOP": ("stream", "leave_group_on_stop"),
    "STREAMS_PARTITIONS": ("stream", "partitions"),
    "STREAMS_REPLICATION_FACTOR": ("stream", "replication_factor"),
    "STREAMS_MIN_INSYNC_REPLICAS": ("stream", "min_insync_replicas"),
    "STREAMS_APP_ID": ("stream", "app_id"),
    "STREAMS_MAX_CLOCK_SKEW_S": ("stream", "max_clock_skew_s"),
    "STREAMS_DELETED_MARK_GRACE_S": ("stream", "deleted_mark_grace_s"),
    "STREAMS_PROGRESS_INTERVAL_S": ("stream", "progress_interval_s"),
    "STREAMS_STAGE_PROCESSES": ("stream", "stage_processes"),
    "STREAMS_INSTANCE_METRICS_LIMIT": ("stream", "instance_metrics_limit"),
    "WEBHOOK_HOST": ("webhook", "host"),
    "WEBHOOK_PORT": ("webhook", "port"),
    "WEBHOOK_RAW_TOPIC": ("webhook", "raw_topic"),
    "WEBHOOK_INSECURE_SOURCES": ("webhook", "insecure_sources"),
    "WEBHOOK_ADMIN_HOST": ("webhook", "admin_host"),
    "WEBHOOK_ADMIN_PORT": ("webhook", "admin_port"),
}


_T = TypeVar("_T")
_DERIVED = "__derived__"
"""The key of Settings.derived's cache in a Settings object's `__dict__`."""


class ConfigError(Exception):
    """The configuration is wrong; the message names the field and the source."""


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string such as `24h`, `90s`, `1h30m`, `1d`."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '24h'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip().replace(" ", "")
        parts = DURATION_PART.findall(text)
        if "".join(number + unit for number, unit in parts) != text:
            raise ValueError(f"{value!r} is not a duration like '24h', '90s' or '1h30m'")
        seconds = sum(float(number) * DURATION_UNITS[unit] for number, unit in parts)
    else:
        raise ValueError("a duration is a number of seconds or a string like '24h'")
    if not math.isfinite(seconds):
        raise ValueError("a duration must be finite")
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    return seconds


def check_topic_name(value: str) -> str:
    """A name Kafka accepts for a topic (it refuses `.` and `..`)."""
    if not TOPIC_NAME.match(value) or value in (".", ".."):
        raise ValueError(f"{value!r} is not a valid Kafka topic name")
    return value


def check_sources(value: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """A `sources` list: known sources, at least one, each once; None stays None."""
    from streams.core.normalizers import SOURCES  # here: the normalizers import the models

    if value is None:
        return None
    if not value:
        raise ValueError("needs at least one source (leave it out to accept every source)")
    for source in value:
        if source not in SOURCES:
            raise ValueError(f"unknown source {source!r} (known: {', '.join(SOURCES)})")
    return tuple(dict.fromkeys(value))


def normalize_prefix(prefix: str) -> str:
    """`/users/`, `users/` and `users` are the same prefix: `users`."""
    return prefix.strip("/")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PluginConfig(_Strict):
    """A storage plugin the instance's writer uses; see streams.core.rules for what each does."""

    name: PluginName
    prefix: str | None = None

    @model_validator(mode="after")
    def _default_prefix(self) -> PluginConfig:
        if self.prefix is None and self.name in PLUGIN_DEFAULT_PREFIXES:
            return self.model_copy(update={"prefix": PLUGIN_DEFAULT_PREFIXES[self.name]})
        if self.prefix is not None:
            return self.model_copy(update={"prefix": normalize_prefix(self.prefix)})
        return self


class InstanceConfig(_Strict):
    """One storage instance: which events it keeps and where they go."""

    name: str = Field(pattern=r"^[A-Za-z0-9._-]{1,200}$")
    bucket: str | None = None
    prefix: str = ""
    plugins: tuple[PluginConfig, ...] = ()
    dedupe_ttl: float = DEFAULT_DEDUPE_TTL_S
    topic: str | None = None
    stale_topic: str | None = None
    partitions: int | None = Field(default=None, ge=1, le=10_000)
    """The partitions of this instance's output and stale topics; unset: `stream.partitions`.
    An emit transaction costs Kafka a produce request and a commit marker per partition it
    writes to, so with thousands of instances few partitions each (1 for a tenant of a few
    events per second) keep the transactions small (docs/settings.md, "Thousands of
    instances"). Only for topics the stream creates: an existing topic keeps its count."""
    sources: tuple[str, ...] | None = None
    """The sources (streams.core.normalizers.SOURCES) whose events the instance accepts; unset:
    every source. A credential of a source not listed cannot write into the instance, even
    naming its bucket (or no bucket, as Box and Cloudinary deliveries do). `reconcile` is
    always accepted (the operator's own tool; see streams.core.rules): a reconcile delivery
    reaches only the instance it names, on a raw topic that reaches it (streams.core.routing)."""
    reconcile_schedule: str | bool | None = None
    """When the reconcile CronJob of this instance runs (`python -m streams cronjobs`): a cron
    schedule as a Kubernetes CronJob reads it (streams.schedule), `false` for none, `true`
    for the default. Unset: the default when `sources` names a source of
    RECONCILED_BY_DEFAULT (supabase), none otherwise. The default is hourly, at a minute
    derived from the instance's name (so that instances do not all list at once)."""
    reconcile_endpoint_url: str | None = None
    """The `--endpoint-url` of its reconcile runs: the provider's API endpoint (Supabase:
    https://<project>.supabase.co/storage/v1/s3); unset: the listing's default (AWS S3)."""

    @field_validator("reconcile_schedule")
    @classmethod
    def _schedule(cls, value: str | bool | None) -> str | bool | None:
        if isinstance(value, str):
            try:
                parse_schedule(value)
            except ScheduleError as exc:
                raise ValueError(f"{exc} (or false for no scheduled reconcile)") from None
            return " ".join(value.split())
        return value

    @field_validator("reconcile_endpoint_url")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^\s/]+", value):
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value

    @property
    def reconcile_cron(self) -> str | None:
        """The schedule of its reconcile CronJob; None: it has none."""
        value = self.reconcile_schedule
        if isinstance(value, str):
            return value
        if value is None:
            value = any(source in RECONCILED_BY_DEFAULT for source in self.sources or ())
        if not value:
            return None
        return f"{zlib.crc32(self.name.encode()) % 60} * * * *"

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        return normalize_prefix(value)

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, value: str | None) -> str | None:
        return None if value in (None, "*") else value

    @field_validator("plugins", mode="before")
    @classmethod
    def _plugins(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return [{"name": item} if isinstance(item, str) else item for item in value]
        return value

    @field_validator("dedupe_ttl", mode="before")
    @classmethod
    def _ttl(cls, value: Any) -> float:
        return parse_duration(value)

    @field_validator("sources")
    @classmethod
    def _sources(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return check_sources(value)

    @field_validator("topic", "stale_topic")
    @classmethod
    def _topic(cls, value: str | None) -> str | None:
        return None if value is None else check_topic_name(value)

    @property
    def output_topic(self) -> str:
        return self.topic or f"files.events.{self.name}"

    @property
    def stale_output_topic(self) -> str:
        return self.stale_topic or f"files.stale.{self.name}"

    @property
    def reconciled_source(self) -> str | None:
        """The provider whose notifications this instance's `reconcile` events are ordered
        against: its one source other than `reconcile`, when `sources` names one."""
        named = [source for source in self.sources or () if source != "reconcile"]
        return named[0] if len(named) == 1 else None

    def plugin(self, name: str) -> PluginConfig | None:
        return next((plugin for plugin in self.plugins if plugin.name == name), None)


class RawTopicConfig(_Strict):
    """A topic bridges write to, and what its records may claim.

    Whoever may write a raw topic may claim any of its `sources`, for any of its
    `instances`: Kafka's ACLs on the topics are what bound a credential (README, "Security
    model"). A record claiming a source the topic does not carry is dead-lettered."""

    name: str
    default_source: str | None = None
    """The topic's own source (producers that cannot set headers, such as MinIO's Kafka
    target): a record without a `source` header is of this source, and one whose header
    names another is dead-lettered. With it, `sources` defaults to this one source."""
    sources: tuple[str, ...] | None = None
    """The sources records on this topic may claim; unset: `default_source` alone when it is
    set, else every source (a topic whose writers may write as any provider)."""
    instances: tuple[str, ...] | None = None
    """The instances this topic's deliveries may reach; unset: every instance. A `reconcile`
    delivery reaches only the instance it names, which must be one of these."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_topic_name(value)

    @field_validator("default_source")
    @classmethod
    def _default_source(cls, value: str | None) -> str | None:
        from streams.core.normalizers import SOURCES  # here: the normalizers import the models

        if value is not None and value not in SOURCES:
            raise ValueError(f"unknown source {value!r} (known: {', '.join(SOURCES)})")
        return value

    @field_validator("sources")
    @classmethod
    def _sources(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return check_sources(value)

    @field_validator("instances")
    @classmethod
    def _instances(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and not value:
            raise ValueError("needs at least one instance (leave it out for every instance)")
        return None if value is None else tuple(dict.fromkeys(value))

    @model_validator(mode="after")
    def _default_is_carried(self) -> RawTopicConfig:
        if self.default_source and self.sources and self.default_source not in self.sources:
            raise ValueError(
                f"default_source: {self.default_source!r} is not one of the topic's sources "
                f"({', '.join(self.sources)})"
            )
        return self

    @property
    def carried_sources(self) -> tuple[str, ...] | None:
        """The sources its records may claim; None: every source."""
        if self.sources is not None:
            return self.sources
        return (self.default_source,) if self.default_source else None

    def carries(self, source: str) -> bool:
        carried = self.carried_sources
        return carried is None or source in carried

    def reaches(self, instance: str) -> bool:
        return self.instances is None or instance in self.instances


KafkaConfig = KafkaSettings
"""`[kafka]`: the connection of every Kafka client (address, TLS, SASL); streams.kafka_settings."""


LEGACY_REPARTITION_TOPIC = "storage-events.by-key"
"""The repartition topic of every app before 2026-12, whatever its app id."""


class StreamConfig(_Strict):
    """How the Faust worker runs."""

    app_id: str = "storage-events"
    raw_topics: tuple[RawTopicConfig, ...] = (RawTopicConfig(name="files.raw"),)
    repartition_topic: str = ""
    """The topic stage one writes keyed records to and stage two reads (env none; default
    `<app_id>.by-key`: per app, so two apps on one cluster never read each other's keyed
    records). A deployment of another app id that kept the default before 2026-12 used
    `storage-events.by-key`; its worker keeps that topic while its emit group has offsets on
    it (streams.engine.topics.resolve_repartition_topic, docs/upgrading.md)."""
    dead_letter_topic: str = "files.dead-letter"
    partitions: int = Field(default=4, ge=1, le=10_000)
    replication_factor: int = Field(default=1, ge=1, le=32)
    min_insync_replicas: int = Field(default=1, ge=1, le=32)
    """`min.insync.replicas` of every topic the stream creates (env
    STREAMS_MIN_INSYNC_REPLICAS): an `acks=all` write is acknowledged once this many replicas
    have it. 2 with replication_factor 3: a write survives one broker lost, and one broker
    may be down without stopping the stream. At most replication_factor."""
    data_dir: Path = Path("var/streams")
    web_port: int = Field(default=6066, ge=1, le=65535)
    web_host: str = "127.0.0.1"
    """The address the worker's web server (`/metrics`, `/ready`) listens on (env
    STREAMS_WEB_HOST): loopback by default, as the bridge's; `0.0.0.0` where a probe or a
    scraper reaches it from outside (the k8s manifests, the Docker image)."""
    processing_guarantee: Literal["at_least_once", "exactly_once"] = "exactly_once"
    engine: Literal["librdkafka"] = "librdkafka"
    """The Kafka clients under the stages (env STREAMS_ENGINE): `librdkafka` (confluent-kafka,
    streams.engine.librdkafka), the only one. `aiokafka`, the engine before 2026-12, was
    removed: its deployments upgrade in place, keeping their groups, offsets and state
    (docs/upgrading.md)."""
    group_protocol: Literal["consumer", "classic"] = "consumer"
    """The consumer group protocol of the `librdkafka` engine (env STREAMS_GROUP_PROTOCOL):
    `consumer` (KIP-848, Kafka 4.x), or `classic` with the cooperative-sticky assignor for
    older clusters. Either way a membership change moves only the partitions that change."""
    batch_size: int = Field(default=2000, ge=1, le=MAX_BATCH_SIZE)
    emit_batch_size: int | None = Field(default=None, ge=1, le=MAX_BATCH_SIZE)
    """The records the emit stage reads and commits at once; unset: `batch_size`. An emit
    transaction costs Kafka a produce request and a commit marker per partition it writes to,
    so with thousands of instances it must carry many records per partition: 100,000 for
    1,000 instances of one partition each, at a cost in memory (docs/settings.md, "Thousands
    of instances")."""
    max_events_per_delivery: dict[str, int] = Field(default_factory=dict)
    """`{source = N}`: the most events one delivery of `source` may hold, instead of what its
    provider sends at most (streams.core.normalizers.MAX_EVENTS_PER_DELIVERY). A delivery
    with more is dead-lettered whole, with the count and the bound."""
    batch_within_s: float = Field(default=0.05, gt=0, le=10)
    dedupe_sweep_interval_s: float = Field(default=30.0, gt=0)
    """How often expired dedupe ids are removed (locally, and tombstoned in the changelog)."""
    session_timeout_s: float = Field(default=15.0, ge=6, le=300)
    """How long the group waits for a silent worker before giving its partitions away."""
    progress_interval_s: float = Field(default=60.0, gt=0)
    """How often the worker logs its progress line: records/s per stage, lag, dead letters
    (env STREAMS_PROGRESS_INTERVAL_S)."""
    max_clock_skew_s: float = 300.0
    """How far ahead of the worker's clock an event time may be and still be recorded as the
    key's ordering time (env STREAMS_MAX_CLOCK_SKEW_S). An event dated further ahead is
    emitted, but cannot make later events of its key stale by its time (streams.core.ordering)."""
    deleted_mark_grace_s: float | None = None
    """How long a deleted key's ordering mark is kept (env STREAMS_DELETED_MARK_GRACE_S;
    seconds or a duration): after it, an event of that key older than the delete is emitted
    as if new (streams.core.emitting). Unset: each instance's `dedupe_ttl`."""
    group_instance_id: str | None = None
    """Static group membership (KIP-345): a worker restarted under the same id takes its
    partitions back at once instead of after the session timeout. Unique per worker, stable
    across its restarts (a StatefulSet pod name)."""
    stage_processes: int = Field(default=2, ge=1, le=2)
    """How many processes the worker's two stages run in (env STREAMS_STAGE_PROCESSES): 2,
    the emit stage (its state, sweep and transactions) in a child process of the worker
    (streams.stages.child), supervised by it (streams.stages.supervisor), so that each stage
    has a core: still one `faust -A streams worker`, one `/ready` and `/metrics`, and a child
    that dies stops the worker with its exit code; 1, both stages on the Faust process' one
    event loop, as before 2026-12.

    2 by default, from `make bench` (BENCHMARKS.md, "Issue 22: a process per stage"): on 2
    cores shared with the broker, 12 alternating pairs (100,000-200,000 deliveries), two
    processes ran at a median 1.35x one process' events/s (0.66-3.5x; 9 of 12 pairs above 1,
    the quietest run's median 1.15x) for the same CPU per delivery (medians 192 against 216
    µs, both processes counted): the split costs nothing measurable, halves the work evenly
    (emit 44-48%, normalize with Faust 52-56%) and pays wherever one core is the limit. Set 1
    where the worker gets one core: a second process then only takes memory (its RSS was 106
    MiB beside the worker's 123 MiB, 20,000 ids in the state)."""
    instance_metrics_limit: int = Field(default=1000, ge=0)
    """Up to this many configured instances, the per-instance metrics (emitted, duplicates,
    stale, filtered, latency) are one series per instance (env
    STREAMS_INSTANCE_METRICS_LIMIT); with more, one series `instance="*"` for all of them,
    so that /metrics stays the same size at 10,000 tenants; 0: always aggregated
    (streams.metrics). Per instance, each instance adds 19 series (16 of them latency
    buckets), plus its `filtered` reasons."""
    leave_group_on_stop: bool = False
    """A static member leaves its groups when it stops (env STREAMS_LEAVE_GROUP_ON_STOP): for
    a worker that is not coming back (a scale-in), so its partitions move at once instead of
    after the session timeout (streams.engine.membership). SIGUSR1 does the same for one stop."""

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_removed(cls, value: Any) -> Any:
        if value == "aiokafka":
            raise ValueError(
                "the aiokafka engine was removed (2026-12): unset STREAMS_ENGINE; the "
                "librdkafka engine takes over its groups, offsets and state "
                "(docs/upgrading.md)"
            )
        return value

    @field_validator("repartition_topic", "dead_letter_topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        return check_topic_name(value) if value else value

    @model_validator(mode="after")
    def _per_app_repartition_topic(self) -> StreamConfig:
        if not self.repartition_topic:
            object.__setattr__(self, "repartition_topic", f"{self.app_id}.by-key")
        return self

    @property
    def repartition_topic_chosen(self) -> bool:
        """Whether the configuration names the repartition topic (else it is the default)."""
        return "repartition_topic" in self.model_fields_set

    @field_validator("min_insync_replicas")
    @classmethod
    def _insync(cls, value: int, info: ValidationInfo) -> int:
        replicas = info.data.get("replication_factor")
        if replicas is not None and value > replicas:
            raise ValueError(
                f"{value} is more than replication_factor ({replicas}): no write could ever "
                "be acknowledged; lower min_insync_replicas or raise replication_factor"
            )
        return value

    @field_validator("max_clock_skew_s", mode="before")
    @classmethod
    def _skew(cls, value: Any) -> float:
        if isinstance(value, str) and re.fullmatch(r"\s*\d+(\.\d+)?\s*", value):
            value = float(value)  # seconds, as an environment variable gives them
        return parse_duration(value)

    @field_validator("deleted_mark_grace_s", mode="before")
    @classmethod
    def _mark_grace(cls, value: Any) -> float | None:
        if value is None:
            return None
        if isinstance(value, str) and re.fullmatch(r"\s*\d+(\.\d+)?\s*", value):
            value = float(value)  # seconds, as an environment variable gives them
        return parse_duration(value)

    @field_validator("max_events_per_delivery")
    @classmethod
    def _events_bounds(cls, value: dict[str, int]) -> dict[str, int]:
        check_sources(tuple(value) or None)
        for source, bound in value.items():
            if bound < 1:
                raise ValueError(f"{source}: {bound} is not a positive number of events")
        return value

    @property
    def emit_batch(self) -> int:
        """The emit stage's batch bound: `emit_batch_size`, else `batch_size`."""
        return self.emit_batch_size or self.batch_size

    def events_bound(self, source: str) -> int:
        """The most events one delivery of `source` may hold (setting, else the provider's)."""
        from streams.core.normalizers import MAX_EVENTS_PER_DELIVERY

        return self.max_events_per_delivery.get(source) or MAX_EVENTS_PER_DELIVERY[source]

    def default_source(self, raw_topic: str) -> str | None:
        """The source of records on `raw_topic` that carry no `source` header."""
        topic = self.raw_topic(raw_topic)
        return None if topic is None else topic.default_source

    def raw_topic(self, name: str) -> RawTopicConfig | None:
        """The configuration of raw topic `name`, or None when it is not one."""
        for topic in self.raw_topics:
            if topic.name == name:
                return topic
        return None

    def raw_topic_for(self, source: str, instance: str) -> str | None:
        """The first raw topic that carries `source` and reaches `instance` (where a command
        such as reconcile publishes by default), or None."""
        for topic in self.raw_topics:
            if topic.carries(source) and topic.reaches(instance):
                return topic.name
        return None

    @field_validator("raw_topics", mode="before")
    @classmethod
    def _raw_topics(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return [{"name": item} if isinstance(item, str) else item for item in value]
        return value


class WebhookRouteConfig(_Strict):
    """One push source's route, `[webhook.routes.<source>]`.

    A route is on when its credentials are configured (for most sources the environment
    variable named by `secret_env` must be set; `s3` needs `topic_arns`; `gcs` needs
    `audience` + `service_account` or a shared token), or when it is `insecure`. Otherwise it
    answers 404. Secrets are never written here: only the NAMES of the environment variables
    that hold them. Each setting applies to the sources listed in its description; setting it
    on another source's route is a configuration error.
    """

    SOURCE_FIELDS: ClassVar[dict[str, frozenset[str]]] = {
        "s3": frozenset(
            {
                "topic_arns",
                "confirm_subscriptions",
                "certificate_files",
                "trusted_ca_file",
                "certificate_cache_s",
                "max_message_age_s",
            }
        ),
        "eventbridge": frozenset(
            {"secret_env", "token_env", "auth", "secret_header", "basic_username"}
        ),
        "gcs": frozenset(
            {
                "secret_env",
                "token_env",
                "secret_query_param",
                "audience",
                "service_account",
                "issuers",
                "jwks_url",
                "jwks_file",
                "jwt_leeway_s",
            }
        ),
        "azure": frozenset(
            {
                "secret_env",
                "token_env",
                "secret_query_param",
                "secret_header",
                "allowed_origins",
                "allowed_rate",
            }
        ),
        "minio": frozenset({"secret_env", "token_env"}),
        "supabase": frozenset({"secret_env", "token_env", "secret_header"}),
        "b2": frozenset({"secret_env", "token_env"}),
        "box": frozenset({"secret_env", "token_env", "secondary_secret_env", "replay_window_s"}),
        "cloudinary": frozenset(
            {"secret_env", "token_env", "signature_algorithm", "replay_window_s"}
        ),
        "appwrite": frozenset({"secret_env", "token_env", "url", "event_memory", "event_memory_s"}),
    }
    """Which settings each source's route takes (`insecure` applies to every source)."""
    SNS_HOST: ClassVar[re.Pattern[str]] = re.compile(
        r"^sns\.[a-z]{2,4}(-[a-z]+)+-[0-9]{1,2}\.amazonaws\.com(\.cn)?$"
    )
    """Amazon SNS endpoints: `sns.<region>.amazonaws.com` (`.com.cn` in the China regions).

    AWS's validators (`aws/aws-js-sns-message-validator` index.js `defaultHostPattern`,
    `aws/aws-php-sns-message-validator` src/MessageValidator.php) use
    `^sns\\.[a-zA-Z0-9\\-]{3,}\\.amazonaws\\.com(\\.cn)?$`: the `{3,}` keeps out
    `sns.s3.amazonaws.com` (the S3 bucket `sns`). It still admits S3 hosts that serve any
    bucket named `sns` (`sns.s3-accelerate.amazonaws.com`, `sns.s3-us-west-2.amazonaws.com`),
    so the middle label here must have a region's shape, `<area>(-<word>)+-<digit>` as in
    botocore's partition `regionRegex` (`us-east-1`, `us-gov-west-1`, `cn-north-1`): every
    host the SDK pattern rejects is rejected here too. Host names are compared lower-cased."""
    SNS_CLOCK_SKEW_S: ClassVar[float] = 300.0
    """s3: how far in the future an SNS `Timestamp` may be (the publisher's clock vs ours)."""
    DEFAULT_REPLAY_WINDOW_S: ClassVar[dict[str, float]] = {"box": 600.0, "cloudinary": 7200.0}
    """Box documents 10 minutes; Cloudinary's SDKs default `valid_for` to 7200 s."""
    DEFAULT_QUERY_PARAM: ClassVar[dict[str, str]] = {"azure": "code", "gcs": "token"}

    insecure: bool = False
    """Every source. Accept deliveries WITHOUT authentication: local development only, logged
    as a warning at start-up, ignored (with a warning) when the route has credentials. Azure
    handshakes are still answered."""
    secret_env: str | None = None
    """Name of the environment variable holding the route's secret: MinIO `auth_token`,
    EventBridge API key value or basic-auth password, GCS shared push token, Azure shared
    secret, Supabase header value, B2 rule `hmacSha256SigningSecret`, Box primary signature
    key, Cloudinary API secret (or notification key), Appwrite webhook signature key."""
    token_env: str | None = None
    """Older name of `secret_env` (same meaning); set one of them, not both."""
    secondary_secret_env: str | None = None
    """box: name of the environment variable holding the secondary signature key."""
    secret_header: str | None = None
    """eventbridge (`auth = "api_key"`): the connection's API key name (header); supabase: the
    header configured on the Database Webhook (required with a secret); azure: a delivery
    header carrying the secret instead of the query parameter. Never forwarded to Kafka."""
    secret_query_param: str | None = None
    """azure (default `code`), gcs (default `token`): the query parameter of the endpoint URL
    that carries the shared secret."""
    auth: Literal["api_key", "basic"] = "api_key"
    """eventbridge: the connection's authorization type (`API_KEY` or `BASIC`)."""
    basic_username: str | None = None
    """eventbridge (`auth = "basic"`): the connection's username (the password is the secret)."""
    topic_arns: tuple[str, ...] = ()
    """s3: the SNS topics whose messages are accepted; the route is on when this is non-empty."""
    confirm_subscriptions: bool = True
    """s3: confirm a verified SubscriptionConfirmation for an allowed topic by fetching its
    `SubscribeURL`; when false the URL is only logged for a manual confirmation."""
    certificate_files: dict[str, Path] = Field(default_factory=dict)
    """s3: signing certificates served from files instead of fetched, `{SigningCertURL: PEM
    file}` (air-gapped hosts, tests). URLs must be https on an SNS host."""
    trusted_ca_file: Path | None = None
    """s3: PEM bundle of CA certificates; when set, a signing certificate must be issued
    directly by one of them (besides the https fetch from an SNS host)."""
    certificate_cache_s: float = 86400.0
    """s3: how long a signing certificate stays cached (seconds or a duration like "12h")."""
    max_message_age_s: float = 3600.0
    """s3: SNS messages whose signed `Timestamp` is older than this (or more than 5 minutes in
    the future) are refused as replayed. SNS keeps the publish time on its retries, and an
    HTTP(S) delivery policy retries for at most 3,600 s, hence the default of 1 h. Must be at
    most every instance's `dedupe_ttl` minus the 5 minutes of clock skew, so that a replay
    the bridge accepts is always a duplicate the stream drops (checked at start-up)."""
    audience: str | None = None
    """gcs: the audience of the push subscription's OIDC token (default in Google Cloud: the
    push endpoint URL). With `service_account`, turns OIDC verification on."""
    service_account: str | None = None
    """gcs: the service account email the push subscription authenticates as."""
    issuers: tuple[str, ...] = ("https://accounts.google.com", "accounts.google.com")
    """gcs: accepted token issuers."""
    jwks_url: str = "https://www.googleapis.com/oauth2/v3/certs"
    """gcs: Google's public signing keys (JWKS), cached per the response's max-age."""
    jwks_file: Path | None = None
    """gcs: a JWKS file used instead of `jwks_url` (air-gapped hosts, tests)."""
    jwt_leeway_s: float = Field(default=60.0, ge=0, le=600)
    """gcs: clock skew tolerated on the token's `exp`/`iat`, seconds."""
    allowed_origins: tuple[str, ...] = ("eventgrid.azure.net",)
    """azure: `WebHook-Request-Origin` values granted in the CloudEvents OPTIONS handshake
    (`*` grants any)."""
    allowed_rate: str = "*"
    """azure: `WebHook-Allowed-Rate` answered in the OPTIONS handshake (requests per minute, or
    `*` for no limit)."""
    signature_algorithm: Literal["sha1", "sha256"] = "sha1"
    """cloudinary: the account's `signature_algorithm`; a signature of the other kind is
    refused."""
    replay_window_s: float | None = None
    """box (default 600 s), cloudinary (default 7200 s): deliveries whose signed timestamp is
    further than this from the bridge's clock (either way) are refused."""
    url: str | None = None
    """appwrite: the webhook URL exactly as registered in Appwrite (it is part of what is
    signed); required with a secret."""
    event_memory: int = Field(default=10_000, ge=0)
    """appwrite: how many signed bodies the bridge remembers with the event header they came
    with (the header is not signed): while remembered, a body is admitted again only with
    the same header, or once as a file delete (a file deleted unchanged); anything else is
    refused. 0 turns the check off. Per bridge process, not shared, lost on restart."""
    event_memory_s: float = 86400.0
    """appwrite: how long a signed body is remembered (seconds or a duration like "24h")."""

    @field_validator("secret_env", "token_env", "secondary_secret_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", value):
            raise ValueError(f"{value!r} is not an environment variable name")
        return value

    @field_validator("secret_header")
    @classmethod
    def _header_name(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$", value):
            raise ValueError(f"{value!r} is not an HTTP header name")
        return None if value is None else value.lower()

    @field_validator("secret_query_param", "basic_username", "audience", "service_account")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("topic_arns")
    @classmethod
    def _topic_arns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for arn in value:
            if not re.match(r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_.-]{1,256}$", arn):
                raise ValueError(f"{arn!r} is not an SNS topic ARN")
        return value

    @field_validator("certificate_files")
    @classmethod
    def _certificate_urls(cls, value: dict[str, Path]) -> dict[str, Path]:
        from urllib.parse import urlsplit

        for url in value:
            parts = urlsplit(url)
            if parts.scheme != "https" or not cls.SNS_HOST.match(parts.hostname or ""):
                raise ValueError(f"{url!r} is not an https URL on an Amazon SNS host")
        return value

    @field_validator("certificate_cache_s", "max_message_age_s", "event_memory_s", mode="before")
    @classmethod
    def _cache_duration(cls, value: Any) -> float:
        return parse_duration(value)

    @field_validator("replay_window_s", mode="before")
    @classmethod
    def _window(cls, value: Any) -> float | None:
        return None if value is None else parse_duration(value)

    @field_validator("allowed_rate")
    @classmethod
    def _rate(cls, value: str) -> str:
        if value != "*" and not (value.isdigit() and int(value) > 0):
            raise ValueError("is '*' or a positive number of requests per minute")
        return value

    @field_validator("allowed_origins", "issuers")
    @classmethod
    def _non_empty(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value or any(not item.strip() for item in value):
            raise ValueError("needs at least one non-empty value")
        return value

    @field_validator("url", "jwks_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^\s/]+", value):
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value

    @model_validator(mode="after")
    def _one_secret_name(self) -> WebhookRouteConfig:
        if self.secret_env is not None and self.token_env is not None:
            raise ValueError("secret_env and token_env: set one of them, not both")
        return self

    @property
    def secret_variable(self) -> str | None:
        """The environment variable holding the route's secret, if one is configured."""
        return self.secret_env or self.token_env

    def check_for(self, source: str) -> None:
        """Raise ValueError naming `routes.<source>.<field>` when a setting does not fit."""
        allowed = self.SOURCE_FIELDS[source] | {"insecure"}
        for name in sorted(self.model_fields_set - allowed):
            raise ValueError(f"routes.{source}.{name}: not a setting of the {source} route")
        secret = self.secret_variable is not None
        if source == "supabase" and secret and self.secret_header is None:
            raise ValueError(
                "routes.supabase.secret_header: required with a secret (the header name "
                "configured on the Database Webhook)"
            )
        if source == "eventbridge" and secret:
            if self.auth == "api_key" and self.secret_header is None:
                raise ValueError(
                    "routes.eventbridge.secret_header: required with auth = 'api_key' (the "
                    "connection's API key name)"
                )
            if self.auth == "basic" and self.basic_username is None:
                raise ValueError("routes.eventbridge.basic_username: required with auth = 'basic'")
        if source == "gcs" and (self.audience is None) != (self.service_account is None):
            missing = "audience" if self.audience is None else "service_account"
            raise ValueError(
                f"routes.gcs.{missing}: OIDC verification needs both audience and service_account"
            )
        if source == "appwrite" and secret and self.url is None:
            raise ValueError(
                "routes.appwrite.url: required with a secret (the webhook URL exactly as "
                "registered in Appwrite; it is part of what Appwrite signs)"
            )
        if source == "box" and self.secondary_secret_env is not None and not secret:
            raise ValueError("routes.box.secondary_secret_env: needs secret_env (the primary key)")

    def replay_window(self, source: str) -> float:
        """The replay window of a timestamped source, configured or documented default."""
        if self.replay_window_s is not None:
            return self.replay_window_s
        return self.DEFAULT_REPLAY_WINDOW_S[source]

    def query_param(self, source: str) -> str:
        """The query parameter carrying a shared secret, configured or default."""
        return self.secret_query_param or self.DEFAULT_QUERY_PARAM[source]


RAW_RECORD_FRAMING_BYTES = 16 * 1024
"""What a raw record takes beyond its value and header bytes: Kafka's record batch and record
framing, a length per header. The bridges keep value + headers + this under the raw topic's
`RAW_MAX_MESSAGE_BYTES`."""


class WebhookConfig(_Strict):
    """The webhook bridge (`python -m connectors webhook`); its routes are described in
    docs/bridges.md, "The webhook bridge in detail"."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    raw_topic: str = "files.raw"
    max_body_bytes: int = Field(default=1024 * 1024, ge=1)
    """Bodies larger than this get 413 and are never published."""
    publish_timeout_s: float = Field(default=10.0, gt=0)
    """How long a delivery waits for Kafka's acknowledgement before it is answered 503."""
    routes: dict[str, WebhookRouteConfig] = Field(default_factory=dict)
    """`[webhook.routes.<source>]`, one per push source (see WebhookRouteConfig)."""
    insecure_sources: tuple[str, ...] = ()
    """Sources accepted without authentication (env WEBHOOK_INSECURE_SOURCES=s3,minio)."""
    admin_host: str | None = None
    """Where `admin_port` listens (env WEBHOOK_ADMIN_HOST; default: `host`)."""
    admin_port: int | None = Field(default=None, ge=1, le=65535)
    """Serve `/healthz` and `/metrics` on this port only (env WEBHOOK_ADMIN_PORT); the public
    port then answers 404 for them. Unset: they are served on `port`."""
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    """The headers a delivery's raw record carries (every forwarded `header.<name>` and the
    contract headers, names and values): a request over it gets 431, nothing published."""
    max_bodies_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    """Body bytes held at once across requests, counting only what each body has beyond its
    first `SMALL_BODY_BYTES` (small deliveries are bounded by `max_connections` instead): a
    body that would go over it is answered 503 with Retry-After, so the provider retries."""
    body_timeout_s: float = Field(default=15.0, gt=0)
    """A body not received whole this long after its request's headers is answered 408."""
    idle_timeout_s: float = Field(default=15.0, gt=0)
    """A connection that has not sent a complete request head this long after it opened (or
    after its previous answer) is closed: slow headers, idle keep-alive connections."""
    max_connections: int = Field(default=256, ge=1)
    """Connections open at once on the public port; one more is answered 503 and closed."""

    SMALL_BODY_BYTES: ClassVar[int] = 64 * 1024
    """What of each body `max_bodies_bytes` does not count."""

    @field_validator("raw_topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        return check_topic_name(value)

    @field_validator("insecure_sources", mode="before")
    @classmethod
    def _sources(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(item.strip() for item in value.split(",") if item.strip())
        return value

    @model_validator(mode="after")
    def _known_sources(self) -> WebhookConfig:
        from streams.core.normalizers import SOURCES  # here: the normalizers import the models

        known = ", ".join(SOURCES)
        for source in self.insecure_sources:
            if source not in SOURCES:
                raise ValueError(f"insecure_sources: unknown source {source!r} (known: {known})")
        for source, route in self.routes.items():
            if source not in SOURCES:
                raise ValueError(f"routes.{source}: unknown source (known: {known})")
            route.check_for(source)
        return self

    @model_validator(mode="after")
    def _bodies_fit(self) -> WebhookConfig:
        if self.max_bodies_bytes < self.max_body_bytes - self.SMALL_BODY_BYTES:
            raise ValueError(
                f"max_bodies_bytes: {self.max_bodies_bytes} is too small for one body of "
                f"max_body_bytes ({self.max_body_bytes}): such a delivery would always get 503"
            )
        return self


class Settings(_Strict):
    """Everything the worker and the bridges are configured with."""

    kafka: KafkaSettings = KafkaSettings()
    stream: StreamConfig = StreamConfig()
    webhook: WebhookConfig = WebhookConfig()
    instances: tuple[InstanceConfig, ...] = (InstanceConfig(name="default"),)

    @model_validator(mode="after")
    def _unique_names(self) -> Settings:
        if not self.instances:
            raise ValueError("instances: at least one instance is required")
        names = Counter(instance.name for instance in self.instances)  # linear: 10,000 in ms
        duplicated = sorted(name for name, count in names.items() if count > 1)
        if duplicated:
            raise ValueError(f"instances: names must be unique, repeated: {', '.join(duplicated)}")
        # One topic per tenant: a shared output or stale topic would mix tenants' keys.
        stream = self.stream
        topics = [raw.name for raw in stream.raw_topics]
        topics += [stream.repartition_topic, stream.dead_letter_topic]
        for instance in self.instances:
            topics += [instance.output_topic, instance.stale_output_topic]
        counted = Counter(topics)
        shared = sorted(topic for topic, count in counted.items() if count > 1)
        if shared:
            raise ValueError(
                "instances: every instance needs its own topic and stale_topic, distinct from "
                f"each other and from the stream's topics; used twice: {', '.join(shared)}"
            )
        return self

    @model_validator(mode="after")
    def _raw_topics_fit(self) -> Settings:
        names = {instance.name for instance in self.instances}
        for index, topic in enumerate(self.stream.raw_topics):
            unknown = [name for name in topic.instances or () if name not in names]
            if unknown:
                raise ValueError(
                    f"stream.raw_topics.{index}.instances: no instance named "
                    f"{', '.join(map(repr, unknown))} (configured: {_some(sorted(names))})"
                )
        webhook = self.webhook
        raw = self.stream.raw_topic(webhook.raw_topic)
        if raw is not None:
            sources = dict.fromkeys([*webhook.routes, *webhook.insecure_sources])
            refused = [source for source in sources if not raw.carries(source)]
            if refused:
                raise ValueError(
                    f"webhook.raw_topic: {raw.name} does not carry {', '.join(refused)} "
                    f"(its sources: {', '.join(raw.carried_sources or ())}): the worker would "
                    "dead-letter every delivery of those routes"
                )
        return self

    @model_validator(mode="after")
    def _sns_replays_are_duplicates(self) -> Settings:
        # An SNS replay the bridge accepts is at most max_message_age_s + skew after the first
        # copy was handled; the stream drops it only while that copy's id is still remembered.
        route = self.webhook.routes.get("s3")
        if route is None or not route.topic_arns:
            return self
        shortest = min(self.instances, key=lambda instance: instance.dedupe_ttl)
        window = route.max_message_age_s + route.SNS_CLOCK_SKEW_S
        if window > shortest.dedupe_ttl:
            raise ValueError(
                f"webhook.routes.s3.max_message_age_s: {route.max_message_age_s:g} s plus "
                f"{route.SNS_CLOCK_SKEW_S:g} s of clock skew is longer than instance "
                f"{shortest.name!r}'s dedupe_ttl ({shortest.dedupe_ttl:g} s): a replayed SNS "
                "message could be emitted twice; lower max_message_age_s to at most "
                f"{max(shortest.dedupe_ttl - route.SNS_CLOCK_SKEW_S, 0):g} s or raise dedupe_ttl"
            )
        return self

    @model_validator(mode="after")
    def _raw_records_fit(self) -> Settings:
        # On Settings, not WebhookConfig: streams.engine.topics imports this module, and the default
        # WebhookConfig() is built while it loads.
        from streams.engine.topics import RAW_MAX_MESSAGE_BYTES

        webhook = self.webhook
        record = webhook.max_body_bytes + webhook.max_header_bytes + RAW_RECORD_FRAMING_BYTES
        if record > RAW_MAX_MESSAGE_BYTES:
            raise ValueError(
                f"webhook.max_body_bytes: {webhook.max_body_bytes} plus "
                f"webhook.max_header_bytes {webhook.max_header_bytes} plus "
                f"{RAW_RECORD_FRAMING_BYTES} bytes of record framing is over the raw topic's "
                f"record limit of {RAW_MAX_MESSAGE_BYTES} bytes: a delivery the bridge "
                "accepted could never be written"
            )
        return self

    def instance(self, name: str) -> InstanceConfig:
        found = self.derived(instances_by_name).get(name)
        if found is not None:
            return found
        known = _some([instance.name for instance in self.instances])
        raise ConfigError(f"no instance named {name!r} (configured: {known})")

    def emit_policy(self) -> EmitPolicy:
        """Stage two's policy of these settings (streams.policies `emit_policy`), built once:
        what streams.core.emitting takes instead of the settings."""
        from streams.policies import emit_policy  # the shell's builder, which imports this

        return self.derived(emit_policy)

    def derived(self, build: Callable[[Settings], _T]) -> _T:
        """What `build(self)` returns, built once for these settings and kept on them: the
        indexes that make a look-up by instance (by name here, by bucket and prefix in
        streams.core.routing) cost the same with 10,000 instances as with one.

        Kept in the object's `__dict__` beside the fields, not as a field: never validated,
        compared, serialised or pickled. `model_copy` copies that dict, so the cache records
        the object it belongs to, and a copy (whose fields may differ) builds its own."""
        entry: tuple[Settings, dict[Any, Any]] | None = self.__dict__.get(_DERIVED)
        if entry is None or entry[0] is not self:
            entry = (self, {})
            self.__dict__[_DERIVED] = entry
        built = entry[1].get(build)
        if built is None:
            built = entry[1][build] = build(self)
        return built

    def __getstate__(self) -> dict[Any, Any]:
        state = super().__getstate__()
        fields = state["__dict__"]
        if _DERIVED in fields:  # rebuilt where it is unpickled, when needed
            state["__dict__"] = {name: value for name, value in fields.items() if name != _DERIVED}
        return state


def _some(names: list[str], most: int = 20) -> str:
    """`names` for a message: the first `most`, then how many more (one line at 10,000)."""
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most:,} more" if len(names) > most else "")


def instances_by_name(settings: Settings) -> dict[str, InstanceConfig]:
    """Every instance by its name (Settings.derived)."""
    return {instance.name: instance for instance in settings.instances}


def _describe(error: ValidationError, origin: str, overrides: Mapping[tuple[str, str], str]) -> str:
    problems = []
    for item in error.errors():
        loc = tuple(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        variable = overrides.get((loc[0], loc[1])) if len(loc) >= 2 else None
        if len(loc) == 1:  # a section's own check names its field first: `field: ...`
            variable = overrides.get((loc[0], message.partition(":")[0]))
        if variable is not None:
            message += f" (from environment variable {variable})"
        # A model-level check names its own field(s) in the message.
        problems.append(f"{'.'.join(loc)}: {message}" if loc else message)
    return f"{origin}: " + "; ".join(problems)


def load_settings(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Read the config file (argument, else `STREAMS_CONFIG`) and apply env overrides."""
    environ = os.environ if environ is None else environ
    named_by = "" if path else " (STREAMS_CONFIG)"
    path = path or environ.get("STREAMS_CONFIG") or None
    data: dict[str, Any] = {}
    origin = "configuration"
    if path is not None:
        origin = f"config file {path}{named_by}"
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{origin}: no such file") from None
        except OSError as exc:
            raise ConfigError(f"{origin}: cannot be read: {exc.strerror or exc}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{origin}: not valid TOML: {exc}") from None
    overrides: dict[tuple[str, str], str] = {}
    for variable, (section, field) in ENVIRONMENT.items():
        if environ.get(variable):
            table = data.setdefault(section, {})
            if isinstance(table, dict):  # else validation reports the section itself
                table[field] = environ[variable]
                overrides[(section, field)] = variable
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, origin, overrides)) from None
