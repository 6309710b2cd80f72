"""How the commands read a topic on confluent-kafka: `tail`, `dead-letters` and
`replay-dead-letters` (streams.cli, streams.replay).

Each command's consumer is assigned partitions (no group joined, nothing committed: the
`group.id` confluent-kafka wants is only named) and reads `read_committed`, with librdkafka's
end of partition reported (`enable.partition.eof`): with that isolation a partition's end is
its last stable offset, past the commit marker of its last transaction, which no record
carries (streams.engine.store reads its changelogs to their end the same way). The calls
block; the commands are plain synchronous code, each call bounded: a wait for records at most
half a second, a metadata request half a second at a time, ListOffsets CALL_TIMEOUT_S (once,
at start), so that Ctrl-C stops them within that.

What the commands say about Kafka comes from here, in one line each: no broker answering at
start (`NoBroker`, from librdkafka's "all brokers down"), a topic the principal may not read
(`refused_read`). librdkafka's own log lines go to a logger of the commands' own, which drops
them (`silent_log`: they would repeat what the command says, per reconnect); the engine's
logger is left as it is for whatever else runs in the process.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as RdTopicPartition

from streams.engine.librdkafka import LIBRDKAFKA_LOGGER
from streams.engine.librdkafka.consumer import fetch_bounds, headers_unreadable
from streams.engine.topics import DEAD_LETTER_MAX_MESSAGE_BYTES
from streams.kafka_settings import KafkaSettings

CALL_TIMEOUT_S = 10.0
"""One metadata or ListOffsets request answered within this, or the command gives up."""
START_POLL_S = 0.5
"""How long one metadata request at start may wait before the command looks whether
librdkafka found every broker down (then it says so, instead of waiting CALL_TIMEOUT_S)."""
CLOSE_WITHIN_S = 5.0
"""How long a stopping command waits for its consumer's close (`close_within`)."""
READER_GROUP = "storage-events-reader"
"""The `group.id` of the commands' consumers. confluent-kafka wants one, and librdkafka looks
its coordinator up; the consumers are assigned partitions from explicit offsets and never join
it nor commit to it, so a principal without access to it reads all the same (its coordinator
lookup fails on the side, reported to nobody)."""


class NoBroker(Exception):
    """No broker of the bootstrap servers answered at start."""


class TopicRefused(Exception):
    """Kafka refuses this principal reading the topic (TOPIC_AUTHORIZATION_FAILED)."""


def refused_read(kafka: KafkaSettings, topic: str) -> str:
    """One line: the ACLs do not let this principal read `topic`."""
    who = "this client"
    if kafka.sasl_username:
        who = f"KAFKA_SASL_USERNAME (kafka.sasl_username)={kafka.sasl_username!r}"
    elif kafka.ssl_cert_location:
        who = f"the certificate of KAFKA_SSL_CERT_LOCATION ({kafka.ssl_cert_location})"
    return (
        f"Kafka refuses {who} reading {topic} (TopicAuthorizationFailed: no ACL allows it); "
        "a principal that may: `python -m streams acls --component consumer --principal ...`"
    )


class BrokerWatch:
    """The consumer's `error_cb`: librdkafka's client-wide errors (served inside `consume`,
    `poll`), of which the commands need two: every broker down, and a fatal error."""

    def __init__(self) -> None:
        self.all_down = False
        """Set when librdkafka finds every broker down; cleared by `answered`."""
        self.said_down = False
        """The command said so (once per outage); cleared by `answered`."""
        self.fatal: KafkaError | None = None

    def __call__(self, error: KafkaError) -> None:
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            self.all_down = True
        elif error.fatal():
            self.fatal = error

    def answered(self) -> None:
        """A broker answered (a record or a partition's end came)."""
        self.all_down = self.said_down = False


def silent_log() -> logging.Logger:
    """A logger for the commands' clients that drops every librdkafka line: not registered
    in the logging tree (no parent, no handler, a level above CRITICAL), so silencing it
    touches neither the engine's logger (streams.engine.librdkafka) nor any other of the
    process (a command called in-process, as the tests do, left it at CRITICAL before)."""
    return logging.Logger(f"{LIBRDKAFKA_LOGGER}.commands", logging.CRITICAL + 1)


