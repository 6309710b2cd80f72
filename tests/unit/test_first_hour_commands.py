"""The first hour's commands without a stack (issue 35): where `make run`'s stack is recorded
and how each command finds it, what `make run` says when a child fails or a delivery is
dead-lettered, `make tail` refusing a variable it does not take, and the dead-letter line."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from dev import run as make_run
from dev import send
from streams import localstack
from streams.cli import dead_letter_line

ROOT = Path(__file__).resolve().parents[2]


def a_stack(pid: int | None = None, port: int = 29192) -> localstack.Stack:
    return localstack.Stack(
        pid=os.getpid() if pid is None else pid,
        kafka={
            "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
            "KAFKA_SECURITY_PROTOCOL": "PLAINTEXT",
        },
        webhook_port=29180,
        worker_port=29166,
        local_kafka={"LOCAL_KAFKA_PORT": str(port), "LOCAL_KAFKA_DIR": f"/x/kafka-{port}"},
    )


def test_a_recorded_stack_is_found_by_a_command_with_no_variable(tmp_path: Path) -> None:
    assert localstack.running(tmp_path) is None
    path = localstack.write(a_stack(), tmp_path)
    assert path == tmp_path / ".cache" / "storage-events" / "run" / "stack.json"
    assert path.stat().st_mode & 0o077 == 0  # the settings may hold a password
    assert localstack.running(tmp_path) == a_stack()
    added = localstack.command_environ({}, tmp_path)
    assert added == {
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:29192",
        "KAFKA_SECURITY_PROTOCOL": "PLAINTEXT",
        "LOCAL_KAFKA_PORT": "29192",
        "LOCAL_KAFKA_DIR": "/x/kafka-29192",
        "WEBHOOK_PORT": "29180",
        "STREAMS_WEB_PORT": "29166",
    }
    # What the command is given wins; the same broker named keeps the stack's ports.
    same = localstack.command_environ({"LOCAL_KAFKA_PORT": "29192", "WEBHOOK_PORT": "1"}, tmp_path)
    assert "WEBHOOK_PORT" not in same and same["STREAMS_WEB_PORT"] == "29166"
    # Another broker named: not this stack's ports either.
    assert localstack.command_environ({"LOCAL_KAFKA_PORT": "9092"}, tmp_path) == {}
    assert localstack.command_environ({"KAFKA_BOOTSTRAP_SERVERS": "kafka:9092"}, tmp_path) == {}
    assert "runs Kafka at 127.0.0.1:29192, the webhook bridge at http://127.0.0.1:29180" in (
        a_stack().describe()
    )


def test_a_stack_whose_make_run_is_gone_is_ignored_and_only_its_own_run_removes_it(
    tmp_path: Path,
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    localstack.write(a_stack(pid=gone.pid), tmp_path)
    assert localstack.recorded(tmp_path) is not None
    assert localstack.running(tmp_path) is None
    assert localstack.command_environ({}, tmp_path) == {}
    localstack.write(a_stack(), tmp_path)
    localstack.remove(gone.pid, tmp_path)  # another run's: kept
    assert localstack.running(tmp_path) is not None
    localstack.remove(os.getpid(), tmp_path)
    assert localstack.recorded(tmp_path) is None
    (tmp_path / ".cache" / "storage-events" / "run" / "stack.json").write_text("{oops")
    assert localstack.recorded(tmp_path) is None  # unreadable: as none


def stack_env(home: Path, **environ: str) -> dict[str, str]:
    """`python3 dev/stack.py env` as make evaluates it, with HOME `home`."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "dev" / "stack.py"), "env"],
        env={"HOME": str(home), "PATH": os.environ["PATH"], **environ},
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [line for line in result.stdout.splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def test_make_commands_take_the_running_stacks_settings(tmp_path: Path) -> None:
    # No `make run`: the local broker's client settings, as before.
    assert stack_env(tmp_path)["KAFKA_BOOTSTRAP_SERVERS"] == "127.0.0.1:9092"
    assert stack_env(tmp_path, KAFKA_BOOTSTRAP_SERVERS="kafka:9092") == {}
    localstack.write(a_stack(), tmp_path)
    found = stack_env(tmp_path)
    assert found["KAFKA_BOOTSTRAP_SERVERS"] == "127.0.0.1:29192"
    assert (found["WEBHOOK_PORT"], found["STREAMS_WEB_PORT"]) == ("29180", "29166")
    assert "WEBHOOK_PORT" not in stack_env(tmp_path, WEBHOOK_PORT="8080")
    moved = stack_env(tmp_path, LOCAL_KAFKA_PORT="19555")  # another broker: its own settings
    assert moved["KAFKA_BOOTSTRAP_SERVERS"] == "127.0.0.1:19555" and "WEBHOOK_PORT" not in moved


def test_make_send_finding_no_bridge_says_where_the_stack_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    error = ConnectionRefusedError(111, "Connection refused")
    line = send.nothing_answers("http://127.0.0.1:8080/hooks/s3", error)
    assert line.endswith("start `make run` first")
    localstack.write(a_stack(), tmp_path)
    line = send.nothing_answers("http://127.0.0.1:8080/hooks/s3", error)
    assert "the webhook bridge at http://127.0.0.1:29180" in line
    assert "WEBHOOK_PORT=29180 make send" in line and "\n" not in line


def test_a_child_that_exits_is_named_with_its_own_last_line(tmp_path: Path) -> None:
    log = tmp_path / "webhook.log"
    log.write_text("an earlier run's last words\n")
    offset = log.stat().st_size
    with log.open("a") as out:
        out.write("[...] INFO starting\n")
        out.write(
            "connectors: cannot listen on 127.0.0.1:8080 (address already in use); set "
            "WEBHOOK_PORT (webhook.port) to a free port\n\n"
        )
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"])
    child.wait()
    line = make_run.exited("webhook bridge", child, log, offset)  # type: ignore[arg-type]
    assert line == (
        "the webhook bridge exited with 2: connectors: cannot listen on 127.0.0.1:8080 (address "
        f"already in use); set WEBHOOK_PORT (webhook.port) to a free port (log {log})"
    )
    empty = tmp_path / "worker.log"
    empty.write_text("")
    assert make_run.exited("worker", child, empty, 0).endswith(f"exited with 2; see {empty}")  # type: ignore[arg-type]


def test_a_taken_port_is_named_before_anything_starts() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        line = make_run.taken_ports({"WEBHOOK_PORT": str(port), "STREAMS_WEB_PORT": "1"})
    assert line == (
        f"port {port} (WEBHOOK_PORT, the webhook bridge) on 127.0.0.1 is used by another "
        "process; stop it, or move the webhook bridge: WEBHOOK_PORT=<free port> make run"
    )


def test_dead_letters_in_the_worker_log_become_rate_limited_console_lines(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text("old: dead-lettered a delivery from files.raw[0]@1: before this run\n")
    watch = make_run.DeadLetterWatch(log, log.stat().st_size)
    assert watch.poll(100.0) is None
    letter = "[w] WARNING dead-lettered a delivery from files.raw[2]@7: {}\n"
    with log.open("a") as out:
        out.write(letter.format("malformed JSON"))
    first = watch.poll(100.0)
    assert first == (
        "dead-lettered a delivery from files.raw[2]@7: malformed JSON; `make dead-letters` "
        "shows each with its reason"
    )
    with log.open("a") as out:
        out.write(letter.format("second") + letter.format("third") + "[w] INFO other\n")
    assert watch.poll(105.0) is None  # within 10 s of the last line
    later = watch.poll(111.0)
    assert later is not None and "third (and 1 more since the last such line)" in later
    assert watch.poll(200.0) is None


def test_make_tail_refuses_a_variable_it_does_not_take(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    refused = subprocess.run(
        ["make", "--no-print-directory", "-s", "tail", "TOPIX=files.dead-letter"],
        cwd=ROOT,
        env={**os.environ, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert refused.returncode == 2
    assert (
        "make tail: unknown variable TOPIX (make tail takes INSTANCE TOPIC HEADERS FROM_END)"
        in refused.stderr
    )


def test_a_dead_letter_is_one_line_with_its_reason() -> None:
    message = SimpleNamespace(
        topic="files.dead-letter",
        partition=0,
        offset=3,
        timestamp=1_800_000_000_000,
        value=b"hello world\n" * 10,
        headers=[
            ("source", b"s3"),
            ("transport", b"webhook"),
            ("error", b"s3: not JSON: expecting value\nforged line"),
            ("error.stage", b"normalize"),
        ],
    )
    line = dead_letter_line(message)
    assert "\n" not in line
    assert line.startswith(
        "2027-01-15T08:00:00Z files.dead-letter[0]@3 normalize (source s3, transport webhook): "
    )
    assert "s3: not JSON: expecting value\\nforged line | 120 bytes: " in line
    assert line.endswith("...")


def test_fileevents_without_an_address_reads_the_stack_make_run_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35, item 1: the README's consumer raised ValueError with no variable set."""
    from fileevents.app import _connection

    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("KAFKA_BOOTSTRAP_SERVERS", "LOCAL_KAFKA_PORT", "LOCAL_KAFKA_DIR"):
        monkeypatch.delenv(name, raising=False)
    assert _connection(None, None).bootstrap_servers == "127.0.0.1:9092"
    localstack.write(a_stack(), tmp_path)
    assert _connection(None, None).bootstrap_servers == "127.0.0.1:29192"
    assert _connection("kafka:9092", None).bootstrap_servers == "kafka:9092"
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "other:9092")
    assert _connection(None, None).bootstrap_servers == "other:9092"


def test_tail_finding_no_kafka_says_so_in_one_line_and_where_the_stack_is(tmp_path: Path) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    env = {**os.environ, "HOME": str(tmp_path), "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"}

    def tail() -> list[str]:
        ran = subprocess.run(
            [sys.executable, "-m", "streams", "tail", "--count", "1"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert ran.returncode == 2, ran.stderr
        return [line for line in ran.stderr.splitlines() if not line.startswith("#")]

    nothing = f"error: no Kafka answers at 127.0.0.1:{port} (KAFKA_BOOTSTRAP_SERVERS)"
    assert tail() == [f"{nothing}; start `make run` (or `make kafka`) first"]
    localstack.write(a_stack(), tmp_path)
    assert tail() == [
        f"{nothing}; {a_stack().describe()}: a make command with no variable set follows it"
    ]
