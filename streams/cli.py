"""Command line: `python -m streams <command>`.

    normalize      one delivery in, canonical events out (no Kafka)
    create-topics  create every topic the stream uses
    tail           print the canonical events of an instance's output topic, one JSON line each
    dead-letters   print what the stream could not process, one line each with the reason
    status         the stage groups' members, owners and lag; restore; events/s per instance
    topics         the topics the stream uses: the plan beside Kafka's, and their differences
    schema         the canonical event's JSON Schema (schemas/file-event/)
    asyncapi       an AsyncAPI 3.0 document of every topic (schemas/asyncapi.json)
    replay-dead-letters  republish dead letters to their raw topic after a fix
    acls           the Kafka ACLs a component needs (kafka-acls.sh lines or a Strimzi KafkaUser)
    remove-member  remove a worker's static member from its consumer groups (a scale-in)

The worker itself is `faust -A streams worker`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streams.config import ConfigError, load_settings
from streams.core.delivery import Delivery
from streams.core.normalizers import MalformedDelivery, normalize
from streams.core.records import json_line
from streams.core.rules import Filtered, apply_rules
from streams.kafka_settings import KafkaAccessError, KafkaSettings
from streams.policies import instance_rules

if TYPE_CHECKING:
    from streams.reader import BrokerWatch

FILTER_REASONS = {
    "source": "the instance does not list this provider in its `sources`",
    "instance": "a reconcile delivery found by another instance's run",
    "bucket": "the instance takes another bucket",
    "prefix": "the key is not under the instance's prefix",
    "prefix-escape": (
        "the key climbs out of the instance's prefix (dot segments, or a root of its own"
        " after it: `/`, `\\`, a drive)"
    ),
}
TAIL_HEADER_PREFIXES = ("ce_", "content-type", "stale.", "error")
"""Headers `tail --headers` shows: CloudEvents (with their `content-type`), a stale record's
reason, a dead letter's error."""


class UsageError(Exception):
    """A mistake on the command line; printed as one line, exit 2."""


def _pairs(values: list[str], what: str, lower: bool) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in values:
        name, separator, value = item.partition("=")
        if not separator or not name:
            raise UsageError(f"--{what} takes NAME=VALUE, got {item!r}")
        pairs[name.lower() if lower else name] = value
    return pairs


