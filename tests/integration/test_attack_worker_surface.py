"""What an attacker reaches of the worker itself (issue 23, findings 5 and 9): the metrics a
hostile `source` header can grow, the address and pages of its web server, and who may read
its state directory.

Records go to the raw topic as a credential that may write it would write them; the test then
reads what the worker serves and what it left on disk.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.kafka_io import Read, produce, read_topic
from support.payloads import appwrite_body, s3_body, s3_record
from support.worker import Topology, Worker, wait_for

from streams.core.normalizers import SOURCES

pytestmark = pytest.mark.kafka

HOSTILE_SOURCES = 400
LARGE_SOURCE_BYTES = 256 * 1024


@pytest.fixture(scope="module")
def worker(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    names = Topology()
    old_umask = os.umask(0o022)  # as most shells start a process
    try:
        running = Worker(kafka_bootstrap, names.config(), tmp_path_factory.mktemp("surface"))
        running.names = names  # type: ignore[attr-defined]
        running.start()
    finally:
        os.umask(old_umask)
    try:
        yield running
    finally:
        assert running.stop() == 0, running.tail()


def _series(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def test_hostile_source_headers_make_no_metric_series(worker: Worker, kafka_bootstrap: str) -> None:
    names: Topology = worker.names  # type: ignore[attr-defined]
    body = s3_body(s3_record(f"k/{uuid.uuid4().hex[:8]}.txt", "0055AED6DCD90281E5"))
    hostile = [
        (body, [("source", f"evil-{n}-{uuid.uuid4().hex}".encode())])
        for n in range(HOSTILE_SOURCES)
    ]
    hostile.append((body, [("source", b"x" * LARGE_SOURCE_BYTES)]))
    before = worker._get("/metrics")
    assert before is not None
    asyncio.run(produce(kafka_bootstrap, names.raw, hostile))
    worker.wait_metric("storage_events_dead_lettered_total", HOSTILE_SOURCES + 1, stage="normalize")
    after = worker._get("/metrics")
    assert after is not None and after[0] == 200
    text = after[1]
    for name in ("storage_events_received_total", "storage_events_normalized_total"):
        labels = set(re.findall(r'source="([^"]*)"', "\n".join(_series(text, name))))
        assert labels <= {*SOURCES, "unknown"}, sorted(labels)[:5]
    assert worker.metric("storage_events_received_total", source="unknown") == HOSTILE_SOURCES + 1
    # The page grew by a few series' values, not by a series per header or a 256 KiB label.
    assert len(text) < len(before[1]) + 16 * 1024, (len(before[1]), len(text))


def _listening(pid: int, port: int) -> set[str]:
    """The local addresses the process listens on at `port` (IPv4 and IPv6)."""
    found: set[str] = set()
    for table in ("tcp", "tcp6"):
        lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def test_the_web_server_listens_on_loopback_and_serves_only_the_product_pages(
    worker: Worker,
) -> None:
    assert worker.process is not None
    # 0100007F is 127.0.0.1; 0.0.0.0 would be 00000000 (and :: all zeros).
    assert _listening(worker.process.pid, worker.web_port) == {"0100007F"}
    for page in ("/router", "/table", "/graph", "/stats", "/performance"):
        answer = worker._get(page + "/")
        answer = answer if answer and answer[0] != 404 else worker._get(page)
        assert answer is not None and answer[0] == 404, (page, answer)
    index = worker._get("/")
    assert index is not None and index[0] == 200 and index[1].strip() == '{"status":"OK"}'


def test_the_state_directory_is_readable_by_the_workers_user_only(worker: Worker) -> None:
    data = worker.workdir / "data"
    names: Topology = worker.names  # type: ignore[attr-defined]
    state = data / f"{names.app_id}-state"
    assert state.is_dir() and any(state.iterdir())
    for directory in (data, state):
        mode = stat.S_IMODE(directory.stat().st_mode)
        assert mode & 0o077 == 0, (directory, oct(mode))


def test_a_raw_record_repeating_a_header_a_decision_reads_is_dead_lettered(
    worker: Worker, kafka_bootstrap: str
) -> None:
    """Written to the raw topic directly (past the bridge, which refuses such a request): an
    Appwrite body with its event header twice, `delete` then `create`. The worker would read
    the last; it reads neither, and dead-letters the record with both values and the reason."""
    names: Topology = worker.names  # type: ignore[attr-defined]
    file_id = f"f{uuid.uuid4().hex[:12]}"
    body, headers = appwrite_body(file_id, "uploads")
    events = next(value for name, value in headers if name.endswith("x-appwrite-webhook-events"))
    deleted = events.replace(b".create", b".delete")
    twice = [
        (name, value) for name, value in headers if not name.endswith("x-appwrite-webhook-events")
    ]
    twice += [
        ("header.x-appwrite-webhook-events", deleted),
        ("header.x-appwrite-webhook-events", events),
    ]
    lettered = worker.metric("storage_events_dead_lettered_total", stage="normalize")
    asyncio.run(produce(kafka_bootstrap, names.raw, [(body, twice)]))
    worker.wait_metric("storage_events_dead_lettered_total", lettered + 1, stage="normalize")

    def lettered_body() -> list[Read]:  # counted when decided, readable once written
        letters = asyncio.run(read_topic(kafka_bootstrap, names.dead_letter))
        return [record for record in letters if record.value == body]

    [letter] = wait_for(lettered_body, 30, "the dead letter on its topic")
    assert b"repeated header(s) header.x-appwrite-webhook-events" in letter.headers["error"]
    assert [value for name, value in letter.header_lines if name.endswith("webhook-events")] == [
        deleted,
        events,
    ]
    output = asyncio.run(read_topic(kafka_bootstrap, names.output("default"), timeout_s=3))
    assert not any(file_id in (record.value or b"").decode() for record in output)


def test_a_source_header_forging_a_log_line_stays_on_the_dead_letter_line(
    worker: Worker, kafka_bootstrap: str
) -> None:
    """Issue 31, item 3: a `source` header holding a line break and then a line in the
    worker's own format. It is dead-lettered (no such source); the log line that says so
    carries it escaped, so no line of the worker's log starts with the forged text."""
    names: Topology = worker.names  # type: ignore[attr-defined]
    tag = uuid.uuid4().hex[:10]
    forged = f"[2026-12-07 03:00:00,000] [1] [CRITICAL] FORGED-{tag} ok"
    body = s3_body(s3_record(f"k/{tag}.txt", "0055AED6DCD90281E5"))
    hostile = [
        (body, [("source", f"s3\n{forged}".encode())]),
        (body, [("source", f"s3\r{forged}".encode())]),
        (body, [("source", f"s3\u2028{forged}".encode())]),
    ]
    lettered = worker.metric("storage_events_dead_lettered_total", stage="normalize")
    asyncio.run(produce(kafka_bootstrap, names.raw, hostile))
    worker.wait_metric("storage_events_dead_lettered_total", lettered + 3, stage="normalize")

    def logged() -> list[str]:
        # Every way a log reader splits lines: \n, \r and the Unicode line separators.
        text = worker.log_path.read_text(errors="replace")
        found = [line for line in text.splitlines() if tag in line]
        return found if len(found) >= 3 else []

    lines = wait_for(logged, 30, "the dead-letter lines in the worker's log")
    assert not [line for line in lines if line.lstrip().startswith(forged)], lines
    assert all("dead-lettered a delivery from" in line for line in lines), lines
    assert any(f"s3\\n{forged}" in line for line in lines), lines

    def letters() -> list[Read]:
        found = asyncio.run(read_topic(kafka_bootstrap, names.dead_letter))
        return [record for record in found if tag.encode() in record.headers.get("error", b"")]

    # The reason written with the dead letter is the same text: one line, escaped.
    for letter in wait_for(lambda: len(found := letters()) == 3 and found, 30, "the letters"):
        assert f"FORGED-{tag}".encode() in letter.headers["error"]
        assert not set(letter.headers["error"].decode().splitlines()[1:]), letter.headers["error"]
