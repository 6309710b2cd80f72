"""The README's "Try it" and "Consuming" against a real `make run` stack, in a plain shell on
moved ports (issue 24, items 2, 4 and 8): the sample sent twice is one event, `make send`
makes a new one each time, `make tail` says how many events it printed from before it
started, the example consumer prints what arrives, Ctrl-C of `make tail` prints no make
`Interrupt` line, and Ctrl-C of `make run` leaves nothing running.

HOME is a temporary directory (so the broker's state and the run logs are the test's own);
the jars come from the usual cache (LOCAL_KAFKA_LIBS).
"""

from __future__ import annotations

import os
import queue
import signal
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
        yield Stack(env, process, output, webhook_port, kafka_port)
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
        env=stack.env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert sent.returncode == 0, sent.stderr
    assert "HTTP 202" in sent.stdout


def test_the_sample_twice_is_one_event_and_make_send_a_new_one_each_time(stack: Stack) -> None:
    # The README's consumer, as written, in the activated virtualenv.
    consumer = launch(
        ["/bin/bash", "-c", ". .venv/bin/activate && exec python -m examples.first_consumer"],
        cwd=ROOT,
        env={**stack.env, "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{stack.kafka_port}"},
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
        env=stack.env,
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
