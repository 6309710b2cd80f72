"""Offsets are committed only once an event's handlers succeeded: a consumer SIGKILLed in
the middle of a handler hands that event to its successor; SIGTERM finishes it first."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from consumer_support import committed, create_topics, end_offsets, event, produce_events, unique
from support.worker import ROOT, wait_for

pytestmark = pytest.mark.kafka

RUNNER = Path(__file__).with_name("runner.py")


class Runner:
    """One `runner.py` process; its stderr goes to a log the assertions quote."""

    def __init__(self, workdir: Path, name: str, args: list[str]) -> None:
        self.log_path = workdir / f"{name}.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(RUNNER), *args],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"runner exited with {self.process.returncode}:\n{self.log()}")
        return True

    def release(self) -> None:
        """Let the blocked handler go on."""
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")
        self.process.stdin.flush()

    def end(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def runners(tmp_path: Path) -> Iterator[list[Runner]]:
    started: list[Runner] = []
    yield started
    for runner in started:
        runner.end()


class Setup:
    def __init__(self, bootstrap: str, workdir: Path) -> None:
        self.bootstrap, self.workdir = bootstrap, workdir
        self.topic, self.group, self.member = unique("events"), unique("group"), unique("member")
        self.db = workdir / "runs.sqlite"

    def start(self, runners: list[Runner], name: str, block_id: str | None = None) -> Runner:
        args = ["--bootstrap", self.bootstrap, "--topic", self.topic, "--group", self.group]
        args += ["--db", str(self.db), "--member", self.member]
        runner = Runner(
            self.workdir, name, [*args, *(["--block-id", block_id] if block_id else [])]
        )
        runners.append(runner)
        return runner

    def rows(self, step: str) -> list[tuple[str, int]]:
        """(event id, pid) of each `step` row, in insertion order."""
        if not self.db.exists():
            return []
        with sqlite3.connect(self.db, timeout=30) as connection:
            try:
                found = connection.execute(
                    "select event_id, pid from runs where step = ? order by rowid", (step,)
                ).fetchall()
            except sqlite3.OperationalError:  # the table is not there yet
                return []
        return [(event_id, pid) for event_id, pid in found]

    def ids(self, step: str) -> list[str]:
        return [event_id for event_id, _ in self.rows(step)]

    def committed(self) -> dict[int, int]:
        return asyncio.run(committed(self.bootstrap, self.group, self.topic))


def test_sigkill_mid_handler_redelivers_that_event(
    kafka_bootstrap: str, tmp_path: Path, runners: list[Runner]
) -> None:
    setup = Setup(kafka_bootstrap, tmp_path)
    first_key = [event("a/first", seq) for seq in range(5)]
    other_key = [event("b/other", seq) for seq in range(3)]
    blocked = first_key[2]

    async def prepare() -> dict[str, tuple[int, int]]:
        await create_topics(kafka_bootstrap, (setup.topic, 2))
        items = [*first_key, *other_key]
        sent = await produce_events(kafka_bootstrap, setup.topic, items)
        return {
            item.id: (meta.partition, meta.offset) for item, meta in zip(items, sent, strict=True)
        }

    where = asyncio.run(prepare())
    ends = asyncio.run(end_offsets(kafka_bootstrap, setup.topic))
    first = setup.start(runners, "first", block_id=blocked.id)
    wait_for(lambda: first.alive() and blocked.id in setup.ids("started"), 30, "the blocked event")
    # Commits reach the blocked event and stop there; the other key's partition (if it has
    # one of its own) is committed to its end.
    partition, offset = where[blocked.id]
    wanted = {p: end for p, end in ends.items() if end and p != partition}
    wanted[partition] = offset
    wait_for(lambda: setup.committed() == wanted, 30, f"commits {wanted}")
    assert first_key[3].id not in setup.ids("started"), "the next event of the key started"

    first.process.send_signal(signal.SIGKILL)
    first.process.wait(10)
    second = setup.start(runners, "second")
    every_id = {item.id for item in [*first_key, *other_key]}
    wait_for(lambda: second.alive() and set(setup.ids("finished")) == every_id, 60, "every event")
    wait_for(lambda: setup.committed() == {p: e for p, e in ends.items() if e}, 30, "commits")

    started = setup.rows("started")
    finished = setup.rows("finished")
    pids = {first.process.pid, second.process.pid}
    assert [pid for event_id, pid in started if event_id == blocked.id] == [
        first.process.pid,
        second.process.pid,
    ], "the event interrupted by SIGKILL was not handled again"
    assert [pid for event_id, pid in finished if event_id == blocked.id] == [second.process.pid]
    # Everything committed before the kill ran exactly once.
    assert sorted(setup.ids("finished")) == sorted(every_id)
    assert {pid for _, pid in started} <= pids

    second.process.send_signal(signal.SIGTERM)
    assert second.process.wait(30) == 0, second.log()


def test_sigterm_finishes_the_handler_in_progress_then_commits(
    kafka_bootstrap: str, tmp_path: Path, runners: list[Runner]
) -> None:
    setup = Setup(kafka_bootstrap, tmp_path)
    items = [event("c/one-key", seq) for seq in range(4)]
    blocked = items[1]

    async def prepare() -> list[int]:
        await create_topics(kafka_bootstrap, (setup.topic, 1))
        return [meta.offset for meta in await produce_events(kafka_bootstrap, setup.topic, items)]

    offsets = asyncio.run(prepare())
    runner = setup.start(runners, "runner", block_id=blocked.id)
    wait_for(lambda: runner.alive() and blocked.id in setup.ids("started"), 30, "the blocked event")

    runner.process.send_signal(signal.SIGTERM)
    wait_for(lambda: runner.alive() and "SIGTERM" in runner.log(), 30, "the SIGTERM log line")
    runner.release()
    assert runner.process.wait(30) == 0, runner.log()

    assert setup.ids("finished") == [items[0].id, blocked.id]
    assert setup.ids("started") == [items[0].id, blocked.id], "an event started after SIGTERM"
    assert setup.committed() == {0: offsets[1] + 1}
