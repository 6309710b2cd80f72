"""A SIGKILLed worker restarted under its static id is back at once (librdkafka engine, KIP-848).

With `group.protocol=consumer` the coordinator refuses a member joining under a
group.instance.id its killed predecessor still holds (UNRELEASED_INSTANCE_ID) until that
member's session times out: 45 s at least (`group.consumer.min.session.timeout.ms`). The
restarted worker removes the stale member itself (streams.engine.membership.
remove_predecessor) and joins at once; this shows it processing again within a few seconds,
with nothing lost or emitted twice around the kill."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource
from support.feed import Feed
from support.kafka_io import read_topic
from support.worker import Topology, Worker, wait_for

pytestmark = pytest.mark.kafka

INSTANCE_ID = "static-rejoin"
ENV = {
    "STREAMS_ENGINE": "librdkafka",
    "STREAMS_GROUP_PROTOCOL": "consumer",
    "STREAMS_GROUP_INSTANCE_ID": INSTANCE_ID,
}
PROCESSING_AGAIN_WITHIN_S = 15.0


def _session_timeout_s(bootstrap: str, group: str) -> float:
    """The group's KIP-848 session timeout: how long it keeps a killed member."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.GROUP, group)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    return int(configs["consumer.session.timeout.ms"].value) / 1000


def test_a_killed_static_worker_restarted_under_its_id_processes_again_at_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    names = Topology()
    # The stage groups' session timeout (streams.engine.librdkafka.group_config): longer than
    # the wait below, so only the removal of the stale member explains a rejoin in time.
    config = names.config(extra="session_timeout_s = 30")
    worker = Worker(kafka_bootstrap, config, tmp_path, env=ENV).start()
    feed = Feed(kafka_bootstrap, names.raw, "rejoin")
    try:
        session_timeout_s = _session_timeout_s(kafka_bootstrap, f"{names.app_id}-emit")
        assert session_timeout_s > PROCESSING_AGAIN_WITHIN_S  # else this shows nothing
        feed.start()
        worker.wait_metric("storage_events_emitted_total", 40, instance="default")
        worker.kill()  # SIGKILL: no goodbye, the group keeps its static members
        killed = time.monotonic()
        before_restart = worker.log_path.stat().st_size
        worker.start(wait_ready=False)  # the same instance id, state directory and log
        restarted = time.monotonic()
        wait_for(
            lambda: worker.metric("storage_events_emitted_total", instance="default") > 0,
            PROCESSING_AGAIN_WITHIN_S,
            "the restarted worker to emit again",
            interval_s=0.05,
        )
        again = time.monotonic()
        print(
            f"\nrestarted under its static id: emitting again {again - restarted:.2f} s after "
            f"the restart ({again - killed:.2f} s after the SIGKILL; session timeout "
            f"{session_timeout_s:.0f} s)"
        )
        feed.stopped.set()
        feed.join()
        sent = feed.sent

        def emitted() -> Counter[str] | None:
            records = asyncio.run(read_topic(kafka_bootstrap, names.output("default")))
            keys = Counter(record.json()["key"] for record in records)
            return keys if set(keys) >= set(sent) else None

        keys = wait_for(emitted, 60, f"all {len(sent)} deliveries emitted", interval_s=1.0)
        assert worker.process is not None and worker.process.poll() is None, worker.tail()
    finally:
        feed.stopped.set()
        code = worker.stop()
    assert code == 0, worker.tail()
    assert set(keys) == set(sent)  # nothing lost, nothing made up
    assert [key for key, count in keys.items() if count > 1] == []  # nothing twice
    log = worker.log_path.read_bytes()[before_restart:].decode(errors="replace")
    for stage in ("normalize", "emit"):
        assert (
            f"{stage}: removing the killed predecessor's static member {INSTANCE_ID}-{stage} "
            f"from group {names.app_id}-{stage}: removed"
        ) in log, log[-4000:]
