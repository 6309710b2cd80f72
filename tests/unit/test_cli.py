"""`python -m streams normalize`, run as a subprocess: what it prints and how it fails."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv" / "bin" / "python"
S3_PUT = ROOT / "examples" / "s3-put.json"
FIELDS = [
    "id",
    "type",
    "key",
    "bucket",
    "size",
    "etag",
    "version_id",
    "time",
    "sequencer",
    "provider",
    "version_only",
]


def run(
    *args: str, stdin: bytes = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {name: value for name, value in os.environ.items() if name != "STREAMS_CONFIG"}
    result = subprocess.run(
        [str(PYTHON), "-m", "streams", "normalize", *args],
        input=stdin.decode("utf-8", errors="surrogateescape"),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=environ | (env or {}),
        timeout=60,
        check=False,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def lines(result: subprocess.CompletedProcess[str], why: str | None = None) -> list[dict[str, Any]]:
    """The JSON lines of a successful run; `why`: text stderr must give when nothing came out
    (streams.cli: exit 0 with the reason), else stderr is empty."""
    assert result.returncode == 0, result.stderr
    if why is None:
        assert result.stderr == ""
    else:
        assert why in result.stderr, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def fails(result: subprocess.CompletedProcess[str]) -> str:
    """The one stderr line of a failed run (exit 2, nothing on stdout)."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    error = result.stderr.splitlines()
    assert len(error) == 1, result.stderr
    assert error[0].startswith("error: ")
    return error[0]


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "streams.toml"
    path.write_text(text, encoding="utf-8")
    return path


S3_EVENT = {
    "id": "s3:3132b6dff6e9747776fd3df5df548ed7",
    "type": "created",
    "key": "photos/red flower.jpg",
    "bucket": "uploads",
    "size": 1024,
    "etag": "d41d8cd98f00b204e9800998ecf8427e",
    "version_id": None,
    "time": "2026-11-30T00:08:07Z",
    "sequencer": "0055AED6DCD90281E5",
    "provider": "s3",
    "version_only": None,
}


def test_s3_example_prints_one_line_with_exactly_the_fields() -> None:
    result = run("--source", "s3", str(S3_PUT))
    (line,) = lines(result)
    assert list(line) == FIELDS
    assert line == S3_EVENT
    assert result.stdout.count("\n") == 1


def test_raw_adds_the_provider_record() -> None:
    (line,) = lines(run("--source", "s3", "--raw", str(S3_PUT)))
    assert list(line) == [*FIELDS, "raw"]
    record = json.loads(S3_PUT.read_text())["Records"][0]
    assert line["raw"] == record
    assert line["raw"]["s3"]["object"]["key"] == "photos/red+flower.jpg"


@pytest.mark.parametrize("file_args", [["-"], []], ids=["dash", "default"])
def test_stdin(file_args: list[str]) -> None:
    (line,) = lines(run("--source", "s3", *file_args, stdin=S3_PUT.read_bytes()))
    assert line == S3_EVENT


def test_instance_applies_the_instance_rules(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        '[[instances]]\nname = "photos"\nbucket = "uploads"\nprefix = "/photos/"\n'
        'plugins = ["encryption"]\n'
        '[[instances]]\nname = "videos"\nprefix = "videos"\n'
        '[[instances]]\nname = "elsewhere"\nbucket = "other"\n',
    )
    base = ["--source", "s3", "--config", str(config), str(S3_PUT)]
    (line,) = lines(run(*base, "--instance", "photos"))
    assert line == S3_EVENT | {"key": "red flower.jpg", "size": None}
    assert lines(run(*base, "--instance", "videos"), "(prefix)") == []  # outside the prefix
    assert lines(run(*base, "--instance", "elsewhere"), "(bucket)") == []  # another bucket


def test_instance_from_streams_config(tmp_path: Path) -> None:
    config = write_config(tmp_path, '[[instances]]\nname = "p"\nprefix = "photos"\n')
    result = run(
        "--source", "s3", "--instance", "p", str(S3_PUT), env={"STREAMS_CONFIG": str(config)}
    )
    assert [line["key"] for line in lines(result)] == ["red flower.jpg"]


def test_default_instance_without_a_config() -> None:
    (line,) = lines(run("--source", "s3", "--instance", "default", str(S3_PUT)))
    assert line == S3_EVENT


