"""Stage one's routing takes a frozen policy, not the settings (issue 32, item 6): its core
modules import nothing of the settings, the engine or the stages, and the policy is built
once per Settings by the stage (streams.stages.normalize `route_policy`)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from streams.config import InstanceConfig, Settings
from streams.core import records
from streams.core.routing import RawTopicPolicy, RoutePolicy
from streams.stages.normalize import route_policy

ROOT = Path(__file__).parents[2]
PURE = ("streams/core/routing.py", "streams/core/records.py", "streams/core/keyedhead.py")
SHELL = ("streams.config", "streams.engine", "streams.stages")


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("module", PURE)
def test_the_routing_core_imports_no_settings_engine_or_stage(module: str) -> None:
    imported = _imports(ROOT / module)
    assert imported, module
    shell = {name for name in imported if name.startswith(SHELL)}
    assert shell == set(), f"{module} imports {sorted(shell)}"


def test_the_policy_is_built_once_per_settings_and_a_copy_builds_its_own() -> None:
    config = Settings.model_validate(
        {
            "stream": {
                "raw_topics": ["files.raw", {"name": "minio.events", "default_source": "minio"}],
                "max_events_per_delivery": {"s3": 25},
            },
            "instances": [{"name": "a", "prefix": "a"}],
        }
    )
    policy = route_policy(config)
    assert route_policy(config) is policy
    assert dataclasses.is_dataclass(policy) and type(policy).__dataclass_params__.frozen  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.repartition_topic = "x"  # type: ignore[misc]
    assert policy.events_bounds["s3"] == 25
    assert policy.events_bounds["minio"] == config.stream.events_bound("minio")
    assert policy.raw_topics["minio.events"] == RawTopicPolicy(
        "minio.events", "minio", ("minio",), None
    )
    assert policy.raw_topics["files.raw"].carries("gcs")
    assert not policy.raw_topics["minio.events"].carries("s3")
    assert (policy.repartition_topic, policy.dead_letter_topic) == (
        config.stream.repartition_topic,
        config.stream.dead_letter_topic,
    )
    grown = config.model_copy(
        update={"instances": (*config.instances, InstanceConfig(name="b", prefix="b"))}
    )
    assert route_policy(grown) is not policy
    assert route_policy(grown).index.candidates(None, "b/x") == [1]
    assert policy.index.candidates(None, "b/x") == []
    assert isinstance(policy, RoutePolicy)


def test_the_record_limits_live_in_the_core() -> None:
    from streams.engine import topics

    assert topics.EVENT_MAX_MESSAGE_BYTES == records.EVENT_MAX_MESSAGE_BYTES
    assert topics.RAW_MAX_MESSAGE_BYTES == records.RAW_MAX_MESSAGE_BYTES
