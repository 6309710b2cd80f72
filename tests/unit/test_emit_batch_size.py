"""`stream.emit_batch_size`: the emit stage's own batch bound (issue 33: with thousands of
instances its transactions must carry many records per output partition); unset, the emit
stage reads `batch_size` records at once as the normalize stage does."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.config import MAX_BATCH_SIZE, ConfigError, StreamConfig, load_settings


def stream(tmp_path: Path, lines: str = "") -> StreamConfig:
    path = tmp_path / "streams.toml"
    path.write_text(f"[stream]\n{lines}\n", encoding="utf-8")
    return load_settings(path, {}).stream


def test_unset_the_emit_stage_takes_batch_size(tmp_path: Path) -> None:
    unset = stream(tmp_path, "batch_size = 500")
    assert unset.emit_batch_size is None
    assert unset.emit_batch == 500  # the emit stage's max_records (streams.stages.pipeline)
    assert stream(tmp_path).emit_batch == 2000


def test_set_it_is_exactly_what_it_says(tmp_path: Path) -> None:
    assert stream(tmp_path, f"emit_batch_size = {MAX_BATCH_SIZE}").emit_batch == 100_000
    both = stream(tmp_path, "emit_batch_size = 3000\nbatch_size = 9000")
    assert (both.emit_batch, both.batch_size) == (3000, 9000)


@pytest.mark.parametrize("value", ["0", "100001", '"many"'])
def test_a_wrong_emit_batch_size_stops_start_up_naming_it(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        stream(tmp_path, f"emit_batch_size = {value}")
    assert "emit_batch_size" in str(caught.value)
