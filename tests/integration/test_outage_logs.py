"""A broker outage as operators see it: health that tells the truth, and a log one can read.

On a broker of the test's own (a free port pair below the ephemeral range, state under
/tmp), a worker and a webhook bridge start; their start-up logs hold no ERROR line and no
flood of "Discovered coordinator". The broker is stopped: the bridge's `/healthz` says
`"kafka": false` (its `/ready` 503) and the worker's `/ready` answers 503 within seconds, and
the outage costs a bounded number of ERROR lines (one per cause every few seconds,
streams.logs), not one per retry. The broker comes back: both say so.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.bridge_process import BridgeProcess
from support.local_broker import PrivateBroker
from support.payloads import s3_body, s3_record
from support.worker import ROOT, Topology, Worker, free_port, wait_for

pytestmark = pytest.mark.kafka  # ~40-50 s (a broker of its own, a 20 s outage)

OUTAGE_S = 20.0
"""How long the outage lasts, as the worker's `/ready` counts it (`for_s`)."""
ERROR = re.compile(r"\[ERROR\]")


def get(url: str, body: bytes | None = None) -> tuple[int, Any] | None:
    try:
        with urllib.request.urlopen(url, data=body, timeout=3) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")
    except (OSError, ValueError):
        return None


class WebhookBridge(BridgeProcess):
    """`python -m connectors webhook` on a free port, the `s3` route open."""

    def __init__(self, bootstrap: str, config: Path, raw_topic: str, workdir: Path) -> None:
        self.port = free_port()
        self.log_path = workdir / "webhook.log"
        env = {
            **os.environ,
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "STREAMS_CONFIG": str(config),
            "WEBHOOK_PORT": str(self.port),
            "WEBHOOK_RAW_TOPIC": raw_topic,
            "WEBHOOK_INSECURE_SOURCES": "s3",
        }
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "connectors", "webhook"],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def health(self) -> dict[str, Any] | None:
        answer = get(f"http://127.0.0.1:{self.port}/healthz")
        return None if answer is None else answer[1]

    def ready(self) -> int | None:
        answer = get(f"http://127.0.0.1:{self.port}/ready")
        return None if answer is None else answer[0]

    def post(self, body: bytes) -> int | None:
        answer = get(f"http://127.0.0.1:{self.port}/hooks/s3", body)
        return None if answer is None else answer[0]


@pytest.fixture
def broker() -> Iterator[PrivateBroker]:
    with tempfile.TemporaryDirectory(prefix="health-kafka-") as directory:
        # Its own port pair, below the ephemeral range (a fixed 49092 was once taken by an
        # outgoing connection of the suite, and the broker could not bind it).
        private = PrivateBroker(Path(directory))
        private.start(fresh=True)
        try:
            yield private
        finally:
            private.run("stop")


def errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if ERROR.search(line)]


def test_health_follows_kafka_and_an_outage_logs_a_bounded_number_of_lines(
    broker: PrivateBroker, tmp_path: Path
) -> None:
    topology = Topology()
    worker = Worker(broker.bootstrap, topology.config(), tmp_path / "worker").start()
    bridge = WebhookBridge(broker.bootstrap, worker.config_path, topology.raw, tmp_path)
    ready_url = f"http://127.0.0.1:{worker.web_port}/ready"
    try:
        wait_for(lambda: (bridge.health() or {}).get("kafka") is True, 60, "the bridge's Kafka")
        assert bridge.post(s3_body(s3_record("outage/a.txt", "0A"))) == 202, bridge.log()
        worker.wait_metric("storage_events_emitted_total", 1)

        # A normal start: no ERROR line, and no line per transactional producer.
        started_worker, started_bridge = worker.log_path.read_text(errors="replace"), bridge.log()
        assert errors(started_worker) == [], "\n".join(errors(started_worker))
        assert errors(started_bridge) == [], "\n".join(errors(started_bridge))
        assert started_worker.count("Discovered coordinator") <= 6, worker.tail(80)

        broker.stop()
        wait_for(lambda: (bridge.health() or {}).get("kafka") is False, 10, "kafka: false")
        assert bridge.ready() == 503
        answer = wait_for(
            lambda: (found := get(ready_url)) is not None and found[0] == 503 and found,
            15,
            "the worker's /ready to answer 503",
        )
        assert any("why" in stage for stage in answer[1]["stages"].values()), answer

        def outage_lasted() -> bool:
            found = get(ready_url)
            stages = found[1]["stages"].values() if found is not None else []
            return (
                found is not None
                and max((float(stage.get("for_s", 0)) for stage in stages), default=0.0) >= OUTAGE_S
            )

        wait_for(outage_lasted, OUTAGE_S + 30, f"an outage of {OUTAGE_S:.0f} s")
        outage_worker = worker.log_path.read_text(errors="replace")[len(started_worker) :]
        outage_bridge = bridge.log()[len(started_bridge) :]

        broker.start()
        wait_for(lambda: (bridge.health() or {}).get("kafka") is True, 60, "kafka: true again")
        assert bridge.ready() == 200
        worker.wait_ready(timeout_s=120)
        assert bridge.post(s3_body(s3_record("outage/b.txt", "0B"))) == 202, bridge.log()
        worker.wait_metric("storage_events_emitted_total", 2, timeout_s=90)
    finally:
        bridge_code = bridge.stop()
        worker_code = worker.stop()
    assert bridge_code == 0, bridge.log()[-4000:]
    assert worker_code == 0, worker.tail()

    # Before: ~180 ERROR lines a second from the worker, ~25 from the bridge. Now one per
    # logger and cause every 5 s: a handful of causes over ~25 s.
    worker_errors, bridge_errors = errors(outage_worker), errors(outage_bridge)
    print(
        f"\nan outage of {OUTAGE_S:.0f} s: {len(worker_errors)} ERROR lines from the worker, "
        f"{len(bridge_errors)} from the bridge"
    )
    assert len(worker_errors) <= 40, "\n".join(worker_errors)
    assert len(bridge_errors) <= 20, "\n".join(bridge_errors)
    assert len(outage_worker.splitlines()) <= 150, outage_worker[-4000:]
