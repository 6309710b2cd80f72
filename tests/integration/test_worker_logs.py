"""A worker started as the README writes it (`faust -A streams worker`, Faust's default level,
its output redirected to a file) gives one clear sign of life and no noise (issue 24, item 6):
one `ready:` line naming its stages, their partitions and its web address; a normal start's
coordinator states (GroupCoordinatorNotAvailable, "Marking the coordinator dead",
"Coordinator load in progress") at INFO, so not at this level; no terminal escape codes; no
raw librdkafka `%N|...` line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from support.worker import ROOT, Topology, Worker, wait_for

pytestmark = pytest.mark.kafka

NORMAL_START_STATES = (
    "GroupCoordinatorNotAvailable",
    "Marking the coordinator dead",
    "Coordinator load in progress",
)
RAW_LIBRDKAFKA_LINE = re.compile(r"^%\d\|\d+\.\d+\|", re.MULTILINE)


def ready_lines(worker: Worker) -> list[str]:
    return [line for line in worker.log_path.read_text().splitlines() if "ready: stages" in line]


@pytest.mark.parametrize("level", [None, "info"], ids=["default level", "info"])
def test_a_started_worker_says_once_that_it_is_ready_and_nothing_of_its_coordinators(
    kafka_bootstrap: str, tmp_path: Path, level: str | None
) -> None:
    names = Topology()
    # A relative state directory, as a worker started by hand in a checkout has (`var/streams`):
    # the ready line names it absolutely (issue 35, item 5).
    relative = os.path.relpath(tmp_path / "data", ROOT)
    worker = Worker(kafka_bootstrap, names.config(), tmp_path, {"STREAMS_DATA_DIR": relative})
    worker.start(level=level)
    try:
        wait_for(lambda: ready_lines(worker), 30, "the ready line")
    finally:
        assert worker.stop() == 0, worker.tail()
    text = worker.log_path.read_text()
    [ready] = ready_lines(worker)
    assert re.search(
        rf"ready: stages normalize \(\d+ partitions\), emit \(\d+ partitions(; process \d+)?\); "
        rf"state in RocksDB at {re.escape(str(tmp_path / 'data' / (names.app_id + '-state')))} "
        rf"\(Faust's banner `store` is its own table store, unused\); "
        rf"web http://127\.0\.0\.1:{worker.web_port}; started in \d+\.\d s\s*$",
        ready,
    ), ready
    assert "\x1b[" not in text  # a file, not a terminal: no escape codes
    assert not RAW_LIBRDKAFKA_LINE.search(text), text
    if level is None:  # Faust's default (WARN): a normal start's coordinator states are INFO
        noise = [line for line in text.splitlines() if any(s in line for s in NORMAL_START_STATES)]
        assert noise == [], noise