def _read_body(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None


def filtered_reason(reason: str) -> str:
    """A `Filtered.reason` in words, for the normalize command's stderr."""
    if reason.startswith("plugin:"):
        return f"the key is inside an internal prefix of the {reason[7:]} plugin"
    return FILTER_REASONS.get(reason, reason)


def command_normalize(args: argparse.Namespace) -> int:
    """Print each event as the output topic carries it (without `raw` unless --raw); when
    nothing comes out, say why on stderr (exit 0: a delivery yielding nothing is no error)."""
    delivery = Delivery(
        source=args.source,
        body=_read_body(args.file),
        headers=_pairs(args.header, "header", lower=True),
        attributes=_pairs(args.attribute, "attribute", lower=False),
    )
    instance = None
    if args.instance is not None or args.config is not None:
        settings = load_settings(args.config)
        if args.instance is not None:
            instance = settings.instance(args.instance)
    events = normalize(delivery)
    if not events:
        print(
            f"no events: the {args.source} normalizer yields none for this delivery, a kind "
            f"it drops on purpose (e.g. s3:TestEvent, metadata-only changes; see "
            f"streams/core/normalizers/{args.source}.py)",
            file=sys.stderr,
        )
    for event in events:
        if instance is not None:
            kept = apply_rules(event, instance_rules(instance))
            if isinstance(kept, Filtered):
                print(
                    f"filtered by instance {instance.name} ({kept.reason}): "
                    f"{filtered_reason(kept.reason)}: {event.key!r} (id {event.id})",
                    file=sys.stderr,
                )
                continue
            event = kept
        line: dict[str, Any] = event.summary()
        if args.raw:
            line["raw"] = event.model_dump(mode="json")["raw"]
        print(json_line(line))
    return 0


def command_topics(args: argparse.Namespace) -> int:
    """One JSON line per planned topic, with `live` (as Kafka has it, null when missing) and
    its `differences`; `--plan`, or a Kafka that cannot be read (one stderr line), the plan
    alone."""
    from streams.engine.live_topics import differences, read_live
    from streams.engine.topics import topology

    settings = load_settings(args.config)
    specs = topology(settings)
    live = None
    if not args.plan:
        try:
            live = asyncio.run(asyncio.wait_for(read_live(settings.kafka, specs), 20))
        except Exception as exc:  # an absent broker: the plan is still worth printing
            print(
                f"# the live topics could not be read from {settings.kafka.bootstrap_servers} "
                f"({type(exc).__name__}: {exc}): the plan only",
                file=sys.stderr,
            )
    differing = 0
    for spec in specs:
        line: dict[str, Any] = {
            "name": spec.name,
            "role": spec.role,
            "partitions": spec.partitions,
            "replication_factor": spec.replication_factor,
            "config": spec.config,
        }
        if live is not None:
            found = live.get(spec.name)
            line["live"] = None if found is None else found.as_json()
            line["differences"] = differences(spec, found)
            differing += bool(line["differences"])
        print(json_line(line))
    if live is not None:
        print(
            f"# {len(specs)} planned topic(s) on {settings.kafka.bootstrap_servers}: "
            f"{len(specs) - differing} as planned, {differing} differ (see `differences`)",
            file=sys.stderr,
        )
    return 0


def command_create_topics(args: argparse.Namespace) -> int:
    from streams.engine.topics import ensure_topics, names_line, topology

    settings = load_settings(args.config)
    specs = topology(settings)
    created = asyncio.run(ensure_topics(settings.kafka, specs, retry_for_s=args.wait))
    print(
        f"created {len(created):,} topic(s)"
        + (f": {names_line(created)}" if created else "")
        + f"; {len(specs) - len(created):,} existed already"
    )
    return 0


def shown_headers(headers: Iterable[tuple[str, bytes | None]]) -> dict[str, str | None]:
    """The headers `tail --headers` prints (TAIL_HEADER_PREFIXES), values as text (a null
    header value as null)."""
    return {
        name: None if value is None else value.decode("utf-8", errors="replace")
        for name, value in headers
        if name.startswith(TAIL_HEADER_PREFIXES)
    }


def shown_value(value: bytes | None) -> Any:
    """A record's value as `tail` shows it: parsed JSON, else text."""
    try:
        return json.loads(value or b"")
    except ValueError:
        return (value or b"").decode("utf-8", errors="replace")


def tail_line(record: Any, headers: bool) -> str:
    """What `tail` prints of a record (streams.reader.ReadRecord): its JSON value on one line
    (as text when it is not JSON); with `headers`, `{"headers": ..., "event": ...}` (headers
    null when they cannot be read: `tail` says why on stderr)."""
    shown = shown_value(record.value)
    if headers:
        readable = getattr(record, "unreadable", None) is None
        shown = {"headers": shown_headers(record.headers) if readable else None, "event": shown}
    return shown if isinstance(shown, str) else json_line(shown)


def where_the_stack_is(bootstrap: str) -> str:
    """What to add to a line saying that nothing answers at `bootstrap`: where the running
    `make run` stack is, or that none runs (streams.localstack)."""
    from streams import localstack

    stack = localstack.running()
    if stack is None:
        return "; start `make run` (or `make kafka`) first"
    if stack.bootstrap != bootstrap:
        return f"; {stack.describe()}: a make command with no variable set follows it"
    return ""


DEAD_LETTER_PREVIEW_BYTES = 80


def dead_letter_line(record: Any) -> str:
    """One line per dead letter (streams.reader.ReadRecord): when, which stage refused it,
    where it came from, why, and the start of its bytes (escaped: a dead letter is hostile
    input). A record whose headers cannot be read says so in place of the reason."""
    from streams.logs import printable

    found = {
        name: (value or b"").decode("utf-8", errors="replace") for name, value in record.headers
    }
    unreadable = getattr(record, "unreadable", None)
    reason = unreadable if unreadable is not None else found.get("error", "(no reason)")
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.timestamp / 1000))
    value = record.value or b""
    body = repr(value[:DEAD_LETTER_PREVIEW_BYTES])[1:] + (
        "..." if len(value) > DEAD_LETTER_PREVIEW_BYTES else ""
    )
    origin = ", ".join(
        f"{name} {printable(found[name])}" for name in ("source", "transport") if name in found
    )
    return (
        f"{when} {record.topic}[{record.partition}]@{record.offset} "
        f"{printable(found.get('error.stage', '?'))}"
        f"{f' ({origin})' if origin else ''}: {printable(reason)}"
        f" | {len(value)} bytes: {body}"
    )


