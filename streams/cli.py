"""Command line: `python -m streams <command>`.

    normalize      one delivery in, canonical events out (no Kafka)
    create-topics  create every topic the stream uses
    tail           print the canonical events of an instance's output topic, one JSON line each
    topics         list the topics the stream uses with their settings
    replay-dead-letters  republish dead letters to their raw topic after a fix

The worker itself is `faust -A streams worker`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from streams.config import ConfigError, load_settings
from streams.delivery import Delivery
from streams.normalizers import MalformedDelivery, normalize
from streams.records import json_line
from streams.rules import Filtered, apply_instance

PRINTED_FIELDS = (
    "id",
    "type",
    "key",
    "bucket",
    "size",
    "etag",
    "version_id",
    "time",
    "sequencer",
    "provider",
)


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


def command_normalize(args: argparse.Namespace) -> int:
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
    for event in normalize(delivery):
        if instance is not None:
            kept = apply_instance(event, instance)
            if isinstance(kept, Filtered):
                continue
            event = kept
        data = event.model_dump(mode="json")
        line: dict[str, Any] = {name: data[name] for name in PRINTED_FIELDS}
        if args.raw:
            line["raw"] = data["raw"]
        print(json_line(line))
    return 0


def command_topics(args: argparse.Namespace) -> int:
    from streams.topics import topology

    for spec in topology(load_settings(args.config)):
        print(
            json_line(
                {
                    "name": spec.name,
                    "role": spec.role,
                    "partitions": spec.partitions,
                    "replication_factor": spec.replication_factor,
                    "config": spec.config,
                }
            )
        )
    return 0


def command_create_topics(args: argparse.Namespace) -> int:
    from streams.topics import ensure_topics, topology

    settings = load_settings(args.config)
    created = asyncio.run(
        ensure_topics(settings.kafka.bootstrap_servers, topology(settings), retry_for_s=args.wait)
    )
    print(f"created {len(created)} topic(s)" + (f": {', '.join(created)}" if created else ""))
    return 0


async def _tail(
    bootstrap: str, topic: str, from_beginning: bool, count: int | None, timeout_s: float | None
) -> int:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest" if from_beginning else "latest",
        isolation_level="read_committed",  # exactly_once writes outputs in transactions
    )
    await consumer.start()
    printed = 0
    try:
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while count is None or printed < count:
            wait_ms = 1000 if deadline is None else int(max(0.0, deadline - loop.time()) * 1000)
            if deadline is not None and wait_ms == 0:
                break
            batches = await consumer.getmany(timeout_ms=min(wait_ms, 1000))
            for messages in batches.values():
                for message in messages:
                    value = message.value or b""
                    try:
                        print(json_line(json.loads(value)), flush=True)
                    except ValueError:
                        print(value.decode("utf-8", errors="replace"), flush=True)
                    printed += 1
    finally:
        await consumer.stop()
    return 0 if count is None or printed >= count else 1


def command_tail(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    topic = args.topic or settings.instance(args.instance).output_topic
    print(
        f"# tailing {topic} on {settings.kafka.bootstrap_servers} (Ctrl-C to stop)", file=sys.stderr
    )
    try:
        return asyncio.run(
            _tail(
                settings.kafka.bootstrap_servers, topic, not args.from_end, args.count, args.timeout
            )
        )
    except KeyboardInterrupt:
        return 0


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

    topics_cmd = commands.add_parser("topics", help="list the topics the stream uses")
    topics_cmd.add_argument("--config")
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
    tail_cmd.set_defaults(run=command_tail)

    from streams import replay  # its Kafka clients load only when it runs

    replay_cmd = commands.add_parser(
        "replay-dead-letters", help="republish dead letters to their topic, after a fix"
    )
    replay.add_arguments(replay_cmd)
    replay_cmd.set_defaults(run=replay.command_replay_dead_letters)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
        return code
    except (MalformedDelivery, ConfigError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
