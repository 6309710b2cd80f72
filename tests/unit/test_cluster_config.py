"""`stream.min_insync_replicas`: checked against `replication_factor` at start-up, and set on
every topic the stream creates (internal ones too) as `min.insync.replicas`."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.config import ConfigError, load_settings
from streams.engine.topics import MIN_INSYNC_REPLICAS, topology


def write(tmp_path: Path, stream: str) -> Path:
    path = tmp_path / "streams.toml"
    path.write_text(f"[stream]\n{stream}\n")
    return path


def test_more_in_sync_replicas_than_replicas_names_the_field_and_the_file(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "replication_factor = 1\nmin_insync_replicas = 2")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ={})
    message = str(caught.value)
    assert str(path) in message
    assert "stream.min_insync_replicas: 2 is more than replication_factor (1)" in message


def test_the_check_names_the_environment_variable_that_set_it(tmp_path: Path) -> None:
    path = write(tmp_path, "replication_factor = 3")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ={"STREAMS_MIN_INSYNC_REPLICAS": "4"})
    message = str(caught.value)
    assert "stream.min_insync_replicas: 4 is more than replication_factor (3)" in message
    assert "(from environment variable STREAMS_MIN_INSYNC_REPLICAS)" in message


def test_a_lowered_replication_factor_is_checked_too() -> None:
    """The environment lowers the replicas under the file's (or here the default's) value."""
    with pytest.raises(ConfigError, match=r"stream\.min_insync_replicas: 2 is more than"):
        load_settings(
            None,
            environ={"STREAMS_REPLICATION_FACTOR": "1", "STREAMS_MIN_INSYNC_REPLICAS": "2"},
        )


def test_zero_in_sync_replicas_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"stream\.min_insync_replicas.*STREAMS_MIN_INSYNC"):
        load_settings(None, environ={"STREAMS_MIN_INSYNC_REPLICAS": "0"})


def test_every_topic_gets_the_setting_internal_ones_included(tmp_path: Path) -> None:
    path = write(tmp_path, "replication_factor = 3\nmin_insync_replicas = 2")
    specs = topology(load_settings(path, environ={}))
    roles = {spec.role for spec in specs}
    assert {"raw", "repartition", "changelog", "dead-letter", "output", "stale"} <= roles
    for spec in specs:
        assert spec.replication_factor == 3, spec
        assert spec.config[MIN_INSYNC_REPLICAS] == "2", spec


def test_the_default_is_one_of_one() -> None:
    settings = load_settings(None, environ={})
    assert (settings.stream.replication_factor, settings.stream.min_insync_replicas) == (1, 1)
    assert {spec.config[MIN_INSYNC_REPLICAS] for spec in topology(settings)} == {"1"}