TAIL_BATCH = 500
"""Records one `consume` hands over at most, of those fetched already (it does not wait)."""
TAIL_WAIT_S = 0.5
"""How long the tail waits for a record at a time when none is fetched: the bound on how late
Ctrl-C, `--timeout` and a topic created meanwhile are noticed."""
TOPIC_REFRESH_S = 5.0
"""How often the tail looks for its topic while it does not exist, and for new partitions."""


@dataclass(slots=True)
class _Tailing:
    """What one tail assigned, and what it still has to print of before it started."""

    topic: str
    assigned: set[int] = field(default_factory=set)
    earlier: dict[int, int] = field(default_factory=dict)
    """Partition -> its end when the tail started, until the tail reached it."""
    errors: set[str] = field(default_factory=set)
    """Partition errors said once (on stderr) already."""


def _tail(
    kafka: KafkaSettings | str,
    topic: str,
    from_beginning: bool,
    count: int | None,
    timeout_s: float | None,
    headers: bool = False,
    line: Callable[[Any], str] | None = None,
    what: str = "event(s)",
) -> int:
    """Print `topic`'s records as they come (`line`, else `tail_line`) until `count` of them
    or `timeout_s`; 0 when `count` was reached (or none was asked), else 1. Blocking, each
    call bounded (streams.reader), so that Ctrl-C (KeyboardInterrupt) stops it at once."""
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaException

    from streams.kafka_settings import require_access
    from streams.reader import (
        CALL_TIMEOUT_S,
        BrokerWatch,
        NoBroker,
        TopicRefused,
        close_within,
        partitions_of,
        read_record,
        reader_config,
        watermarks,
    )

    kafka = KafkaSettings.of(kafka)
    asyncio.run(require_access(kafka))  # a refused password or certificate: one line, exit 2
    watch = BrokerWatch()
    consumer = Consumer(reader_config(kafka, "storage-events-tail", watch))
    tailing = _Tailing(topic)
    try:
        try:
            partitions = partitions_of(consumer, kafka, topic, watch, CALL_TIMEOUT_S)
        except NoBroker:
            raise UsageError(
                f"no Kafka answers at {kafka.bootstrap_servers} (KAFKA_BOOTSTRAP_SERVERS)"
                f"{where_the_stack_is(kafka.bootstrap_servers)}"
            ) from None
        except TopicRefused as exc:
            raise KafkaAccessError(str(exc)) from None
        if not partitions:
            print(f"# {topic} does not exist yet: waiting for it", file=sys.stderr, flush=True)
        if from_beginning and partitions:
            # What was there before this tail started, so that old and new events can be
            # told apart: once those are printed, one line on stderr says how many they were.
            tailing.earlier = {
                partition: end
                for partition, (low, end) in watermarks(consumer, topic, partitions).items()
                if end > low
            }
        _assign(consumer, tailing, partitions, OFFSET_BEGINNING if from_beginning else OFFSET_END)
        marker_due = from_beginning and bool(partitions)
        printed = 0
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        refresh_at = time.monotonic() + TOPIC_REFRESH_S
        while count is None or printed < count:
            wait_s = TAIL_WAIT_S
            if deadline is not None:
                wait_s = min(wait_s, deadline - time.monotonic())
                if wait_s <= 0:
                    break
            wanted = TAIL_BATCH if count is None else min(TAIL_BATCH, count - printed)
            messages = consumer.consume(wanted, 0) or [
                message for message in (consumer.poll(wait_s),) if message is not None
            ]
            for message in messages:
                if message.topic() is not None:
                    watch.answered()
                if message.error() is not None:
                    _tail_error(consumer, kafka, tailing, message)
                    continue
                if line is None and not headers:  # the value alone: no record read whole
                    shown = shown_value(message.value())
                    print(shown if isinstance(shown, str) else json_line(shown), flush=True)
                else:
                    record = read_record(message)
                    if headers and record.unreadable is not None:
                        print(f"# {record.unreadable}", file=sys.stderr, flush=True)
                    text = line(record) if line is not None else tail_line(record, headers)
                    print(text, flush=True)
                printed += 1
                if tailing.earlier:
                    _passed(tailing, message.partition() or 0, (message.offset() or 0) + 1)
                if count is not None and printed >= count:
                    break
            if marker_due and not tailing.earlier:
                print(
                    f"# {printed} earlier {what} above, from before this tail started; "
                    "new ones follow (--from-end: only new ones)",
                    file=sys.stderr,
                    flush=True,
                )
                marker_due = False
            _say_broker_news(watch, kafka)
            if time.monotonic() >= refresh_at:
                refresh_at = time.monotonic() + TOPIC_REFRESH_S
                _more_partitions(consumer, kafka, tailing, watch)
    except KafkaException as exc:  # e.g. the end offsets not answered in time: one line
        raise UsageError(f"Kafka at {kafka.bootstrap_servers}: {exc.args[0].str()}") from None
    finally:
        close_within(consumer)
    return 0 if count is None or printed >= count else 1


