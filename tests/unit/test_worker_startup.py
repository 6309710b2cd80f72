"""`faust -A streams worker` stops at once, with one line naming the field, on a bad config."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FAUST = Path(sys.executable).with_name("faust")
ROOT = Path(__file__).resolve().parents[2]


def test_a_config_mistake_stops_the_worker_with_one_line_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "streams.toml"
    config.write_text('[[instances]]\nname = "a"\ndedupe_ttl = "forever"\n')
    result = subprocess.run(
        [str(FAUST), "-A", "streams", "worker"],
        cwd=ROOT,
        env={**os.environ, "STREAMS_CONFIG": str(config)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "instances.0.dedupe_ttl" in lines[0] and str(config) in lines[0]
