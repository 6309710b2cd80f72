"""Configuration of the instance rules and the emit stage's state: `sources`, the clock skew."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.config import ConfigError, Settings, load_settings


def load(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> Settings:
    path = tmp_path / "streams.toml"
    path.write_text(text, encoding="utf-8")
    return load_settings(path, environ or {})


def test_sources_default_to_every_source(tmp_path: Path) -> None:
    settings = load(tmp_path, '[[instances]]\nname = "a"\nbucket = "uploads"\n')
    assert settings.instances[0].sources is None


def test_sources_are_read_and_kept_in_order_once(tmp_path: Path) -> None:
    text = '[[instances]]\nname = "a"\nsources = ["s3", "minio", "s3"]\n'
    assert load(tmp_path, text).instances[0].sources == ("s3", "minio")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('["s3", "dropbox"]', r"instances\.0\.sources: .*unknown source 'dropbox' \(known: s3, "),
        ("[]", r"instances\.0\.sources: needs at least one source"),
        ('"s3"', r"instances\.0\.sources"),
    ],
)
def test_a_wrong_source_names_the_field(tmp_path: Path, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, f'[[instances]]\nname = "a"\nsources = {value}\n')


def test_the_clock_skew_bound_defaults_to_five_minutes(tmp_path: Path) -> None:
    assert load(tmp_path, "").stream.max_clock_skew_s == 300.0


def test_the_clock_skew_bound_from_the_file_or_the_environment(tmp_path: Path) -> None:
    assert load(tmp_path, '[stream]\nmax_clock_skew_s = "2m"\n').stream.max_clock_skew_s == 120.0
    environ = {"STREAMS_MAX_CLOCK_SKEW_S": "30"}
    text = '[stream]\nmax_clock_skew_s = "2m"\n'
    assert load(tmp_path, text, environ).stream.max_clock_skew_s == 30.0
    with pytest.raises(ConfigError, match=r"stream\.max_clock_skew_s.*STREAMS_MAX_CLOCK_SKEW_S"):
        load(tmp_path, "", {"STREAMS_MAX_CLOCK_SKEW_S": "-1"})