def _assign(consumer: Any, tailing: _Tailing, partitions: Iterable[int], offset: int) -> None:
    """Assign the partitions of `partitions` not assigned yet, each from `offset`."""
    from confluent_kafka import TopicPartition as RdTopicPartition

    new = sorted(set(partitions) - tailing.assigned)
    if new:
        consumer.incremental_assign([RdTopicPartition(tailing.topic, p, offset) for p in new])
        tailing.assigned.update(new)


def _passed(tailing: _Tailing, partition: int, position: int) -> None:
    """The tail's position on `partition` is `position`: past its start's end, or not yet."""
    end = tailing.earlier.get(partition)
    if end is not None and position >= end:
        del tailing.earlier[partition]


def _tail_error(consumer: Any, kafka: KafkaSettings, tailing: _Tailing, message: Any) -> None:
    """A partition's event among the records: its end reached, a record librdkafka cannot
    read (said on stderr, stepped past), a refusal (raised), or another error (said once)."""
    from confluent_kafka import KafkaError
    from confluent_kafka import TopicPartition as RdTopicPartition

    from streams.engine.librdkafka.consumer import UNREADABLE_ERRORS

    error = message.error()
    partition, offset = message.partition() or 0, message.offset()
    if message.topic() is None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
        return  # the coordinator lookup of a group only named (streams.reader.READER_GROUP)
    if error.code() == KafkaError._PARTITION_EOF:
        # The fetch position reached the last stable offset (the message's offset).
        _passed(tailing, partition, offset or 0)
        return
    if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        from streams.reader import refused_read

        raise KafkaAccessError(refused_read(kafka, tailing.topic))
    if error.fatal():
        raise UsageError(f"Kafka at {kafka.bootstrap_servers}: {error.str()}")
    if error.code() in UNREADABLE_ERRORS and message.topic() and offset is not None and offset >= 0:
        print(
            f"# the record at {message.topic()}[{partition}]@{offset} cannot be read "
            f"({error.str()}): skipped",
            file=sys.stderr,
            flush=True,
        )
        consumer.seek(RdTopicPartition(message.topic(), partition, offset + 1))
        _passed(tailing, partition, offset + 1)
        return
    said = f"{message.topic() or kafka.bootstrap_servers}: {error.str()}"
    if said not in tailing.errors:
        tailing.errors.add(said)
        print(f"# {said}", file=sys.stderr, flush=True)


