"""Replay dead letters: `python -m streams replay-dead-letters`, after the fix is deployed.

    python -m streams replay-dead-letters [--from TOPIC] [--to TOPIC] [--dry-run]
                                          [--limit N] [--match-error SUBSTRING] [--config F]

A dead-letter record (`streams.core.records.dead_letter_record`) holds a delivery exactly as it
came, its original headers, and three headers the stream added: `error` (why), `error.stage`
(`normalize` or `emit`) and `error.topic` (the topic it was read from). Replaying one
republishes the original key, value and headers, without those three, to `--to`, or, when
`--to` is absent, to the record's own `error.topic`, but only where the stream itself could
have read it (`Targets`): the replaying operator may write topics the letter's writer may
not, so a letter's own headers never choose a topic on their own (issue 23):

* only letters of the stream's own dead-letter topic (`[stream] dead_letter_topic`, which
  only the worker writes: `streams acls`); from any other topic, `--to` names the target;
* `normalize` letters go back to their `error.topic` only if it is one of `[stream]
  raw_topics` and carries the letter's `source` (streams.config.RawTopicConfig);
* `emit` letters go back only to the repartition topic, with their instance re-checked: the
  `instance` header names a configured instance, the value is a keyed event of it, the record
  key is its repartition key, and the instance accepts the event's provider and bucket;
* anything else (another stage, an output or stale topic, another instance's events) is
  skipped: one stderr line per letter says which and why, and the summary counts them.

* The dead-letter topic (`--from`, default `[stream] dead_letter_topic`) is read with
  `isolation.level=read_committed`, from the beginning of every partition to the end offsets
  it had when the command started: a record that fails again and is dead-lettered anew is
  not replayed twice in one run.
* `--match-error SUBSTRING` keeps only the records whose `error` header contains it (case
  sensitive), so one fixed bug's dead letters can be replayed without the others.
* `--limit N` stops after N records were selected (matching, with a destination).
* `--dry-run` prints one JSON line per selected record (`partition`, `offset`, `source`,
  `stage`, `error`, `destination`, `size` = value bytes) and publishes nothing.
* Otherwise the records are published with an idempotent producer (`acks=all`, the Java
  client's partitioner: a key goes to the partition the worker gives it), and the command
  returns only once Kafka acknowledged every one of them.
* A letter that cannot be read as it was written (a header name that is not UTF-8, which
  confluent-kafka cannot read; a record librdkafka cannot decode) is skipped, whatever the
  options: one stderr line names it, and the summary counts it.

A summary line goes to stderr. Exit 0 when every selected record was replayed (or, on a dry
run, could be); 1 when some records were skipped (no `error.topic` and no `--to`, a target
refused above, or not readable: they are counted and listed); 2 with one line for a mistake
(unknown topic, a topic the principal may not read, bad option); 130 when Ctrl-C stopped it
(the summary so far on stderr, after waiting a few seconds at most for what was sent).

Replaying is safe to repeat: the stream drops a change it already emitted by its event id
(within the instance's dedupe TTL), so a second run only costs duplicates on the raw topic.
The dead-letter topic itself is left as it is (it expires by retention, 30 days).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

from streams.config import ConfigError, Settings, load_settings
from streams.core.records import (
    KEYED_HEAD_HEADER,
    headers_dict,
    json_line,
    parse_keyed,
    partition_key,
)
from streams.core.rules import accepts_source
from streams.kafka_settings import KafkaSettings

ADDED_HEADERS = frozenset({"error", "error.stage", "error.topic"})
"""The headers `dead_letter_record` adds to a delivery; everything else is the original."""

READ_TIMEOUT_S = 60.0
FLUSH_ON_STOP_S = 10.0
"""How long a replay stopped by Ctrl-C waits for Kafka to acknowledge what it sent."""


class ReplayError(Exception):
    """The replay cannot run (unknown topic, broker unreachable); printed as one line."""


class Interrupted(ReplayError):
    """Ctrl-C stopped the replay; the message is the summary so far."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One record of the dead-letter topic, split into the original and what was added."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    """The original headers, in their order, without the ones the stream added."""
    error: str
    stage: str
    origin_topic: str | None

    @property
    def source(self) -> str | None:
        for name, value in self.headers:
            if name == "source":
                return value.decode("utf-8", errors="replace")
        return None

    @property
    def size(self) -> int:
        return len(self.value or b"")


