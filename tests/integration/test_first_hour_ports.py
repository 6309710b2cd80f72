"""The local broker's sections on a moved port, end to end, as written (issue 24, item 3).

`make kafka KAFKA_SECURITY=sasl_ssl LOCAL_KAFKA_PORT=<p>` (a make variable, not exported),
then docs/local-kafka.md's secured block in a plain shell: the `client.env` the start names,
`create-topics`, the `acls | localkafka.py admin` pipes and the SCRAM users, the worker and the
bridge each as its own user (issue 35, item 6), a delivery through both, read by the admin,
the bridge's user refused the output topic in one line, and `make kafka-stop`, all against the
moved broker. The same for the three-node cluster's block, and a stop that looks in the wrong
place names what runs. HOME is a temporary directory, so every default state directory is the
test's own; the jars come from the usual cache (LOCAL_KAFKA_LIBS).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from support.worker import free_port

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


def plain(home: Path) -> dict[str, str]:
    """A plain shell's environment: HOME, the system PATH, and where the jars are cached."""
    return {
        "HOME": str(home),
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LOCAL_KAFKA_LIBS": str(LIBS),
        "LOCAL_KAFKA_HEAP": "512m",
    }


def shell(script: str, home: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`script` in a plain shell."""
    env = plain(home)
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


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@pytest.mark.slow  # a secured broker, the worker and the bridge: about a minute
def test_the_secured_section_runs_each_component_as_its_own_user_on_a_moved_port(
    tmp_path: Path,
) -> None:
    port = free_port_pair()
    block = doc_block("make kafka KAFKA_SECURITY=sasl_ssl")
    assert block[0] == "make kafka KAFKA_SECURITY=sasl_ssl"
    assert block[1].startswith("set -a; . ~/.cache/storage-events/kafka/client.env")
    source, client_env = started(shell(f"{block[0]} LOCAL_KAFKA_PORT={port}", tmp_path))
    # The block's commands after its start, in the activated virtualenv of a shell that
    # sourced the client.env the start named; the components' ports and the worker's state
    # are the test's own.
    web_port, webhook_port = free_port(), free_port()
    prelude = [
        ". .venv/bin/activate",
        source,
        f"export STREAMS_WEB_PORT={web_port} WEBHOOK_PORT={webhook_port}",
        f"export STREAMS_DATA_DIR={tmp_path / 'worker-state'}",
    ]
    commands = [line.split("  #")[0].strip() for line in block[2:]]
    components = [line.removesuffix(" &") for line in commands if line.endswith(" &")]
    setup = commands[: commands.index(components[0] + " &")]
    after = commands[commands.index(components[-1] + " &") + 1 :]
    assert [c.split()[-2:] for c in components] == [
        ["streams", "worker"],
        ["connectors", "webhook"],
    ]
    assert all("KAFKA_SASL_USERNAME=" in component for component in components)
    running: list[subprocess.Popen[str]] = []
    try:
        assert client_env == tmp_path / ".cache" / "storage-events" / f"kafka-{port}" / "client.env"
        ran = shell("\n".join([*prelude, "set -e -o pipefail", *setup]), tmp_path)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert re.search(r"created \d+ topic\(s\): files\.raw", ran.stdout), ran.stdout
        assert "principal=User:worker" in ran.stdout  # the ACLs, applied on the moved broker
        assert "principal=User:bridge" in ran.stdout
        logs = [tmp_path / "worker.log", tmp_path / "webhook.log"]
        for component, log in zip(components, logs, strict=True):
            # Each in the background of that shell, as its own user.
            with log.open("w") as out:
                running.append(
                    subprocess.Popen(
                        ["/bin/bash", "-c", "\n".join([*prelude, f"exec env {component}"])],
                        cwd=ROOT,
                        env=plain(tmp_path),
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        text=True,
                    )
                )
        deadline = time.monotonic() + 120
        urls = (f"http://127.0.0.1:{web_port}/ready", f"http://127.0.0.1:{webhook_port}/healthz")
        while not all(answers(url) for url in urls):
            said = "".join(log.read_text()[-3000:] for log in logs)
            assert all(p.poll() is None for p in running), f"a component exited:\n{said}"
            assert time.monotonic() < deadline, f"the worker or the bridge never answered:\n{said}"
            time.sleep(0.5)
        send, read, refused = after
        sent = shell("\n".join([*prelude, send]), tmp_path)
        assert sent.returncode == 0 and "HTTP 202" in sent.stdout, sent.stdout + sent.stderr
        tailed = shell("\n".join([*prelude, f"{read} --timeout 60"]), tmp_path)
        assert tailed.returncode == 0, tailed.stderr
        assert '"key":"photos/red flower.jpg"' in tailed.stdout, tailed.stdout
        # The bridge's user may write the raw topic and nothing else: one line, exit 2.
        denied = shell("\n".join([*prelude, f"{refused} --timeout 30"]), tmp_path)
        assert denied.returncode == 2, denied.stdout + denied.stderr
        errors = [line for line in denied.stderr.splitlines() if not line.startswith("#")]
        assert errors == [
            "error: Kafka refuses KAFKA_SASL_USERNAME (kafka.sasl_username)='bridge' reading "
            "files.events.default (TopicAuthorizationFailed: no ACL allows it); a principal "
            "that may: `python -m streams acls --component consumer --principal ...`"
        ], denied.stderr
        for process in running:
            os.killpg(process.pid, signal.SIGTERM)
            assert process.wait(60) == 0
        # In the same shell, `make kafka-stop` follows the port the client.env names.
        stopped = shell(f"{source}\nmake kafka-stop", tmp_path)
        assert stopped.returncode == 0, stopped.stderr
        assert f"stopped the local Kafka broker (127.0.0.1:{port})" in stopped.stdout
    finally:
        for process in running:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
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
