"""The pieces behind an outage's log and `/ready`, on a clock the test moves.

`streams.logs.RepeatFilter` (one line per logger and message template every 5 s, with a count;
GroupCoordinatorNotAvailable at INFO) and `streams.progress.StallWatch` (a stage that handles
nothing while it has lag, or that Kafka does not answer, is stuck `STUCK_AFTER_S` after its
last sign of life). The broker-backed proof is `test_outage_logs.py`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from streams.logs import RepeatFilter, install_kafka_log_filter
from streams.progress import QUIET_S, STUCK_AFTER_S, Progress, StallWatch


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(name: str, level: int, msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_repeats_of_one_cause_become_one_line_every_5_s_with_a_count() -> None:
    clock = Clock()
    repeats = RepeatFilter(every_s=5.0, clock=clock)
    connect = "Unable connect to node with id %s: %s"
    passed = []
    for step in range(100):  # 10 s of one failure every 0.1 s, alternating nodes
        clock.now = 1000.0 + step * 0.1
        line = record("aiokafka.client", logging.ERROR, connect, step % 2, "refused")
        if repeats.filter(line):
            passed.append(line.getMessage())
    assert passed == [
        "Unable connect to node with id 0: refused",
        "Unable connect to node with id 0: refused (and 49 more like it in 5 s)",
    ]
    # Another template, or the same template from another logger, is another cause.
    assert repeats.filter(record("aiokafka.client", logging.ERROR, "Unable to update metadata"))
    assert repeats.filter(record("aiokafka.conn", logging.ERROR, connect, 1, "refused"))


@pytest.fixture
def coordinator_log() -> Iterator[logging.Logger]:
    """aiokafka's group coordinator logger, its level restored after the test (setLevel:
    it also clears the logger's cache of isEnabledFor answers)."""
    logger = logging.getLogger("aiokafka.consumer.group_coordinator")
    previous = logger.level
    yield logger
    logger.setLevel(previous)


def test_a_coordinator_still_loading_is_not_an_error(coordinator_log: logging.Logger) -> None:
    coordinator_log.setLevel(logging.INFO)
    repeats = RepeatFilter(clock=Clock())
    loading = record(
        "aiokafka.consumer.group_coordinator",
        logging.ERROR,
        "Group Coordinator Request failed: %s",
        "[Error 15] GroupCoordinatorNotAvailableError",
    )
    assert repeats.filter(loading)
    assert (loading.levelno, loading.levelname) == (logging.INFO, "INFO")
    away = record(
        "aiokafka.consumer.group_coordinator",
        logging.ERROR,
        "Group Coordinator Request failed: %s",
        "NodeNotReadyError",
    )
    assert not repeats.filter(away)  # the same template: collapsed with the first


@pytest.mark.parametrize(
    "message",
    [
        "Marking the coordinator dead (node 1)for group storage-events-emit.",
        "Group Coordinator Request failed: [Error 15] GroupCoordinatorNotAvailableError",
    ],
)
def test_at_the_default_level_a_normal_start_says_nothing_of_its_coordinators(
    coordinator_log: logging.Logger, message: str
) -> None:
    """Faust's default level is WARNING: a line demoted to INFO is then not written at all
    (the logger let it through at ERROR, and handlers take every level)."""
    coordinator_log.setLevel(logging.WARNING)
    line = record("aiokafka.consumer.group_coordinator", logging.ERROR, message)
    assert not RepeatFilter(clock=Clock()).filter(line)
    real = record("aiokafka.consumer.group_coordinator", logging.ERROR, "Unknown error 42")
    assert RepeatFilter(clock=Clock()).filter(real)
    assert real.levelno == logging.ERROR


def test_the_filter_is_on_every_aiokafka_logger_once() -> None:
    first = install_kafka_log_filter()
    again = install_kafka_log_filter()
    assert first is again
    # aiokafka's client logs as "aiokafka"; the others as their modules.
    for name in ("aiokafka", "aiokafka.conn", "aiokafka.consumer.fetcher", "aiokafka.admin.client"):
        filters = [f for f in logging.getLogger(name).filters if isinstance(f, RepeatFilter)]
        assert filters == [first], name


@pytest.fixture
def watched() -> tuple[Clock, Progress, StallWatch]:
    clock = Clock()
    progress = Progress(clock=clock)
    return clock, progress, StallWatch(progress, "emit", clock=clock)


def test_lag_with_nothing_handled_is_stuck_after_stuck_after_s(
    watched: tuple[Clock, Progress, StallWatch],
) -> None:
    clock, progress, watch = watched
    start = clock.now
    for step in range(int((STUCK_AFTER_S + 1) / 0.5) + 1):
        clock.now = start + step * 0.5
        watch.sample(handled=10.0, lag=25, answered_at=clock.now)  # Kafka answers; no progress
        if clock.now - start < STUCK_AFTER_S:
            assert progress.stuck() == {}, clock.now - start
    stuck = progress.stuck()
    assert set(stuck) == {"emit"}
    assert "25 records waiting" in str(stuck["emit"]["why"])
    assert float(str(stuck["emit"]["for_s"])) >= STUCK_AFTER_S

    clock.now += 0.5
    watch.sample(handled=12.0, lag=23, answered_at=clock.now)  # it handles records again
    assert progress.stuck() == {}


def test_no_lag_and_kafka_answering_is_not_stuck(
    watched: tuple[Clock, Progress, StallWatch],
) -> None:
    clock, progress, watch = watched
    for _ in range(40):
        clock.now += 0.5
        watch.sample(handled=0.0, lag=0, answered_at=clock.now - 0.4)
    assert progress.stuck() == {}


def test_kafka_answering_no_fetch_is_stuck_and_recovers(
    watched: tuple[Clock, Progress, StallWatch],
) -> None:
    clock, progress, watch = watched
    last_answer = clock.now
    watch.sample(handled=5.0, lag=0, answered_at=last_answer)
    clock.now += QUIET_S + 0.1
    watch.sample(handled=5.0, lag=0, answered_at=last_answer)
    assert progress.stuck() == {}  # in trouble, not yet for STUCK_AFTER_S
    clock.now = last_answer + STUCK_AFTER_S + 0.1
    watch.sample(handled=5.0, lag=None, answered_at=last_answer)
    assert "answered no fetch" in str(progress.stuck()["emit"]["why"])

    clock.now += 1
    watch.sample(handled=5.0, lag=0, answered_at=clock.now)
    assert progress.stuck() == {}


def test_a_write_in_trouble_stays_the_reported_cause(
    watched: tuple[Clock, Progress, StallWatch],
) -> None:
    clock, progress, watch = watched
    start = clock.now
    watch.sample(handled=3.0, lag=0, answered_at=start)
    progress.trouble("emit", "send", "topic out is unwritable", who=1)
    for step in range(1, 20):
        clock.now = start + step * 0.5
        watch.sample(handled=3.0, lag=40, answered_at=clock.now)  # records wait behind it
    assert progress.stuck()["emit"]["why"] == "topic out is unwritable"