@dataclass(slots=True)
class Summary:
    """What one run read, selected (matching, with a destination) and replayed."""

    read: int = 0
    selected: int = 0
    replayed: int = 0
    not_matching: int = 0
    no_destination: int = 0
    unreadable: int = 0
    """Letters whose record or headers could not be read (a header name not UTF-8)."""
    refused: dict[str, int] = field(default_factory=dict)
    """Why matching letters were not replayed to their own `error.topic` -> how many."""
    destinations: dict[str, int] = field(default_factory=dict)

    @property
    def skipped(self) -> int:
        return self.no_destination + self.unreadable + sum(self.refused.values())

    def line(self, source_topic: str, dry_run: bool) -> str:
        verb = "would replay" if dry_run else "replayed"
        count = self.selected if dry_run else self.replayed
        where = ", ".join(f"{topic}: {n}" for topic, n in sorted(self.destinations.items()))
        text = f"{verb} {count} of {self.read} dead letter(s) from {source_topic}"
        if where:
            text += f" ({where})"
        if self.not_matching:
            text += f"; {self.not_matching} not matching --match-error"
        if self.no_destination:
            text += f"; {self.no_destination} skipped: no error.topic header and no --to"
        if self.unreadable:
            text += f"; {self.unreadable} skipped: not readable (a header name not UTF-8)"
        for why, n in sorted(self.refused.items()):
            text += f"; {n} skipped: {why} (name a target with --to)"
        return text


def split_headers(
    headers: Iterable[tuple[str, bytes | None]],
) -> tuple[tuple[tuple[str, bytes], ...], dict[str, str]]:
    """(original headers in order, the added `error*` headers as text)."""
    original: list[tuple[str, bytes]] = []
    added: dict[str, str] = {}
    for name, value in headers:
        if name in ADDED_HEADERS:
            added[name] = (value or b"").decode("utf-8", errors="replace")
        else:
            original.append((name, value or b""))
    return tuple(original), added


def dead_letter(
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Iterable[tuple[str, bytes | None]],
) -> DeadLetter:
    original, added = split_headers(headers)
    if added.get("error.stage") == "emit":
        # A keyed record's `head` is what stage two decides on (streams.core.keyedhead); a
        # letter's head need not agree with its value. Without it, both the re-check
        # (`Targets._instance_refusal`) and stage two read the value itself, the bytes that are
        # republished (stage two reads a keyed record without a head from its JSON).
        original = tuple((name, data) for name, data in original if name != KEYED_HEAD_HEADER)
    return DeadLetter(
        partition=partition,
        offset=offset,
        key=key,
        value=value,
        headers=original,
        error=added.get("error", ""),
        stage=added.get("error.stage", ""),
        origin_topic=added.get("error.topic") or None,
    )


@dataclass(frozen=True, slots=True)
class Targets:
    """Where a dead letter may go back without `--to`: where the stream read it from, and
    only where it could have (module docstring)."""

    settings: Settings
    from_topic: str

    def refusal(self, letter: DeadLetter) -> tuple[str, str] | None:
        """(the kind of refusal, as the summary counts it; the details), or None."""
        stream = self.settings.stream
        origin = letter.origin_topic or ""
        if self.from_topic != stream.dead_letter_topic:
            return (
                f"not from the stream's dead-letter topic {stream.dead_letter_topic}",
                f"read from {self.from_topic}, whose writers may not be the worker",
            )
        if letter.stage == "normalize":
            raw = stream.raw_topic(origin)
            if raw is None:
                return "error.topic is not a raw topic", f"error.topic {origin[:256]!r}"
            source = letter.source or raw.default_source or ""
            if not raw.carries(source):
                return (
                    "source not carried by its raw topic",
                    f"{raw.name} does not carry source {source[:64]!r}",
                )
            return None
        if letter.stage == "emit":
            if origin != stream.repartition_topic:
                return "error.topic is not the repartition topic", f"error.topic {origin[:256]!r}"
            return self._instance_refusal(letter)
        return "unknown error.stage", f"error.stage {letter.stage[:64]!r}"

    def _instance_refusal(self, letter: DeadLetter) -> tuple[str, str] | None:
        """The emit letter's instance, re-checked against its own record and the config."""
        kind = "instance does not match"
        try:
            event = parse_keyed(letter.value or b"", headers_dict(letter.headers))
        except ValueError as exc:
            return "not a keyed event", str(exc)[:256]
        names = {instance.name: instance for instance in self.settings.instances}
        instance = names.get(event.instance)
        if instance is None:
            return kind, f"instance {event.instance[:200]!r} is not configured"
        if letter.key != partition_key(event.instance, event.bucket, event.key):
            return kind, f"the record key is not instance {instance.name}'s key of its event"
        if not accepts_source(instance, event.provider):
            return kind, f"instance {instance.name} does not accept {event.provider[:64]!r}"
        if instance.bucket is not None and event.bucket not in (None, instance.bucket):
            return kind, f"instance {instance.name} does not take bucket {event.bucket[:255]!r}"
        return None


