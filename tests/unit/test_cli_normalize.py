"""`python -m streams normalize` prints what the output topic carries and says why when nothing
comes out (issue 16, item 5)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from streams.core.delivery import Delivery
from streams.core.normalizers import normalize
from streams.core.records import output_record

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv" / "bin" / "python"
S3_PUT = ROOT / "examples" / "s3-put.json"


def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    environ = {name: value for name, value in os.environ.items() if name != "STREAMS_CONFIG"}
    return subprocess.run(
        [str(PYTHON), "-m", "streams", "normalize", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=environ,
        timeout=60,
        check=False,
    )


def test_the_printed_shape_is_the_output_topics() -> None:
    """Every field of the output record's value, in its order (`raw` with --raw only)."""
    (event,) = normalize(Delivery("s3", S3_PUT.read_bytes()))
    written = json.loads(output_record("files.events.default", "default", event).value or b"")
    result = run("--source", "s3", "--raw", str(S3_PUT))
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed == written
    assert list(printed) == list(written)
    assert "version_only" in printed
    without_raw = json.loads(run("--source", "s3", str(S3_PUT)).stdout)
    assert list(without_raw) == [name for name in written if name != "raw"]


def test_a_version_delete_prints_version_only() -> None:
    body = json.loads(S3_PUT.read_text())
    record = body["Records"][0]
    record["eventName"] = "ObjectRemoved:Delete"
    record["s3"]["object"] = {
        "key": "photos/a.jpg",
        "versionId": "3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY",
        "sequencer": "0055AED6DCD90281E6",
    }
    result = run("--source", "s3", stdin=json.dumps(body))
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed["type"] == "deleted"
    assert printed["version_only"] is True


def test_a_test_event_says_why_nothing_came_out() -> None:
    result = run("--source", "s3", stdin=json.dumps({"Event": "s3:TestEvent", "Bucket": "b"}))
    assert (result.returncode, result.stdout) == (0, "")
    (line,) = result.stderr.splitlines()
    assert line.startswith("no events: the s3 normalizer yields none")
    assert "streams/core/normalizers/s3.py" in line


def test_a_filtered_event_names_the_instance_and_the_reason(tmp_path: Path) -> None:
    config = tmp_path / "streams.toml"
    config.write_text(
        '[[instances]]\nname = "videos"\nprefix = "videos"\n'
        '[[instances]]\nname = "other"\nbucket = "other"\n'
        '[[instances]]\nname = "gcs-only"\nsources = ["gcs"]\n'
    )
    expected = {
        "videos": "filtered by instance videos (prefix): the key is not under the",
        "other": "filtered by instance other (bucket): the instance takes another bucket",
        "gcs-only": "filtered by instance gcs-only (source): the instance does not list",
    }
    for instance, reason in expected.items():
        result = run("--source", "s3", "--config", str(config), "--instance", instance, str(S3_PUT))
        assert (result.returncode, result.stdout) == (0, ""), result.stderr
        (line,) = result.stderr.splitlines()
        assert line.startswith(reason), line
        assert "'photos/red flower.jpg'" in line
