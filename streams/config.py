"""Configuration: storage instances and the stream's settings, validated at start-up.

Sources, later ones winning: defaults, the TOML file named by `STREAMS_CONFIG`, then the
environment variables listed in `ENVIRONMENT`. A mistake stops start-up with a `ConfigError`
that names the field.

```toml
[kafka]
bootstrap_servers = "127.0.0.1:9092"      # env KAFKA_BOOTSTRAP_SERVERS wins

[stream]
raw_topics = ["files.raw", { name = "minio.events", default_source = "minio" }]
dead_letter_topic = "files.dead-letter"
partitions = 4
replication_factor = 1

[[instances]]
name = "tenant-a"            # required; also names the output topics
bucket = "uploads"           # a bucket name, or "*" for every bucket; absent = every bucket
prefix = "tenant-a"          # optional
plugins = ["versioning", "softDelete", { name = "dedup", prefix = ".blobs" }, "encryption"]
dedupe_ttl = "24h"           # seconds as a number, or a duration string; default 24 h
topic = "files.events.tenant-a"   # default files.events.<name>
```
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DEFAULT_DEDUPE_TTL_S = 24 * 3600.0

PluginName = Literal["dedup", "versioning", "softDelete", "encryption", "compression"]
PLUGIN_DEFAULT_PREFIXES: dict[str, str] = {
    "dedup": ".dedup",
    "versioning": ".versions",
    "softDelete": ".trash",
}

ENVIRONMENT = {
    "KAFKA_BOOTSTRAP_SERVERS": ("kafka", "bootstrap_servers"),
    "STREAMS_DATA_DIR": ("stream", "data_dir"),
    "STREAMS_WEB_PORT": ("stream", "web_port"),
    "STREAMS_PROCESSING_GUARANTEE": ("stream", "processing_guarantee"),
    "STREAMS_GROUP_INSTANCE_ID": ("stream", "group_instance_id"),
    "STREAMS_PARTITIONS": ("stream", "partitions"),
    "STREAMS_REPLICATION_FACTOR": ("stream", "replication_factor"),
    "STREAMS_APP_ID": ("stream", "app_id"),
    "WEBHOOK_HOST": ("webhook", "host"),
    "WEBHOOK_PORT": ("webhook", "port"),
    "WEBHOOK_RAW_TOPIC": ("webhook", "raw_topic"),
    "WEBHOOK_INSECURE_SOURCES": ("webhook", "insecure_sources"),
}


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


def normalize_prefix(prefix: str) -> str:
    """`/users/`, `users/` and `users` are the same prefix: `users`."""
    return prefix.strip("/")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PluginConfig(_Strict):
    """A storage plugin the instance's writer uses; see streams.rules for what each does."""

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

    def plugin(self, name: str) -> PluginConfig | None:
        return next((plugin for plugin in self.plugins if plugin.name == name), None)


class RawTopicConfig(_Strict):
    """A topic bridges write to; `default_source` serves producers that cannot set headers."""

    name: str
    default_source: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_topic_name(value)


class KafkaConfig(_Strict):
    bootstrap_servers: str = "127.0.0.1:9092"


class StreamConfig(_Strict):
    """How the Faust worker runs."""

    app_id: str = "storage-events"
    raw_topics: tuple[RawTopicConfig, ...] = (RawTopicConfig(name="files.raw"),)
    repartition_topic: str = "storage-events.by-key"
    dead_letter_topic: str = "files.dead-letter"
    partitions: int = Field(default=4, ge=1, le=10_000)
    replication_factor: int = Field(default=1, ge=1, le=32)
    data_dir: Path = Path("var/streams")
    web_port: int = Field(default=6066, ge=1, le=65535)
    processing_guarantee: Literal["at_least_once", "exactly_once"] = "exactly_once"
    batch_size: int = Field(default=2000, ge=1, le=100_000)
    batch_within_s: float = Field(default=0.05, gt=0, le=10)
    dedupe_sweep_interval_s: float = Field(default=30.0, gt=0)
    """How often expired dedupe ids are removed (locally, and tombstoned in the changelog)."""
    session_timeout_s: float = Field(default=15.0, ge=6, le=300)
    """How long the group waits for a silent worker before giving its partitions away."""
    group_instance_id: str | None = None
    """Static group membership (KIP-345): a worker restarted under the same id takes its
    partitions back at once instead of after the session timeout. Unique per worker, stable
    across its restarts (a StatefulSet pod name)."""

    @field_validator("repartition_topic", "dead_letter_topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        return check_topic_name(value)

    @field_validator("raw_topics", mode="before")
    @classmethod
    def _raw_topics(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return [{"name": item} if isinstance(item, str) else item for item in value]
        return value


class WebhookRouteConfig(_Strict):
    """One push source's route. Without a secret and without `insecure` the route is off."""

    token_env: str | None = None
    """Name of the environment variable holding the shared bearer token (never the value)."""
    insecure: bool = False
    """Accept unauthenticated deliveries: local development only; logged as a warning."""


class WebhookConfig(_Strict):
    """The webhook bridge (`python -m connectors webhook`)."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    raw_topic: str = "files.raw"
    max_body_bytes: int = Field(default=1024 * 1024, ge=1)
    publish_timeout_s: float = Field(default=10.0, gt=0)
    routes: dict[str, WebhookRouteConfig] = Field(default_factory=dict)
    insecure_sources: tuple[str, ...] = ()
    """Sources accepted without authentication (env WEBHOOK_INSECURE_SOURCES=s3,minio)."""

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


class Settings(_Strict):
    """Everything the worker and the bridges are configured with."""

    kafka: KafkaConfig = KafkaConfig()
    stream: StreamConfig = StreamConfig()
    webhook: WebhookConfig = WebhookConfig()
    instances: tuple[InstanceConfig, ...] = (InstanceConfig(name="default"),)

    @model_validator(mode="after")
    def _unique_names(self) -> Settings:
        if not self.instances:
            raise ValueError("instances: at least one instance is required")
        names = [instance.name for instance in self.instances]
        duplicated = sorted({name for name in names if names.count(name) > 1})
        if duplicated:
            raise ValueError(f"instances: names must be unique, repeated: {', '.join(duplicated)}")
        # One topic per tenant: a shared output or stale topic would mix tenants' keys.
        stream = self.stream
        topics = [raw.name for raw in stream.raw_topics]
        topics += [stream.repartition_topic, stream.dead_letter_topic]
        for instance in self.instances:
            topics += [instance.output_topic, instance.stale_output_topic]
        shared = sorted({topic for topic in topics if topics.count(topic) > 1})
        if shared:
            raise ValueError(
                "instances: every instance needs its own topic and stale_topic, distinct from "
                f"each other and from the stream's topics; used twice: {', '.join(shared)}"
            )
        return self

    def instance(self, name: str) -> InstanceConfig:
        for instance in self.instances:
            if instance.name == name:
                return instance
        known = ", ".join(instance.name for instance in self.instances)
        raise ConfigError(f"no instance named {name!r} (configured: {known})")


def _describe(error: ValidationError, origin: str, overrides: Mapping[tuple[str, str], str]) -> str:
    problems = []
    for item in error.errors():
        loc = tuple(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        variable = overrides.get((loc[0], loc[1])) if len(loc) >= 2 else None
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