def test_s3_test_event_prints_nothing() -> None:
    body = json.dumps(
        {
            "Service": "Amazon S3",
            "Event": "s3:TestEvent",
            "Time": "2026-11-30T00:08:07.000Z",
            "Bucket": "uploads",
            "RequestId": "5582815E1AEA5ADF",
            "HostId": "8cLeGAmw098X5cv4Zkwcmo8vvZa3eH3eKxsPzbB9wrR+YstdA6Knx4Ip8EXAMPLE",
        }
    ).encode()
    assert lines(run("--source", "s3", "-", stdin=body), "s3:TestEvent") == []


def test_attributes_reach_gcs() -> None:
    resource = {
        "kind": "storage#object",
        "name": "reports/q1.csv",
        "bucket": "uploads",
        "generation": "1587627537231057",
        "metageneration": "1",
        "size": "42",
        "etag": "CNHZkbuF/ugCEAE=",
        "timeDeleted": "2026-01-15T01:30:15.010Z",
    }
    attributes = {
        "eventType": "OBJECT_DELETE",
        "bucketId": "uploads",
        "objectId": "reports/q1.csv",
        "objectGeneration": "1587627537231057",
        "eventTime": "2026-01-15T01:30:15.010Z",
        "payloadFormat": "JSON_API_V1",
    }
    args = [arg for name, value in attributes.items() for arg in ("--attribute", f"{name}={value}")]
    (line,) = lines(run("--source", "gcs", *args, "-", stdin=json.dumps(resource).encode()))
    # The type and the time are only in the attributes.
    assert line["type"] == "deleted"
    assert line["time"] == "2026-01-15T01:30:15.010000Z"
    assert (line["key"], line["bucket"], line["provider"]) == ("reports/q1.csv", "uploads", "gcs")
    assert line["sequencer"] == line["version_id"] == "1587627537231057"
    assert line["size"] == 42


@pytest.mark.parametrize(("name", "works"), [("eventType", True), ("eventtype", False)])
def test_attribute_names_keep_their_case(name: str, works: bool) -> None:
    # payloadFormat NONE: the body is empty and everything comes from the attributes.
    args = ["--attribute", f"{name}=OBJECT_FINALIZE", "--attribute", "bucketId=b"]
    args += ["--attribute", "objectId=o", "--attribute", "objectGeneration=1"]
    result = run("--source", "gcs", *args, "-")
    if works:
        assert [(line["type"], line["key"]) for line in lines(result)] == [("created", "o")]
    else:
        assert "eventType" in fails(result)


@pytest.mark.parametrize(
    ("args", "stdin", "expected"),
    [
        (["--source", "s3", "-"], b"not json", "not JSON"),
        (["--source", "s3", "-"], b'{"Records": "x"}', "Records"),
        (["--source", "dropbox", str(S3_PUT)], b"", "unknown source 'dropbox'"),
        (["--source", "s3", "--header", "no-equals-sign", str(S3_PUT)], b"", "--header"),
        (["--source", "s3", "--header", "=v", str(S3_PUT)], b"", "--header"),
        (["--source", "gcs", "--attribute", "eventType", "-"], b"", "--attribute"),
        (["--source", "s3", "/nonexistent/body.json"], b"", "cannot read /nonexistent/body.json"),
        (["--source", "s3", "--config", "/nonexistent.toml", str(S3_PUT)], b"", "no such file"),
    ],
    ids=[
        "not-json",
        "malformed",
        "unknown-source",
        "bad-header",
        "header-without-name",
        "bad-attribute",
        "missing-body",
        "missing-config",
    ],
)
def test_mistakes_print_one_line_and_exit_2(args: list[str], stdin: bytes, expected: str) -> None:
    assert expected in fails(run(*args, stdin=stdin))


def test_config_mistake_names_the_field_and_the_file(tmp_path: Path) -> None:
    config = write_config(tmp_path, '[[instances]]\nname = "a"\ndedupe_ttl = "soon"\n')
    error = fails(run("--source", "s3", "--config", str(config), str(S3_PUT)))
    assert "instances.0.dedupe_ttl" in error
    assert str(config) in error


def test_config_that_is_a_directory(tmp_path: Path) -> None:
    # Used to end in an IsADirectoryError traceback.
    error = fails(run("--source", "s3", "--config", str(tmp_path), str(S3_PUT)))
    assert str(tmp_path) in error


def test_unknown_instance(tmp_path: Path) -> None:
    config = write_config(tmp_path, '[[instances]]\nname = "a"\n')
    error = fails(run("--source", "s3", "--config", str(config), "--instance", "b", str(S3_PUT)))
    assert "no instance named 'b'" in error
