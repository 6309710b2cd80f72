"""An instance's own partition count (`[[instances]] partitions`): its output and stale topics
get it, every other topic keeps `stream.partitions`; a bad value stops start-up naming the
field."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.config import ConfigError, load_settings
from streams.engine.topics import topology

CONFIG = """
[stream]
partitions = 6

[[instances]]
name = "big"
bucket = "uploads"
prefix = "big"

[[instances]]
name = "small"
bucket = "uploads"
prefix = "small"
partitions = 1
"""


def test_an_instance_partitions_go_to_its_output_and_stale_topics_only(tmp_path: Path) -> None:
    path = tmp_path / "streams.toml"
    path.write_text(CONFIG)
    settings = load_settings(path, environ={})
    counts = {spec.name: spec.partitions for spec in topology(settings)}
    small = next(instance for instance in settings.instances if instance.name == "small")
    big = next(instance for instance in settings.instances if instance.name == "big")
    assert counts[small.output_topic] == counts[small.stale_output_topic] == 1
    assert counts[big.output_topic] == counts[big.stale_output_topic] == 6
    others = set(counts) - {
        small.output_topic,
        small.stale_output_topic,
        big.output_topic,
        big.stale_output_topic,
    }
    assert others and {counts[name] for name in others} == {6}


@pytest.mark.parametrize("value", ["0", "10001", '"one"'])
def test_a_bad_partition_count_names_the_field(tmp_path: Path, value: str) -> None:
    path = tmp_path / "streams.toml"
    path.write_text(CONFIG.replace("partitions = 1", f"partitions = {value}"))
    with pytest.raises(ConfigError, match=r"instances\.1\.partitions|instances\[1\]\.partitions"):
        load_settings(path, environ={})
