"""streams.reader.close_within: a command's consumer close bounded, so that a close librdkafka
never returns from cannot hold a command after Ctrl-C (the consumers commit nothing)."""

from __future__ import annotations

import threading
import time

import pytest

from streams.reader import close_within


class Closing:
    """A consumer's close as the test wants it: returning, raising, or held until released."""

    def __init__(self, *, hold: bool = False, error: Exception | None = None) -> None:
        self.release = threading.Event()
        self.closed = threading.Event()
        self.hold, self.error = hold, error

    def close(self) -> None:
        if self.hold:
            self.release.wait(30)
        self.closed.set()
        if self.error is not None:
            raise self.error


def test_a_close_that_returns_is_waited_for(capsys: pytest.CaptureFixture[str]) -> None:
    consumer = Closing()
    assert close_within(consumer, 5) is True  # type: ignore[arg-type]
    assert consumer.closed.is_set()
    assert capsys.readouterr().err == ""


def test_a_close_that_never_returns_is_left_behind_and_said(
    capsys: pytest.CaptureFixture[str],
) -> None:
    consumer = Closing(hold=True)
    started = time.monotonic()
    try:
        assert close_within(consumer, 0.2) is False  # type: ignore[arg-type]
        waited = time.monotonic() - started
        assert 0.2 <= waited < 5, waited
        assert not consumer.closed.is_set()
        assert capsys.readouterr().err == (
            "# the consumer did not close within 0.2 s: stopping without it (it commits nothing)\n"
        )
    finally:
        consumer.release.set()
    assert consumer.closed.wait(5)


def test_what_a_close_raises_is_dropped_not_printed_as_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    consumer = Closing(error=RuntimeError("Consumer closed"))
    assert close_within(consumer, 5) is True  # type: ignore[arg-type]
    assert consumer.closed.is_set()
    assert "Traceback" not in capsys.readouterr().err
