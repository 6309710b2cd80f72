"""The README's "Try it" and "Consuming" against a real `make run` stack, in a plain shell on
moved ports (issue 24, items 2, 4 and 8): the sample sent twice is one event, `make send`
makes a new one each time, `make tail` says how many events it printed from before it
started, the example consumer prints what arrives, Ctrl-C of `make tail` prints no make
`Interrupt` line, and Ctrl-C of `make run` leaves nothing running.

Issue 35: every command after `make run` is typed in a fresh shell with no variable set (the
stack `make run` recorded is found wherever its ports are), the README's consumer block is the
shipped file and runs as shown; bad input is visible (`make run`'s console line, `make
dead-letters` with the reason, `make status`'s duplicate and dead-letter counts, `make tail`
refusing a variable it does not take); a taken port stops `make run` at once with one line.

HOME is a temporary directory (so the broker's state and the run logs are the test's own);
the jars come from the usual cache (LOCAL_KAFKA_LIBS).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
from support.worker import free_port

from dev.kafka.private import free_port_pair

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
LIBS = Path(os.environ.get("LOCAL_KAFKA_LIBS") or Path.home() / ".cache" / "storage-events")
SAMPLE = ROOT / "examples" / "s3-put.json"


@dataclass
class Stack:
    env: dict[str, str]
    process: subprocess.Popen[str]
    output: Lines
    webhook_port: int
    kafka_port: int
    home: Path

    @property
    def fresh(self) -> dict[str, str]:
        """Another terminal: the same user (HOME), none of the variables `make run` got."""
        return plain_env(self.home)


def plain_env(home: Path, **more: str) -> dict[str, str]:
    return {
        "HOME": str(home),
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LOCAL_KAFKA_LIBS": str(LIBS),
        "LOCAL_KAFKA_HEAP": "512m",
        **more,
    }


class Lines:
    """A process stream's lines as they come (a thread reads it, so no pipe fills up)."""

    def __init__(self, stream: IO[str] | None) -> None:
        assert stream is not None
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line)
        self._queue.put(None)

    def until(self, wanted: str, timeout_s: float) -> bool:
        """Wait for a line containing `wanted` (True), the end of the stream or the timeout."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                return False
            if line is None:
                return False
            self.seen.append(line)
            if wanted in line:
                return True
        return False

    def rest(self, timeout_s: float = 30) -> list[str]:
        """Every line until the stream ends."""
        self.until("\0never\0", timeout_s)
        return self.seen


def launch(args: list[str], **options: Any) -> subprocess.Popen[str]:
    """Start `args` in a session of its own, taking Ctrl-C as in a terminal. A suite run in
    the background (`make test &` from a script) ignores SIGINT, and an ignored signal stays
    ignored across exec, so every Python below would ignore the test's Ctrl-C; a handled one
    is reset to the default. So SIGINT is handled here while the child starts."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(args, start_new_session=True, text=True, **options)
    finally:
        signal.signal(signal.SIGINT, previous)