def replay_dead_letters(
    kafka: KafkaSettings | str,
    from_topic: str,
    to_topic: str | None = None,
    *,
    settings: Settings | None = None,
    dry_run: bool = False,
    limit: int | None = None,
    match_error: str | None = None,
    out: TextIO | None = None,
    read_timeout_s: float = READ_TIMEOUT_S,
) -> Summary:
    """Read `from_topic` to its current end and republish (or, dry, print) what is selected.

    Raises ReplayError when the topic does not exist, the broker cannot be reached or refuses
    the credentials (naming the setting) or the topic, or Kafka did not acknowledge a
    republished record (the summary so far is in the message). `settings` (default: the
    defaults) says which targets a letter may name without `to_topic` (`Targets`). Blocking,
    each call bounded, so that Ctrl-C (KeyboardInterrupt) stops it; what was handed to the
    producer by then is flushed first (for a few seconds at most).
    """
    from confluent_kafka import Consumer, KafkaException, Producer

    from streams.kafka_settings import check_access
    from streams.reader import (
        CALL_TIMEOUT_S,
        BrokerWatch,
        NoBroker,
        TopicRefused,
        close_within,
        partitions_of,
        reader_config,
        refused_read,
    )

    kafka = KafkaSettings.of(kafka)
    bootstrap_servers = kafka.bootstrap_servers
    problem = asyncio.run(check_access(kafka))
    if problem is not None:
        raise ReplayError(problem[0])
    targets = Targets(settings if settings is not None else Settings(), from_topic)
    selection = Selection(to_topic, limit, match_error, targets)
    watch = BrokerWatch()
    consumer = Consumer(reader_config(kafka, "storage-events-replay", watch))
    republisher: _Republisher | None = None
    try:
        try:
            partitions = partitions_of(consumer, kafka, from_topic, watch, CALL_TIMEOUT_S)
        except NoBroker:
            raise ReplayError(f"{from_topic}: no Kafka answers at {bootstrap_servers}") from None
        except TopicRefused:
            raise ReplayError(refused_read(kafka, from_topic)) from None
        if not partitions:
            raise ReplayError(f"topic {from_topic!r} does not exist at {bootstrap_servers}")
        if not dry_run:
            republisher = _Republisher(Producer(producer_config(kafka, watch)), selection)
        _copy(
            consumer,
            republisher,
            from_topic,
            partitions,
            selection,
            sys.stdout if out is None else out,
            read_timeout_s,
        )
    except TopicRefused:  # the metadata allowed describing it, the fetch refused reading it
        raise ReplayError(refused_read(kafka, from_topic)) from None
    except KafkaException as exc:
        summary = selection.summary
        done = f" (so far: {summary.line(from_topic, dry_run)})" if summary.read else ""
        raise ReplayError(f"{from_topic} at {bootstrap_servers}: {exc!r}{done}") from exc
    except KeyboardInterrupt:
        if republisher is not None:
            republisher.stop(FLUSH_ON_STOP_S)
        raise Interrupted(selection.summary.line(from_topic, dry_run)) from None
    finally:
        close_within(consumer)
    return selection.summary


def producer_config(kafka: KafkaSettings, watch: Any) -> dict[str, Any]:
    """librdkafka properties of the replay's producer: idempotent, `acks=all`, records up to
    the raw topic's limit, and the Java client's partitioner, as the worker's producers
    (streams.engine.librdkafka.producer): a republished keyed record goes to the partition
    the worker's own would (streams.core.partitioning)."""
    from streams.engine.topics import RAW_MAX_MESSAGE_BYTES
    from streams.reader import silent_log

    return {
        **kafka.librdkafka_config(),
        "client.id": "storage-events-replay",
        "acks": "all",
        "enable.idempotence": True,
        "message.max.bytes": RAW_MAX_MESSAGE_BYTES,
        "linger.ms": 5,
        "partitioner": "murmur2_random",
        "error_cb": watch,
        "logger": silent_log(),  # never raw on stderr; the command says what went wrong
    }


