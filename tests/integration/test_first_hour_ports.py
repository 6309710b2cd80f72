"""The local broker's sections on a moved port, end to end, as written (issue 24, item 3).

`make kafka KAFKA_SECURITY=sasl_ssl LOCAL_KAFKA_PORT=<p>` (a make variable, not exported),
then docs/local-kafka.md's secured block in a plain shell: the `client.env` the start names,
`create-topics`, the `acls | localkafka.py admin` pipe, and `make kafka-stop`, all against the
moved broker. The same for the three-node cluster's block, and a stop that looks in the wrong
place names what runs. HOME is a temporary directory, so every default state directory is the
test's own; the jars come from the usual cache (LOCAL_KAFKA_LIBS).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dev.kafka.private import free_port_pair, free_port_run

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed"),
]

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "local-kafka.md"
LIBS = Path(os.environ.get("LOCAL_KAFKA_LIBS") or Path.home() / ".cache" / "storage-events")
SOURCE_LINE = re.compile(
    r"^its client settings, for this shell: (set -a; \. (\S+); set \+a)$", re.M
)


def shell(script: str, home: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`script` in a plain shell: HOME, the system PATH, and where the jars are cached."""
    env = {
        "HOME": str(home),
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LOCAL_KAFKA_LIBS": str(LIBS),
        "LOCAL_KAFKA_HEAP": "512m",
    }
    return subprocess.run(
        ["/bin/bash", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def doc_block(first_line: str) -> list[str]:
    """The lines of docs/local-kafka.md's fenced block that starts with `first_line`, with
    continuation lines joined."""
    blocks = re.findall(r"^```\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.S | re.M)
    (block,) = [block for block in blocks if block.startswith(first_line)]
    return block.replace("\\\n", " ").strip().splitlines()


def started(result: subprocess.CompletedProcess[str]) -> tuple[str, Path]:
    assert result.returncode == 0, result.stderr
    match = SOURCE_LINE.search(result.stderr)
    assert match, f"the start names no client.env to source:\n{result.stderr}"
    return match.group(1), Path(match.group(2))


def test_the_secured_section_follows_a_moved_port(tmp_path: Path) -> None:
    port = free_port_pair()
    block = doc_block("make kafka KAFKA_SECURITY=sasl_ssl")
    assert block[0] == "make kafka KAFKA_SECURITY=sasl_ssl"
    assert block[1].startswith("set -a; . ~/.cache/storage-events/kafka/client.env")
    source, client_env = started(shell(f"{block[0]} LOCAL_KAFKA_PORT={port}", tmp_path))
    try:
        assert client_env == tmp_path / ".cache" / "storage-events" / f"kafka-{port}" / "client.env"
        # The block as written after its start (the worker left out: it runs until stopped),
        # with the client.env the start named, in the activated virtualenv.
        commands = [line for line in block[2:] if not line.startswith("faust ")]
        script = "\n".join([". .venv/bin/activate", source, "set -e -o pipefail", *commands])
        ran = shell(script, tmp_path)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert re.search(r"created \d+ topic\(s\): files\.raw", ran.stdout), ran.stdout
        assert "principal=User:worker" in ran.stdout  # the ACLs, applied on the moved broker
        # In the same shell, `make kafka-stop` follows the port the client.env names.
        stopped = shell(f"{source}\nmake kafka-stop", tmp_path)
        assert stopped.returncode == 0, stopped.stderr
        assert f"stopped the local Kafka broker (127.0.0.1:{port})" in stopped.stdout
    finally:
        shell(f"LOCAL_KAFKA_PORT={port} make kafka-stop", tmp_path)


def test_the_cluster_section_follows_a_moved_port(tmp_path: Path) -> None:
    port = free_port_run(6)
    block = doc_block("make kafka KAFKA_BROKERS=3")
    assert not re.search(r"1909[2-7]", " ".join(line for line in block if "client.env" not in line))
    assert block[-1] == "make kafka-stop KAFKA_BROKERS=3"
    source, client_env = started(shell(f"{block[0]} LOCAL_KAFKA_PORT={port}", tmp_path))
    try:
        settings = client_env.read_text()
        bootstrap = ",".join(f"127.0.0.1:{port + offset}" for offset in range(3))
        assert f"KAFKA_BOOTSTRAP_SERVERS={bootstrap}" in settings
        assert "STREAMS_REPLICATION_FACTOR=3" in settings

        # Without the sourced settings, a stop looks at the default port and finds nothing
        # there: it names the moved cluster and the command that stops it, and fails.
        missed = shell(block[-1], tmp_path)
        assert missed.returncode != 0
        assert "no local Kafka cluster is running" in missed.stderr
        assert f"LOCAL_KAFKA_PORT={port} make kafka-stop KAFKA_BROKERS=3" in missed.stderr
        assert (
            shell(
                f"LOCAL_KAFKA_PORT={port} python3 dev/kafka/localkafka.py status --brokers 3",
                tmp_path,
            ).returncode
            == 0
        )  # still running

        # The block's commands after the start, in a shell that sourced the client.env: the
        # topics get the cluster's replication (the worker is left out: it runs until stopped).
        script = "\n".join(
            [
                ". .venv/bin/activate",
                source,
                "set -e",
                "python -m streams create-topics",
                "python -m streams topics",
                block[-1],
            ]
        )
        ran = shell(script, tmp_path)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert '"replication_factor": 3' in ran.stdout or '"replication_factor":3' in ran.stdout
        assert f"stopped the local Kafka cluster ({bootstrap})" in ran.stdout
    finally:
        shell(f"LOCAL_KAFKA_PORT={port} make kafka-stop KAFKA_BROKERS=3", tmp_path)