def _say_broker_news(watch: BrokerWatch, kafka: KafkaSettings) -> None:
    """Once per outage: no broker answers now (the tail goes on waiting for them); a fatal
    error of the client stops the tail."""
    if watch.all_down and not watch.said_down:
        print(
            f"# no Kafka answers at {kafka.bootstrap_servers} now: waiting for it (Ctrl-C to stop)",
            file=sys.stderr,
            flush=True,
        )
        watch.said_down = True
    if watch.fatal is not None:
        raise UsageError(f"Kafka at {kafka.bootstrap_servers}: {watch.fatal.str()}")


def _more_partitions(
    consumer: Any, kafka: KafkaSettings, tailing: _Tailing, watch: BrokerWatch
) -> None:
    """Assign the topic's partitions that appeared since (the topic created after the tail
    started, or partitions added to it): from their beginning, as all they hold is new."""
    from confluent_kafka import OFFSET_BEGINNING

    from streams.reader import NoBroker, TopicRefused, partitions_of

    try:
        partitions = partitions_of(consumer, kafka, tailing.topic, watch, 1.0)
    except NoBroker:
        return  # said by _say_broker_news; looked for again at the next refresh
    except TopicRefused as exc:
        raise KafkaAccessError(str(exc)) from None
    _assign(consumer, tailing, partitions, OFFSET_BEGINNING)