@dataclass(slots=True)
class Selection:
    """Which dead letters to replay, where to, and what was seen."""

    to_topic: str | None
    limit: int | None
    match_error: str | None
    targets: Targets
    summary: Summary = field(default_factory=Summary)

    def full(self) -> bool:
        return self.limit is not None and self.summary.selected >= self.limit

    def matches(self, letter: DeadLetter) -> bool:
        return self.match_error is None or self.match_error in letter.error

    def destination(
        self, letter: DeadLetter, unreadable: str | None = None
    ) -> tuple[str | None, str | None]:
        """(where `letter` goes, or None when it is not selected; why a matching letter is
        skipped), counted here. A letter whose record or headers could not be read
        (`unreadable`, why) is skipped whatever the options: its `error*` headers cannot be
        matched, nor its original headers republished as they were."""
        self.summary.read += 1
        if unreadable is not None:
            self.summary.unreadable += 1
            return None, f"{unreadable}; not replayed: it cannot be republished as it was"
        if not self.matches(letter):
            self.summary.not_matching += 1
            return None, None
        destination = self.to_topic or letter.origin_topic
        if destination is None:
            self.summary.no_destination += 1
            return None, "no error.topic header; name a topic with --to"
        if self.to_topic is None:
            refused = self.targets.refusal(letter)
            if refused is not None:
                kind, details = refused
                self.summary.refused[kind] = self.summary.refused.get(kind, 0) + 1
                target = destination[:256]
                return None, f"{kind}: {details}; not replayed to {target!r} without --to"
        self.summary.selected += 1
        self.summary.destinations[destination] = self.summary.destinations.get(destination, 0) + 1
        return destination, None


class _Republisher:
    """The replay's producer: each consumed batch's selected letters sent, then awaited
    (`settle`): a batch counts as replayed once Kafka acknowledged every record of it."""

    def __init__(self, producer: Any, selection: Selection) -> None:
        self.producer = producer
        self.selection = selection
        self._sent = 0
        self._failed: list[Any] = []

    def _delivered(self, error: Any, _message: Any) -> None:
        if error is not None:
            self._failed.append(error)

    def send(self, destination: str, letter: DeadLetter) -> None:
        while True:
            try:
                self.producer.produce(
                    destination,
                    letter.value,
                    letter.key,
                    headers=list(letter.headers),
                    on_delivery=self._delivered,
                )
                break
            except BufferError:  # its queue is full: let deliveries drain it
                self.producer.poll(0.1)
        self._sent += 1
        self.producer.poll(0)

    def settle(self) -> None:
        """Wait until Kafka acknowledged every record sent (or librdkafka gave one up after
        its message.timeout.ms); raise the first refusal, after counting what was delivered."""
        from confluent_kafka import KafkaException

        while self.producer.flush(1.0) > 0:
            pass
        sent, failed = self._sent, self._failed
        self._sent, self._failed = 0, []
        self.selection.summary.replayed += sent - len(failed)
        if failed:
            raise KafkaException(failed[0])

    def stop(self, timeout_s: float) -> None:
        """Stopped midway (Ctrl-C): wait up to `timeout_s` for what was sent, count what
        Kafka acknowledged by then."""
        self.producer.flush(timeout_s)
        self.selection.summary.replayed += self._sent - len(self._failed) - len(self.producer)
        self._sent, self._failed = 0, []


