"""The engine settings and the librdkafka engine's pure parts (streams.engine)."""

from __future__ import annotations

import pytest

from streams.config import ConfigError, load_settings
from streams.core.records import OutRecord
from streams.engine.librdkafka.consumer import consumer_config
from streams.engine.librdkafka.producer import acknowledgements, producer_config
from streams.kafka_settings import KafkaSettings


def test_the_engine_is_librdkafka_speaking_kip_848_by_default() -> None:
    stream = load_settings(environ={}).stream
    assert (stream.engine, stream.group_protocol) == ("librdkafka", "consumer")
    chosen = load_settings(
        environ={"STREAMS_ENGINE": "librdkafka", "STREAMS_GROUP_PROTOCOL": "classic"}
    ).stream
    assert (chosen.engine, chosen.group_protocol) == ("librdkafka", "classic")


def test_the_removed_aiokafka_engine_stops_start_up_saying_how_to_upgrade() -> None:
    """A deployment that still sets STREAMS_ENGINE=aiokafka is told, naming the field, that
    the engine is gone and that unsetting it upgrades in place."""
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={"STREAMS_ENGINE": "aiokafka"})
    message = str(caught.value)
    assert "STREAMS_ENGINE" in message and "engine" in message
    assert "removed" in message and "docs/upgrading.md" in message


@pytest.mark.parametrize(
    ("variable", "field"),
    [("STREAMS_ENGINE", "engine"), ("STREAMS_GROUP_PROTOCOL", "group_protocol")],
)
def test_an_unknown_engine_setting_stops_start_up_naming_it(variable: str, field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={variable: "kafka-streams"})
    assert field in str(caught.value) and variable in str(caught.value)


def test_the_consumer_protocol_leaves_session_and_assignor_to_the_broker() -> None:
    connection = KafkaSettings(bootstrap_servers="k:9092").librdkafka_config()
    common = {
        "client_id": "app-emit",
        "group_id": "app-emit",
        "group_instance_id": "w-0-emit",
        "session_timeout_s": 15.0,
    }
    new = consumer_config(connection, group_protocol="consumer", **common)  # type: ignore[arg-type]
    assert new["group.protocol"] == "consumer"
    assert new["group.instance.id"] == "w-0-emit"
    assert new["isolation.level"] == "read_committed"
    # librdkafka refuses these with group.protocol=consumer.
    assert not {"session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"} & (
        set(new)
    )
    classic = consumer_config(connection, group_protocol="classic", **common)  # type: ignore[arg-type]
    assert classic["partition.assignment.strategy"] == "cooperative-sticky"
    assert classic["session.timeout.ms"] == 15_000
    assert new["bootstrap.servers"] == "k:9092"


def test_every_producer_is_idempotent_with_the_java_partitioner() -> None:
    config = producer_config(KafkaSettings(bootstrap_servers="k:9092"), "app-sender")
    assert config["enable.idempotence"] is True and config["acks"] == "all"
    assert config["partitioner"] == "murmur2_random"  # streams.core.partitioning.partition_for's


def test_acknowledgements_give_each_partitions_last_offset_exactly() -> None:
    records = [OutRecord("c", b"a", b"1"), OutRecord("c", b"b", b"2"), OutRecord("o", b"c", b"3")]
    reports = [(None, 0, 7), (None, 0, 8), (None, 2, 40)]
    acks = {(ack.topic, ack.partition): ack for ack in acknowledgements(records, reports)}
    assert acks[("c", 0)].last_offset == 8 and acks[("c", 0)].count == 2
    assert acks[("o", 2)].last_offset == 40
    failed = acknowledgements(records[:1], [(object(), 0, -1)])  # type: ignore[list-item]
    assert failed == []


def test_librdkafka_lines_repeat_once_per_cause_not_once_per_template() -> None:
    import logging

    from streams.engine.librdkafka import librdkafka_log

    logger = librdkafka_log()
    assert librdkafka_log() is logger and len(logger.filters) == 1  # installed once
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Keep()
    logger.addHandler(handler)
    try:
        for _ in range(3):  # as confluent-kafka logs: one template for every line
            logger.error("%s [%s] %s", "FAIL", "c#consumer-1", "Connect to 127.0.0.1:1 failed")
        logger.error("%s [%s] %s", "GETPID", "c#producer-2", "Not coordinator: retrying")
        # One cause from every client, thread and broker handle while a broker is away.
        for client in ("app-emit#consumer-2", "app-normalize#consumer-1", "app-sender#producer-4"):
            for handle in ("127.0.0.1:9092/bootstrap", "127.0.0.1:9092/1"):
                logger.error(
                    "%s [%s] %s",
                    "FAIL",
                    client,
                    f"[thrd:{handle}]: {handle}: Connect to ipv4#127.0.0.1:9092 failed: "
                    "Connection refused (after 0ms in state CONNECT)",
                )
    finally:
        logger.removeHandler(handler)
    assert seen == [
        "FAIL [c#consumer-1] Connect to 127.0.0.1:1 failed",
        "GETPID [c#producer-2] Not coordinator: retrying",
        "FAIL [app-emit#consumer-2] [thrd:127.0.0.1:9092/bootstrap]: 127.0.0.1:9092/bootstrap: "
        "Connect to ipv4#127.0.0.1:9092 failed: Connection refused (after 0ms in state CONNECT)",
    ]


def test_a_transaction_coordinator_still_loading_is_info_not_a_warning() -> None:
    """A normal start's `Failed to acquire transactional PID ... Coordinator load in
    progress`: at INFO when the worker logs at INFO, not written at its default WARNING."""
    import logging

    from streams.engine.librdkafka import librdkafka_log

    logger = librdkafka_log()
    seen: list[tuple[str, str]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append((record.levelname, record.getMessage()))

    line = (
        "[thrd:main]: Failed to acquire transactional PID from broker TxnCoordinator/1: "
        "Broker: Coordinator load in progress: retrying"
    )
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    try:
        logger.setLevel(logging.WARNING)
        logger.warning("%s [%s] %s", "GETPID", "app-emit-0#producer-3", line)
        logger.warning("%s [%s] %s", "REQTMOUT", "app-emit-0#producer-3", "Timed out")
        logger.setLevel(logging.INFO)
        logger.warning("%s [%s] %s", "GETPID", "app-emit-1#producer-4", f"{line} again")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert seen == [
        ("WARNING", "REQTMOUT [app-emit-0#producer-3] Timed out"),
        ("INFO", f"GETPID [app-emit-1#producer-4] {line} again"),
    ]


def test_a_refusal_reads_as_aiokafka_names_it() -> None:
    from confluent_kafka import KafkaError

    from streams.engine.librdkafka.producer import refusal_error

    refused = refusal_error(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "Broker: too large"))
    assert type(refused).__name__ == "MessageSizeTooLargeError"  # dead letters' reason
    assert "_TRANSPORT" in repr(refusal_error(KafkaError(KafkaError._TRANSPORT, "away")))
