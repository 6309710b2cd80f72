"""Log lines written to a file or a pipe carry no terminal escape codes (issue 24, item 6)."""

from __future__ import annotations

import io
import logging

import pytest

from streams.logs import plain_unless_terminal, printable


class Coloured(logging.Formatter):
    """What Faust's coloured formatter does to a line."""

    def format(self, record: logging.LogRecord) -> str:
        return f"\x1b[33m{super().format(record)}\x1b[0m"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_handler_writing_to_a_file_loses_its_escape_codes_and_a_terminal_keeps_them() -> None:
    logger = logging.getLogger("test_plain_logs")
    logger.propagate = False
    piped, terminal = io.StringIO(), Terminal()
    for stream in (piped, terminal):
        handler = logging.StreamHandler(stream)
        handler.setFormatter(Coloured("%(levelname)s %(message)s"))
        logger.addHandler(handler)
    try:
        assert plain_unless_terminal(logger) == 1
        assert plain_unless_terminal(logger) == 0  # once is enough
        logger.warning("Marking the coordinator dead")
    finally:
        logger.handlers.clear()
    assert piped.getvalue() == "WARNING Marking the coordinator dead\n"
    assert terminal.getvalue() == "\x1b[33mWARNING Marking the coordinator dead\x1b[0m\n"


def test_the_admin_clients_write_no_raw_librdkafka_lines(tmp_path: object) -> None:
    """`make status`'s and the worker's confluent-kafka admin clients log through logging:
    librdkafka's own `%3|...|FAIL|...` lines never reach stderr raw."""
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: every connection is refused
    script = (
        "from streams.engine.membership import admin_client\n"
        "from streams.engine.librdkafka.group_config import configure\n"
        "from streams.kafka_settings import KafkaSettings\n"
        f"admin = admin_client('127.0.0.1:{port}')\n"
        "try:\n    admin.list_topics(timeout=2)\nexcept Exception:\n    pass\n"
        f"configure(KafkaSettings(bootstrap_servers='127.0.0.1:{port}'), [], 6.0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    raw = [line for line in result.stderr.splitlines() if line.startswith("%")]
    assert not raw, raw


@pytest.mark.parametrize(
    ("text", "logged"),
    [
        (
            "s3\n[2026-12-07 03:00:00,000] [1] [CRITICAL] x",
            "s3\\n[2026-12-07 03:00:00,000] [1] [CRITICAL] x",
        ),
        ("a\rb\r\nc", "a\\rb\\r\\nc"),
        ("a\u2028b\u2029c\x85d\x0be\x0cf\x1cg", "a\\u2028b\\u2029c\\x85d\\x0be\\x0cf\\x1cg"),
        ("\x1b[31mred\x1b[0m\t", "\\x1b[31mred\\x1b[0m\\t"),
        ("\ud800", "\\ud800"),
        ("tenant-a/x\\..\\y été 日本", "tenant-a/x\\..\\y été 日本"),  # printable: as it is
        ("", ""),
    ],
)
def test_printable_leaves_one_line_of_printable_text(text: str, logged: str) -> None:
    assert printable(text) == logged
    assert printable(text).splitlines() in ([printable(text)], [])