def interrupt(process: subprocess.Popen[str], timeout_s: float = 90) -> None:
    """Ctrl-C in its terminal: SIGINT to its whole process group."""
    os.killpg(process.pid, signal.SIGINT)
    process.wait(timeout_s)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("home")
    kafka_port, webhook_port = free_port_pair(), free_port()
    env = plain_env(
        home,
        LOCAL_KAFKA_PORT=str(kafka_port),
        WEBHOOK_PORT=str(webhook_port),
        STREAMS_WEB_PORT=str(free_port()),
    )
    process = launch(
        ["make", "--no-print-directory", "run"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    output = Lines(process.stdout)
    try:
        assert output.until("Send a test S3 notification", 240), "".join(output.seen)
        assert output.until("Ctrl-C here stops", 10), "".join(output.seen)  # the banner, whole
        yield Stack(env, process, output, webhook_port, kafka_port, home)
    finally:
        if process.poll() is None:
            interrupt(process)
        subprocess.run(
            [sys.executable, "dev/kafka/localkafka.py", "stop"], cwd=ROOT, env=env, check=False
        )


def post_sample(port: int) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/hooks/s3", data=SAMPLE.read_bytes(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return int(response.status)


def make_send(stack: Stack) -> None:
    sent = subprocess.run(
        ["make", "--no-print-directory", "send"],
        cwd=ROOT,
        env=stack.fresh,
        capture_output=True,
        text=True,
        check=False,
    )
    assert sent.returncode == 0, sent.stderr
    assert "HTTP 202" in sent.stdout


def readme_consumer() -> str:
    """The README's Python block of "Consuming the output"."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Consuming the output", 1)[1]
    match = re.search(r"^```python\n(.*?)^```", section, re.S | re.M)
    assert match, "no Python block in the README's consumer section"
    return match.group(1)


def test_the_readme_consumer_is_the_shipped_file() -> None:
    shipped = (ROOT / "examples" / "first_consumer.py").read_text(encoding="utf-8")
    block = readme_consumer()
    assert block.startswith("import ")
    assert shipped.endswith("\n\n" + block), "README.md's consumer differs from the file"


def test_the_sample_twice_is_one_event_and_make_send_a_new_one_each_time(stack: Stack) -> None:
    # The banner's commands need no variable: each finds the stack.
    banner = "".join(stack.output.seen)
    assert "\n    make send\n" in banner and "\n    make tail " in banner, banner
    # The README's consumer block, as shown, in the activated virtualenv of another
    # terminal: no variable says where Kafka is.
    consumer = launch(
        ["/bin/bash", "-c", '. .venv/bin/activate && exec python -c "$CONSUMER"'],
        cwd=ROOT,
        env={**stack.fresh, "CONSUMER": readme_consumer()},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    printed, logged = Lines(consumer.stdout), Lines(consumer.stderr)
    try:
        assert post_sample(stack.webhook_port) == 202
        assert post_sample(stack.webhook_port) == 202  # the same change again: dropped
        # Each change awaited before the next, as a person trying it does: the bridge
        # spreads deliveries over the raw topic's partitions, so an older change sent
        # right behind a newer one of the same key may arrive after it, and is then stale
        # by design (files.stale.default), not an event.
        assert printed.until("created photos/red flower.jpg", 120), printed.seen
        for _ in range(2):
            make_send(stack)
            assert printed.until("created photos/red flower.jpg", 120), printed.seen
    finally:
        interrupt(consumer, 60)
    assert consumer.returncode == 0
    assert any("dedupe store MemoryDedupeStore answers" in line for line in logged.rest())
    ids = [line.rsplit("event ", 1)[1].rstrip(")\n") for line in printed.rest()]
    assert len(set(ids)) == 3  # the sample once, and one per `make send`

    # `make tail` (from the beginning) says how many of what it printed came before it.
    tail = launch(
        ["make", "--no-print-directory", "tail"],
        cwd=ROOT,
        env=stack.fresh,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    tailed, said = Lines(tail.stdout), Lines(tail.stderr)
    try:
        assert said.until("earlier event(s) above", 60), said.seen
    finally:
        interrupt(tail, 30)
    assert said.seen[-1].startswith("# 3 earlier event(s) above"), said.seen
    assert len(tailed.rest()) == 3
    assert not [line for line in said.rest() if "Interrupt" in line]  # no make `Interrupt` line


def make(stack: Stack, *args: str, **more: str) -> subprocess.CompletedProcess[str]:
    """A make command typed in another terminal (`more`: variables typed before it)."""
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=ROOT,
        env={**stack.fresh, **more},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def post(port: int, body: bytes) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/hooks/s3", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return int(response.status)


def test_bad_input_duplicates_and_dead_letters_are_visible(stack: Stack) -> None:
    """After the previous test's duplicate, one delivery that is not JSON."""
    assert post(stack.webhook_port, b"hello world") == 202  # published: the stream decides
    # make run's console names it at once, and where to read more.
    assert stack.output.until("`make dead-letters` shows each with its reason", 120), "".join(
        stack.output.seen
    )
    assert "dead-lettered a delivery from files.raw" in stack.output.seen[-1]

    letters = launch(
        ["make", "--no-print-directory", "dead-letters"],
        cwd=ROOT,
        env=stack.fresh,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    shown, said = Lines(letters.stdout), Lines(letters.stderr)
    try:
        assert shown.until("11 bytes: 'hello world'", 60), shown.seen + said.seen
    finally:
        interrupt(letters, 30)
    (line,) = shown.seen
    assert " normalize (source s3, transport webhook): " in line, line
    # `make tail TOPIC=` tails that topic (it was ignored: the instance's output instead).
    whole = launch(
        ["make", "--no-print-directory", "tail", "TOPIC=files.dead-letter", "HEADERS=1"],
        cwd=ROOT,
        env=stack.fresh,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    tailed = Lines(whole.stdout)
    try:
        assert tailed.until('"event":"hello world"', 60), tailed.seen
    finally:
        interrupt(whole, 30)
    assert '"error.stage":"normalize"' in tailed.seen[-1], tailed.seen

    status = make(stack, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert f"worker http://127.0.0.1:{stack.env['STREAMS_WEB_PORT']}: ready" in status.stdout
    (row,) = [r for r in status.stdout.splitlines() if r.strip().startswith("default ")]
    # instance, topic, events/s, emitted, duplicate, stale
    assert row.split()[3:6] == ["3", "1", "0"], status.stdout
    assert "dead letters: 1 to files.dead-letter" in status.stdout, status.stdout

    refused = make(stack, "tail", "TOPIX=files.dead-letter")
    assert refused.returncode == 2 and "make tail: unknown variable TOPIX" in refused.stderr
    # A command told to look elsewhere says where the running stack is.
    missed = make(stack, "send", WEBHOOK_PORT=str(free_port()))
    assert missed.returncode != 0
    assert f"WEBHOOK_PORT={stack.webhook_port} make send" in missed.stderr, missed.stderr


def test_a_taken_port_stops_make_run_at_once_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        began = time.monotonic()
        ran = subprocess.run(
            ["make", "--no-print-directory", "run"],
            cwd=ROOT,
            env=plain_env(tmp_path, WEBHOOK_PORT=str(port), LOCAL_KAFKA_PORT=str(free_port())),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    assert ran.returncode != 0
    assert time.monotonic() - began < 60  # nothing started: no broker, no worker
    assert (
        f"[make run] port {port} (WEBHOOK_PORT, the webhook bridge) on 127.0.0.1 is used by "
        f"another process; stop it, or move the webhook bridge: WEBHOOK_PORT=<free port> make run"
    ) in ran.stdout, ran.stdout + ran.stderr


def test_ctrl_c_of_make_run_leaves_nothing_running(stack: Stack) -> None:
    interrupt(stack.process)
    out = "".join(stack.output.rest())
    assert "stopped the Kafka broker" in out, out
    status = subprocess.run(
        [sys.executable, "dev/kafka/localkafka.py", "status"],
        cwd=ROOT,
        env=stack.env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert status.returncode == 1 and "not running" in status.stdout
    # Its record is gone with it: commands fall back to the defaults.
    assert not (stack.home / ".cache" / "storage-events" / "run" / "stack.json").exists()