def reader_config(kafka: KafkaSettings, client_id: str, watch: BrokerWatch) -> dict[str, Any]:
    """librdkafka properties of a command's consumer (module docstring). Its fetches are
    bounded as the stages' are, by the largest record a topic of the stream holds (a dead
    letter), which a fetch always brings whole."""
    return {
        **kafka.librdkafka_config(),
        **fetch_bounds(DEAD_LETTER_MAX_MESSAGE_BYTES),
        "client.id": client_id,
        "group.id": READER_GROUP,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",  # exactly_once writes the topics in transactions
        "enable.partition.eof": True,
        "error_cb": watch,
        "logger": silent_log(),  # never raw on stderr; the command says what went wrong
    }


def close_within(consumer: Consumer, timeout_s: float = CLOSE_WITHIN_S) -> bool:
    """Close `consumer`, waiting at most `timeout_s`; False (said on stderr) when the close
    had not returned by then.

    The commands' consumers commit nothing and join no group, so a close that does not
    return loses nothing: the command stops without it rather than hang after Ctrl-C (closes
    that never return are known in librdkafka, e.g. librdkafka#4884). The close goes on in a
    daemon thread, which the process's exit ends; what it raises is dropped (the command is
    stopping)."""

    def close() -> None:
        with contextlib.suppress(Exception):  # e.g. already closed: nothing left to do
            consumer.close()

    closing = threading.Thread(target=close, name="consumer-close", daemon=True)
    closing.start()
    closing.join(timeout_s)
    if closing.is_alive():
        print(
            f"# the consumer did not close within {timeout_s:g} s: stopping without it "
            "(it commits nothing)",
            file=sys.stderr,
            flush=True,
        )
        return False
    return True


def partitions_of(
    consumer: Consumer, kafka: KafkaSettings, topic: str, watch: BrokerWatch, timeout_s: float
) -> list[int]:
    """The partitions of `topic` (none when it does not exist: a consumer's metadata request
    never creates it). NoBroker when no broker answers within `timeout_s` (at once when
    librdkafka finds them all down); TopicRefused when Kafka refuses the principal the topic.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            metadata = consumer.list_topics(topic, timeout=min(START_POLL_S, timeout_s))
            break
        except KafkaException as exc:
            consumer.poll(0)  # serves the error callback: every broker down?
            if watch.all_down or time.monotonic() >= deadline:
                raise NoBroker(kafka.bootstrap_servers) from exc
    found = metadata.topics.get(topic)
    if found is None:
        return []
    if found.error is not None:
        if found.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            raise TopicRefused(refused_read(kafka, topic))
        return []  # UNKNOWN_TOPIC_OR_PART: not there (yet)
    return sorted(found.partitions)


def watermarks(consumer: Consumer, topic: str, partitions: list[int]) -> dict[int, tuple[int, int]]:
    """Per partition (its first offset, its last stable offset): the consumer's isolation is
    read_committed, in which librdkafka's ListOffsets answers the LSO as the high watermark."""
    found: dict[int, tuple[int, int]] = {}
    for partition in partitions:
        low, high = consumer.get_watermark_offsets(
            RdTopicPartition(topic, partition), timeout=CALL_TIMEOUT_S, cached=False
        )
        found[partition] = (int(low), int(high))
    return found


@dataclass(frozen=True, slots=True)
class ReadRecord:
    """A record as the commands print or republish it: confluent_kafka.Message's fields, read
    once. `unreadable` says why its headers are not there: a header name that is not UTF-8
    (Kafka allows any bytes there; confluent-kafka cannot read it), in
    streams.engine.librdkafka.consumer.headers_unreadable's words."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    """Milliseconds since the epoch."""
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    unreadable: str | None = None


def read_record(message: Message) -> ReadRecord:
    """`message`'s fields; its headers, or why they cannot be read."""
    unreadable = None
    headers: list[tuple[str, bytes | None]]
    try:
        # A consumer's headers: a list of (name, bytes or None), never the dict a producer takes.
        headers = cast(list[tuple[str, bytes | None]], message.headers() or [])
    except Exception as exc:  # SystemError: a header name that is not UTF-8
        headers, unreadable = [], headers_unreadable(message, exc)
    return ReadRecord(
        topic=message.topic() or "",
        partition=message.partition() or 0,
        offset=message.offset() or 0,
        timestamp=message.timestamp()[1],
        key=message.key(),
        value=message.value(),
        headers=headers,
        unreadable=unreadable,
    )