def command_tail(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    topic = args.topic or settings.instance(args.instance).output_topic
    print(
        f"# tailing {topic} on {settings.kafka.bootstrap_servers} (Ctrl-C to stop)", file=sys.stderr
    )
    try:
        return _tail(
            settings.kafka, topic, not args.from_end, args.count, args.timeout, args.headers
        )
    except KeyboardInterrupt:
        return 0


def command_dead_letters(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    topic = settings.stream.dead_letter_topic
    print(
        f"# dead letters of {topic} on {settings.kafka.bootstrap_servers}, one line each: "
        "when, where, stage (source): reason | bytes (Ctrl-C to stop; replay them after a "
        "fix: python -m streams replay-dead-letters)",
        file=sys.stderr,
    )
    try:
        return _tail(
            settings.kafka,
            topic,
            not args.from_end,
            args.count,
            args.timeout,
            line=dead_letter_line,
            what="dead letter(s)",
        )
    except KeyboardInterrupt:
        return 0


def command_status(args: argparse.Namespace) -> int:
    from streams import status

    settings = load_settings(args.config)
    urls = args.worker or [f"http://127.0.0.1:{settings.stream.web_port}"]
    try:
        return asyncio.run(_status(status, settings, urls, args.watch, args.json))
    except KeyboardInterrupt:
        return 0


async def _status(
    status: Any, settings: Any, urls: list[str], watch: float | None, as_json: bool
) -> int:
    import concurrent.futures

    from confluent_kafka import KafkaException

    previous = None
    while True:
        try:
            previous = await status.snapshot(settings, urls, previous)
        except (KafkaException, concurrent.futures.TimeoutError, OSError) as exc:
            message = (
                f"cannot read the stream's state from Kafka at "
                f"{settings.kafka.bootstrap_servers} (KAFKA_BOOTSTRAP_SERVERS): {exc!r}"
                f"{where_the_stack_is(settings.kafka.bootstrap_servers)}"
            )
            if watch is None:
                print(f"error: {message}", file=sys.stderr)
                return 1
            print(message, file=sys.stderr, flush=True)
            await asyncio.sleep(watch)
            continue
        if as_json:
            print(json.dumps(previous.to_json()), flush=True)
        else:
            if watch is not None and sys.stdout.isatty():
                print("\x1b[H\x1b[2J", end="")  # one screen: clear it before each refresh
            print(status.render(previous), flush=True)
        if watch is None:
            return 0
        await asyncio.sleep(watch)


def _print_or_write(text: str, output: str | None) -> int:
    if output is None:
        sys.stdout.write(text)
        return 0
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror}") from None
    print(f"wrote {output}", file=sys.stderr)
    return 0


def command_schema(args: argparse.Namespace) -> int:
    from streams.core.schema import file_event_schema, schema_text

    return _print_or_write(schema_text(file_event_schema()), args.output)


def command_asyncapi(args: argparse.Namespace) -> int:
    from streams.asyncapi import asyncapi_document
    from streams.core.schema import schema_text

    settings = load_settings(None, environ={}) if args.defaults else load_settings(args.config)
    document = asyncapi_document(settings)
    return _print_or_write(schema_text(document), args.output)


def command_remove_member(args: argparse.Namespace) -> int:
    """Remove worker `--instance-id` (its STREAMS_GROUP_INSTANCE_ID) from the stage groups and
    Faust's group at once, so its partitions move now instead of after the session timeout
    (streams.engine.membership). Exit 0 if it was removed from at least one group, 1 if it was a
    member of none (a wrong name, or it had left already)."""
    import logging

    from aiokafka.errors import KafkaError

    from streams.engine.membership import remove_static_members, worker_members
    from streams.kafka_settings import require_access

    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    settings = load_settings(args.config)
    members = worker_members(settings.stream.app_id, args.instance_id)

    async def remove() -> list[Any]:
        await require_access(settings.kafka)  # a refused password or certificate: exit 2
        return await remove_static_members(settings.kafka, members)

    try:
        removals = asyncio.run(remove())
    except (KafkaError, NotImplementedError, OSError) as exc:
        print(
            f"error: cannot remove the member through Kafka at "
            f"{settings.kafka.bootstrap_servers} (KAFKA_BOOTSTRAP_SERVERS): {exc!r}",
            file=sys.stderr,
        )
        return 1
    for removal in removals:
        print(f"{removal.group_id}: {removal.instance_id}: {removal.outcome}")
    return 0 if any(removal.removed for removal in removals) else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m streams", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    normalize_cmd = commands.add_parser("normalize", help="normalize one delivery (no Kafka)")
    normalize_cmd.add_argument("--source", required=True, help="normalizer name, e.g. s3")
    normalize_cmd.add_argument("--header", action="append", default=[], metavar="NAME=VALUE")
    normalize_cmd.add_argument("--attribute", action="append", default=[], metavar="NAME=VALUE")
    normalize_cmd.add_argument("--config", help="config file (default: $STREAMS_CONFIG)")
    normalize_cmd.add_argument(
        "--instance",
        help="apply this instance's rules (prefix, "
        "bucket, plugins); without it keys are as the provider names them",
    )
    normalize_cmd.add_argument("--raw", action="store_true", help="include the provider record")
    normalize_cmd.add_argument("file", nargs="?", default="-", help="the body; - for stdin")
    normalize_cmd.set_defaults(run=command_normalize)

    topics_cmd = commands.add_parser(
        "topics", help="the topics the stream uses: the plan, beside Kafka's, and how they differ"
    )
    topics_cmd.add_argument("--config")
    topics_cmd.add_argument(
        "--plan", action="store_true", help="the plan only: what the code expects (no Kafka)"
    )
    topics_cmd.set_defaults(run=command_topics)

    create_cmd = commands.add_parser("create-topics", help="create the stream's topics")
    create_cmd.add_argument("--config")
    create_cmd.add_argument(
        "--wait", type=float, default=60.0, help="seconds to wait for the broker (default 60)"
    )
    create_cmd.set_defaults(run=command_create_topics)

    tail_cmd = commands.add_parser("tail", help="print an instance's output events")
    tail_cmd.add_argument("--config")
    tail_cmd.add_argument("--instance", default="default")
    tail_cmd.add_argument("--topic", help="any topic instead of the instance's output")
    tail_cmd.add_argument("--from-end", action="store_true", help="only new events")
    tail_cmd.add_argument("--count", type=int, help="stop after this many events")
    tail_cmd.add_argument("--timeout", type=float, help="stop after this many seconds")
    tail_cmd.add_argument(
        "--headers",
        action="store_true",
        help='print {"headers": ce_*, stale.*, error*, "event": ...} per record',
    )
    tail_cmd.set_defaults(run=command_tail)

    dead_cmd = commands.add_parser(
        "dead-letters", help="print the dead letters, one line each with the reason"
    )
    dead_cmd.add_argument("--config")
    dead_cmd.add_argument("--from-end", action="store_true", help="only new dead letters")
    dead_cmd.add_argument("--count", type=int, help="stop after this many")
    dead_cmd.add_argument("--timeout", type=float, help="stop after this many seconds")
    dead_cmd.set_defaults(run=command_dead_letters)

    status_cmd = commands.add_parser(
        "status", help="stage groups, owners, lag, restore; events/s per instance"
    )
    status_cmd.add_argument("--config")
    status_cmd.add_argument(
        "--worker",
        action="append",
        default=[],
        metavar="URL",
        help="a worker's web address (repeat per worker; default http://127.0.0.1:<web_port>)",
    )
    status_cmd.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=2.0,
        metavar="S",
        help="refresh every S seconds (default 2) until Ctrl-C",
    )
    status_cmd.add_argument("--json", action="store_true", help="one JSON object per refresh")
    status_cmd.set_defaults(run=command_status)

    schema_cmd = commands.add_parser("schema", help="the canonical event's JSON Schema")
    schema_cmd.add_argument("--output", metavar="FILE", help="write it here, not to stdout")
    schema_cmd.set_defaults(run=command_schema)

    asyncapi_cmd = commands.add_parser(
        "asyncapi", help="an AsyncAPI 3.0 document of the stream's topics"
    )
    asyncapi_source = asyncapi_cmd.add_mutually_exclusive_group()
    asyncapi_source.add_argument("--config")
    asyncapi_source.add_argument(
        "--defaults",
        action="store_true",
        help="the default configuration, no file or environment (schemas/asyncapi.json)",
    )
    asyncapi_cmd.add_argument("--output", metavar="FILE", help="write it here, not to stdout")
    asyncapi_cmd.set_defaults(run=command_asyncapi)

    from streams import replay  # its Kafka clients load only when it runs

    replay_cmd = commands.add_parser(
        "replay-dead-letters", help="republish dead letters to their topic, after a fix"
    )
    replay.add_arguments(replay_cmd)
    replay_cmd.set_defaults(run=replay.command_replay_dead_letters)

    from streams import acls

    acls_cmd = commands.add_parser("acls", help="print the Kafka ACLs a component needs")
    acls.add_arguments(acls_cmd)
    acls_cmd.set_defaults(run=acls.command_acls)

    from streams import cronjobs

    cronjobs_cmd = commands.add_parser(
        "cronjobs", help="the reconcile CronJobs of the scheduled instances, as Kubernetes YAML"
    )
    cronjobs.add_arguments(cronjobs_cmd)
    cronjobs_cmd.set_defaults(run=cronjobs.command_cronjobs)

    remove_cmd = commands.add_parser(
        "remove-member",
        help="remove a worker's static member from its groups now (a scale-in, a dead worker)",
    )
    remove_cmd.add_argument("--config")
    remove_cmd.add_argument(
        "--instance-id",
        required=True,
        metavar="NAME",
        help="the worker's STREAMS_GROUP_INSTANCE_ID (its StatefulSet pod name)",
    )
    remove_cmd.set_defaults(run=command_remove_member)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
        return code
    except (MalformedDelivery, ConfigError, UsageError, KafkaAccessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
