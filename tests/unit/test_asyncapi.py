"""The AsyncAPI document: generated from streams.engine.topics, checked in for the default
configuration, and valid against the official AsyncAPI 3.0.0 JSON Schema (`@asyncapi/specs`
in package.json, installed by `npm ci`)."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft7Validator

from streams.asyncapi import asyncapi_document
from streams.cli import main
from streams.config import Settings, load_settings
from streams.core.schema import FILE_EVENT_SCHEMA_URI, file_event_schema, schema_text
from streams.engine.topics import topology

ROOT = Path(__file__).resolve().parents[2]
CHECKED_IN = ROOT / "schemas" / "asyncapi.json"
OFFICIAL = ROOT / "node_modules" / "@asyncapi" / "specs" / "schemas" / "3.0.0.json"
REGENERATE = "regenerate: python -m streams asyncapi --defaults --output schemas/asyncapi.json"


def default_settings() -> Settings:
    return load_settings(None, environ={})  # no STREAMS_CONFIG, no KAFKA_BOOTSTRAP_SERVERS


@functools.cache
def official_validator() -> Draft7Validator:
    """The bundle of `@asyncapi/specs`: the 3.0.0 schema with every definition it uses
    (bindings included) embedded under its `$id`, a draft-07 schema."""
    if not OFFICIAL.exists():
        pytest.fail(f"{OFFICIAL} is missing: run `npm ci` (package.json: @asyncapi/specs)")
    schema = json.loads(OFFICIAL.read_text(encoding="utf-8"))
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema"
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema)


def errors(document: dict[str, Any]) -> list[str]:
    return [
        f"{error.json_path}: {error.message[:200]}"
        for error in official_validator().iter_errors(document)
    ]


def test_the_checked_in_document_is_what_the_generator_writes() -> None:
    assert CHECKED_IN.read_text(encoding="utf-8") == schema_text(
        asyncapi_document(default_settings())
    ), REGENERATE


def test_the_checked_in_document_is_valid_asyncapi_3() -> None:
    document = json.loads(CHECKED_IN.read_text(encoding="utf-8"))
    assert document["asyncapi"] == "3.0.0"
    assert errors(document) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("channels", "repartition", "bindings", "kafka", "partitions"), 0),
        (("channels", "repartition", "bindings", "kafka", "bindingVersion"), "9.9.9"),
        (
            ("channels", "changelog.seen", "bindings", "kafka", "topicConfiguration"),
            {"cleanup.policy": "compact,delete"},  # the binding wants a list
        ),
        (("operations", "emitRead.repartition", "action"), "consume"),
        (("components", "messages", "fileEvent", "bindings", "kafka", "key"), 5),
        (("components", "schemas", "FileEvent", "type"), 5),
        (("servers", "kafka", "protocol"), None),
    ],
)
def test_the_official_schema_catches_a_broken_document(path: tuple[str, ...], value: Any) -> None:
    """The validation reaches into the bundle's bindings and schema objects."""
    document = copy.deepcopy(asyncapi_document(default_settings()))
    parent = document
    for name in path[:-1]:
        parent = parent[name]
    if value is None:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    assert errors(document) != []


def refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [ref for value in node.values() for ref in refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in refs(value)]
    return []


def test_every_reference_points_into_the_document() -> None:
    document = asyncapi_document(default_settings())
    found = refs(document)
    assert len(found) > 20
    for ref in found:
        assert ref.startswith("#/"), ref
        node: Any = document
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]


CONFIG = """
[kafka]
bootstrap_servers = "kafka-0.kafka:9092,kafka-1.kafka:9092"

[stream]
app_id = "acme"
raw_topics = ["files.raw", { name = "minio.events", default_source = "minio" }]
partitions = 12
replication_factor = 3
min_insync_replicas = 2

[[instances]]
name = "tenant-a"
dedupe_ttl = "48h"

[[instances]]
name = "tenant-b"
topic = "b.events"
"""


def test_every_topic_of_a_configuration_is_a_channel_with_its_settings(tmp_path: Path) -> None:
    config = tmp_path / "streams.toml"
    config.write_text(CONFIG, encoding="utf-8")
    settings = load_settings(config, environ={})
    document = asyncapi_document(settings)
    assert errors(document) == []
    channels = {channel["address"]: channel for channel in document["channels"].values()}
    specs = topology(settings)
    assert set(channels) == {spec.name for spec in specs}
    for spec in specs:
        binding = channels[spec.name]["bindings"]["kafka"]
        assert (binding["topic"], binding["partitions"], binding["replicas"]) == (
            spec.name,
            12,
            3,
        )
        configuration = binding["topicConfiguration"]
        assert set(configuration) == set(spec.config)
        for name, value in spec.config.items():
            shown = configuration[name]
            assert (",".join(shown) if isinstance(shown, list) else str(shown)) == value
    assert channels["b.events"]["messages"] == {
        "fileEvent": {"$ref": "#/components/messages/fileEvent"}
    }
    assert channels["files.stale.tenant-b"]["title"] == "Stale events: tenant-b"
    assert channels["acme-seen-changelog"]["bindings"]["kafka"]["topicConfiguration"][
        "cleanup.policy"
    ] == ["compact", "delete"]
    assert document["servers"]["kafka"]["host"] == "kafka-0.kafka:9092,kafka-1.kafka:9092"
    groups = {
        operation["bindings"]["kafka"]["groupId"]["enum"][0]
        for operation in document["operations"].values()
        if "bindings" in operation
    }
    assert groups == {"acme-normalize", "acme-emit"}
    written = {
        document["channels"][operation["channel"]["$ref"].split("/")[-1]]["address"]
        for operation in document["operations"].values()
        if operation["action"] == "send"
    }
    assert written == set(channels)


def test_output_messages_carry_the_event_schema_and_its_header() -> None:
    document = asyncapi_document(default_settings())
    embedded = document["components"]["schemas"]["FileEvent"]
    published = file_event_schema()
    assert embedded["properties"] == published["properties"]
    assert embedded["required"] == published["required"]
    for name in ("fileEvent", "staleEvent", "keyedEvent"):
        message = document["components"]["messages"][name]
        assert message["payload"] == {"$ref": "#/components/schemas/FileEvent"}
    headers = document["components"]["messages"]["fileEvent"]["headers"]
    assert headers["properties"]["ce_dataschema"]["const"] == FILE_EVENT_SCHEMA_URI
    assert "ce_dataschema" in headers["required"]
    stale = document["components"]["messages"]["staleEvent"]["headers"]
    assert "stale.reason" in stale["required"]


def test_the_asyncapi_command_writes_a_configurations_document(tmp_path: Path) -> None:
    config = tmp_path / "streams.toml"
    config.write_text(CONFIG, encoding="utf-8")
    target = tmp_path / "asyncapi.json"
    assert main(["asyncapi", "--config", str(config), "--output", str(target)]) == 0
    # the command applies the environment as every command does; this one sets none of it
    expected = asyncapi_document(load_settings(config))
    assert json.loads(target.read_text(encoding="utf-8")) == expected


def test_the_defaults_flag_writes_the_checked_in_document(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "streams.toml"
    config.write_text(CONFIG, encoding="utf-8")
    monkeypatch.setenv("STREAMS_CONFIG", str(config))  # ignored, as the environment is
    monkeypatch.setenv("STREAMS_PARTITIONS", "7")
    target = tmp_path / "asyncapi.json"
    assert main(["asyncapi", "--defaults", "--output", str(target)]) == 0
    assert target.read_text(encoding="utf-8") == CHECKED_IN.read_text(encoding="utf-8")