def _copy(
    consumer: Any,
    republisher: _Republisher | None,
    from_topic: str,
    partitions: list[int],
    selection: Selection,
    out: TextIO,
    read_timeout_s: float,
) -> None:
    """Read every partition of `from_topic` up to its end offsets at start; replay or print."""
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException
    from confluent_kafka import TopicPartition as RdTopicPartition

    from streams.engine.librdkafka.consumer import UNREADABLE_ERRORS
    from streams.reader import TopicRefused, read_record, watermarks

    ends = watermarks(consumer, from_topic, partitions)
    # A partition whose end is its beginning holds nothing to read (empty, or expired).
    remaining = {partition: end for partition, (low, end) in ends.items() if end > low}
    consumer.assign([RdTopicPartition(from_topic, p, OFFSET_BEGINNING) for p in remaining])
    deadline = time.monotonic() + read_timeout_s
    while remaining and not selection.full():
        if time.monotonic() > deadline:
            raise ReplayError(
                f"reading {from_topic} did not reach its end offsets in {read_timeout_s:.0f} s"
            )
        # In partition order within a batch, each partition's records in offset order.
        messages = sorted(consumer.consume(500, 0.5), key=lambda message: message.partition())
        if messages:
            deadline = time.monotonic() + read_timeout_s  # progress: wait afresh
        for message in messages:
            partition, offset = message.partition() or 0, message.offset() or 0
            error = message.error()
            unreadable: str | None
            if error is not None and message.topic() is None:
                if error.fatal():
                    raise KafkaException(error)
                continue  # the client's news: the named group's coordinator lookup refused
            if partition not in remaining:
                continue  # read to its end already
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    # The fetch position reached the last stable offset (the message's offset).
                    if offset >= remaining[partition]:
                        del remaining[partition]
                    continue
                if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    raise TopicRefused(from_topic)
                if error.code() not in UNREADABLE_ERRORS or offset < 0:
                    raise KafkaException(error)
                # A record librdkafka cannot read (streams.engine.librdkafka.consumer): skipped
                # as one whose headers cannot be read, and stepped past.
                consumer.seek(RdTopicPartition(from_topic, partition, offset + 1))
                unreadable = f"the record cannot be read: {error.str()}"
                letter = DeadLetter(partition, offset, None, None, (), "", "", None)
            else:
                if offset >= remaining[partition]:
                    del remaining[partition]  # written after the command started
                    continue
                record = read_record(message)
                unreadable = record.unreadable
                letter = dead_letter(partition, offset, record.key, record.value, record.headers)
            if selection.full():
                break
            destination, skipped = selection.destination(letter, unreadable)
            if destination is None:
                if skipped is not None:
                    print(
                        f"skipped {from_topic}[{letter.partition}]@{letter.offset}: {skipped}",
                        file=sys.stderr,
                    )
                continue
            if republisher is None:
                print(json_line(_describe(letter, destination)), file=out, flush=True)
            else:
                republisher.send(destination, letter)
        if republisher is not None:
            republisher.settle()  # raises if Kafka did not acknowledge


def _describe(letter: DeadLetter, destination: str) -> dict[str, Any]:
    return {
        "partition": letter.partition,
        "offset": letter.offset,
        "source": letter.source,
        "stage": letter.stage or None,
        "error": letter.error,
        "destination": destination,
        "size": letter.size,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `replay-dead-letters`."""
    parser.add_argument("--config", help="config file (default: $STREAMS_CONFIG)")
    parser.add_argument(
        "--from",
        dest="from_topic",
        metavar="TOPIC",
        help="the dead-letter topic (default: [stream] dead_letter_topic)",
    )
    parser.add_argument(
        "--to",
        dest="to_topic",
        metavar="TOPIC",
        help="where to republish (default: each record's error.topic header, when that is "
        "a raw topic of the stream or the repartition topic with its instance re-checked)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would be replayed, publish nothing"
    )
    parser.add_argument("--limit", type=_positive, metavar="N", help="replay at most N records")
    parser.add_argument(
        "--match-error",
        metavar="SUBSTRING",
        help="only records whose error header contains SUBSTRING",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=READ_TIMEOUT_S,
        help="seconds without progress before giving up reading (default 60)",
    )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def command_replay_dead_letters(args: argparse.Namespace) -> int:
    """`python -m streams replay-dead-letters`: see the module docstring."""
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from_topic = args.from_topic or settings.stream.dead_letter_topic
    try:
        summary = replay_dead_letters(
            settings.kafka,
            from_topic,
            args.to_topic,
            settings=settings,
            dry_run=args.dry_run,
            limit=args.limit,
            match_error=args.match_error,
            read_timeout_s=args.timeout,
        )
    except Interrupted as exc:
        print(f"interrupted: {exc}", file=sys.stderr)
        return 130
    except ReplayError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(summary.line(from_topic, args.dry_run), file=sys.stderr)
    return 1 if summary.skipped else 0
