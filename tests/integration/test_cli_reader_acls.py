"""`tail`, `dead-letters` and `replay-dead-letters` (streams.reader) on a SASL_SSL broker with
ACLs: a consumer's principal (`streams acls --component consumer`) reads its instance's output
although nothing grants it the group confluent-kafka makes the commands name
(streams.reader.READER_GROUP: never joined, its coordinator lookup refused on the side), and a
principal without Read on a topic is told so in one line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from support.secured_broker import SecuredBroker
from support.worker import ROOT, Topology

from streams.core.records import RawRecord, dead_letter_record
from streams.kafka_settings import KafkaSettings

pytestmark = pytest.mark.kafka


def environ(env: dict[str, str], **more: str) -> dict[str, str]:
    """The test process' environment with only `env`'s Kafka settings (none inherited)."""
    base = {key: value for key, value in os.environ.items() if not key.startswith("KAFKA_")}
    return {**base, "STREAMS_CONFIG": "", **env, **more}


def streams(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streams", *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("# ")]


def test_a_consumer_principal_tails_its_output_and_another_is_refused_in_one_line(
    secured_kafka: SecuredBroker, tmp_path: Path
) -> None:
    names = Topology()
    config = tmp_path / "streams.toml"
    config.write_text(names.config())
    admin = environ(secured_kafka.client_env, STREAMS_CONFIG=str(config))
    created = streams(admin, "create-topics")
    assert created.returncode == 0, created.stderr
    output, dead = names.output("default"), f"{names.output('default')}.dead-letter"
    suffix = uuid.uuid4().hex[:8]
    acls = streams(
        admin,
        *("acls", "--principal", f"User:reader-{suffix}", "--component", "consumer"),
        *("--instance", "default", "--group", f"reader-app-{suffix}"),
    )
    assert acls.returncode == 0, acls.stderr
    secured_kafka.admin(acls.stdout)
    reader = environ(secured_kafka.user(f"reader-{suffix}"), STREAMS_CONFIG=str(config))
    as_admin = KafkaSettings.from_environ(secured_kafka.client_env).librdkafka_config()
    kafka_admin = AdminClient(as_admin)
    for future in kafka_admin.create_topics([NewTopic(dead, 1, 1)]).values():
        future.result(30)  # the consumer's own dead-letter topic: it may write it (Describe)
    producer = Producer({**as_admin, "acks": "all"})
    producer.produce(output, b'{"id": "s3:1"}', b"k", headers=[("ce_id", b"s3:1")])
    letter = dead_letter_record(
        names.dead_letter, RawRecord(names.raw, b"not JSON", {}), b"k", "s3: bad", "normalize"
    )
    producer.produce(names.dead_letter, letter.value, letter.key, headers=list(letter.headers))
    producer.produce(dead, b"a letter", b"k")
    assert producer.flush(30) == 0

    tailed = streams(reader, "tail", "--count", "1", "--timeout", "60", "--headers")
    assert tailed.returncode == 0, tailed.stderr
    assert tailed.stdout.splitlines() == ['{"headers":{"ce_id":"s3:1"},"event":{"id":"s3:1"}}']
    assert errors(tailed.stderr) == [], tailed.stderr
    assert "authorization" not in tailed.stderr.lower(), tailed.stderr

    # Refused by the metadata (no ACL at all on the raw topic), and by the fetch (its own
    # dead-letter topic: it may write it, so describe it, not read it): one line each.
    for topic in (names.raw, dead):
        refused = streams(reader, "tail", "--topic", topic, "--count", "1", "--timeout", "30")
        assert refused.returncode == 2, refused.stderr
        assert errors(refused.stderr) == [
            f"error: Kafka refuses KAFKA_SASL_USERNAME (kafka.sasl_username)='reader-{suffix}' "
            f"reading {topic} (TopicAuthorizationFailed: no ACL allows it); a principal that "
            "may: `python -m streams acls --component consumer --principal ...`"
        ], refused.stderr
        replay = streams(
            reader, "replay-dead-letters", "--from", topic, "--to", output, "--dry-run"
        )
        assert replay.returncode == 2, replay.stderr
        assert errors(replay.stderr) == errors(refused.stderr), replay.stderr
    dead_letters = streams(reader, "dead-letters", "--count", "1", "--timeout", "30")
    assert dead_letters.returncode == 2, dead_letters.stderr
    assert names.dead_letter in errors(dead_letters.stderr)[0], dead_letters.stderr

    # The admin reads the stream's dead letters: the stage, and the reason.
    letters = streams(admin, "dead-letters", "--count", "1", "--timeout", "60")
    assert letters.returncode == 0, letters.stderr
    [shown] = letters.stdout.splitlines()
    assert f" {names.dead_letter}[" in shown, shown
    assert " normalize: s3: bad | 8 bytes: 'not JSON'" in shown, shown
