"""A full disk under the worker's state: a clear error and an exit, not a silent stall."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.kafka_io import produce, raw
from support.payloads import s3_body, s3_record
from support.worker import Topology, Worker, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs: a real filesystem that runs out of space."""
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}); needs root")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(directory: Path) -> None:
    """Write until the filesystem refuses: ENOSPC."""
    # Unbuffered: a buffered file's close would retry the write that failed, and raise.
    with (directory / "filler").open("wb", buffering=0) as filler:
        chunk = b"\0" * 65536
        try:
            while True:
                filler.write(chunk)
        except OSError:
            pass


def test_a_full_state_disk_stops_the_worker_with_a_clear_error(
    kafka_bootstrap: str, tmp_path: Path, small_disk: Path
) -> None:
    names = Topology()
    worker = Worker(
        kafka_bootstrap,
        names.config(),
        tmp_path / "worker",
        env={"STREAMS_DATA_DIR": str(small_disk / "state")},
    ).start()
    try:
        fill(small_disk)
        key = f"full/{uuid.uuid4().hex[:8]}"
        bodies = [raw(s3_body(s3_record(f"{key}/{n}", f"00{n:016X}")), "s3") for n in range(50)]
        asyncio.run(produce(kafka_bootstrap, names.raw, bodies))
        assert worker.process is not None
        process = worker.process
        wait_for(lambda: process.poll() is not None, 90, "the worker to stop on the full disk")
    finally:
        worker.kill()
    assert process.returncode != 0
    log = worker.log_path.read_text(errors="replace")
    assert "No space left on device" in log, worker.tail()
    assert "stopping the worker" in log, worker.tail()
