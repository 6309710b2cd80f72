"""`python -m streams topics` shows the live topics beside the plan and how they differ
(issue 24, item 7): the 3-node cluster's topics had 3 replicas while the command printed the
plan's 1."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streams.engine.live_topics import LiveTopic, differences
from streams.engine.topics import TopicSpec

ROOT = Path(__file__).resolve().parents[2]


def test_differences_name_each_setting_that_is_not_the_plans() -> None:
    spec = TopicSpec("t", 4, 3, {"min.insync.replicas": "2", "cleanup.policy": "delete"}, "raw")
    assert differences(spec, LiveTopic(4, 3, {"min.insync.replicas": "2"})) == []
    assert differences(spec, LiveTopic(2, 1, {"min.insync.replicas": "1"})) == [
        "partitions 2, the plan 4",
        "replication_factor 1, the plan 3",
        "min.insync.replicas=1, the plan 2",
    ]
    assert differences(spec, None)[0].startswith("missing")


def topics(config: Path, bootstrap: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "STREAMS_CONFIG": str(config)}
    return subprocess.run(
        [sys.executable, "-m", "streams", "topics", *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.kafka
def test_topics_shows_the_live_topic_beside_the_plan(kafka_bootstrap: str, tmp_path: Path) -> None:
    unique = uuid.uuid4().hex[:8]
    raw, dead = f"raw-{unique}", f"dead-{unique}"
    config = tmp_path / "streams.toml"
    config.write_text(
        f'[stream]\nraw_topics = ["{raw}"]\ndead_letter_topic = "{dead}"\n'
        f'app_id = "app-{unique}"\npartitions = 4\n\n[[instances]]\nname = "i{unique}"\n'
    )

    async def create_raw() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(raw, 2, 1)])  # not as the plan says
        finally:
            await admin.close()

    asyncio.run(create_raw())
    result = topics(config, kafka_bootstrap)
    assert result.returncode == 0, result.stderr
    lines = {line["name"]: line for line in map(json.loads, result.stdout.splitlines())}
    assert lines[raw]["partitions"] == 4  # the plan
    assert lines[raw]["live"]["partitions"] == 2  # Kafka's
    assert lines[raw]["live"]["replication_factor"] == 1
    # created without the plan's settings: its partitions, and its record limit, differ
    assert lines[raw]["differences"][0] == "partitions 2, the plan 4"
    assert any(found.startswith("max.message.bytes=") for found in lines[raw]["differences"])
    assert lines[dead]["live"] is None and lines[dead]["differences"][0].startswith("missing")
    assert f"{len(lines)} as planned" not in result.stderr
    assert f"0 as planned, {len(lines)} differ" in result.stderr

    plan = topics(config, kafka_bootstrap, "--plan")
    assert plan.returncode == 0
    assert all("live" not in json.loads(line) for line in plan.stdout.splitlines())
