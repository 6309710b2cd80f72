"""The Pub/Sub pull bridge: GCS notifications on a Pub/Sub subscription -> the raw topic.

    python -m connectors pubsub --subscription projects/P/subscriptions/S [--max-messages N]

Each message is published as it came: value = the message data bytes, headers `source=gcs`,
`transport=pubsub-pull`, `delivery-id` = the message id, and one `attribute.<name>` header
per Pub/Sub attribute (GCS puts `eventType`, `bucketId`, `objectId`, `objectGeneration`, ...
there).

The loop is the pull bridges' own (`connectors.pull.PullBridge`, shared with SQS and the
Azure Storage Queue), over Pub/Sub's unary Pull call: pull up to `--batch` messages (a
pull waits up to `--wait-time` for messages), publish each, then acknowledge exactly the
messages Kafka acknowledged, in one Acknowledge call. While a batch is publishing, its ack
deadlines are extended (ModifyAckDeadline by the subscription's ack deadline, every half of
it), so a slow or retrying write is not delivered twice. A message whose publish failed is
not acknowledged: Pub/Sub delivers it again once the subscription's ack deadline passes. A
message too large for the raw topic (Pub/Sub takes up to 10 MB, the raw topic 4 MiB) is
written whole to the dead-letter topic (`[stream] dead_letter_topic`, with `error` saying
why) and acknowledged once Kafka holds it. At most `--max-messages` are
between "pulled" and "acknowledged or left". Errors back off (0.5 s doubling to 30 s), and
so does the loop while Kafka refuses writes. A missing subscription, refused credentials or a
denied permission end the bridge with one line on stderr and exit status 2
(`connectors.pull.EXIT_FATAL`), at start or whenever a call reports it.

Credentials: Application Default Credentials (`GOOGLE_APPLICATION_CREDENTIALS`, workload
identity, ...); the identity needs `roles/pubsub.subscriber` on the subscription. With
`PUBSUB_EMULATOR_HOST` set, the library talks to that emulator without credentials.

SIGINT / SIGTERM: no new pull starts (one in progress ends within `--wait-time`, and what it
brings is handed back at once with a zero ack deadline); the messages in flight are
published and acknowledged (or left for redelivery); the bridge exits 0. Metrics:
`--metrics-port` serves the pull bridges' family
`bridge_pull_*{bridge="pubsub",queue=SUBSCRIPTION}` (`connectors.pull`).

Tests: `tests/bridges/test_pubsub.py` runs this command against the Google Cloud CLI's
`cloud-pubsub-emulator` where it is installed, else against Google's Go fake `pstest`
(`dev/pubsub-fake`, built by `make test-deps`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from connectors.command import BridgeCommand, add_publishing_arguments
from connectors.command import raw_topic as command_raw_topic
from connectors.publisher import RawPublisher
from connectors.pull import (
    EXIT_FATAL,
    FatalQueueError,
    PullBridge,
    Pulled,
    QueueError,
    serve,
)
from streams.config import RAW_RECORD_FRAMING_BYTES, ConfigError, Settings, check_topic_name
from streams.engine.topics import DEAD_LETTER_MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

BRIDGE = "pubsub"
SOURCE = "gcs"
TRANSPORT = "pubsub-pull"
SUBSCRIPTION = re.compile(r"^projects/[^/]+/subscriptions/[^/]+$")
MAX_BATCH = 1000  # the service's limit for one Pull
CALL_TIMEOUT_S = 30.0
MIN_EMPTY_PULL_S = 1.0
"""An empty pull answers no sooner than this."""
DEFAULT_ACK_DEADLINE_S = 10
"""A subscription's ack deadline when it does not say (the service's default and minimum)."""
MAX_ACK_DEADLINE_S = 600
GRPC_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
"""The library's own channel options for the service (messages up to Pub/Sub's 10 MB); its
emulator channel has none, so gRPC's 4 MiB receive limit would fail every pull of a large
message there."""


class StartupError(Exception):
    """The bridge cannot run as configured; the message is the one line the user sees."""


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def classify(exc: Exception, subscription: str) -> Exception:
    """A client failure as FatalQueueError (one line, exit 2) or QueueError (back off)."""
    import google.auth.exceptions
    from google.api_core import exceptions as api

    if isinstance(exc, api.NotFound):
        return FatalQueueError(f"subscription {subscription} does not exist ({_describe(exc)})")
    if isinstance(exc, api.PermissionDenied):
        return FatalQueueError(
            f"not allowed to pull from {subscription} ({_describe(exc)}); the identity needs "
            "roles/pubsub.subscriber on it"
        )
    if isinstance(exc, api.Unauthenticated | api.Unauthorized):
        return FatalQueueError(f"Pub/Sub refused the credentials ({_describe(exc)})")
    if isinstance(exc, google.auth.exceptions.DefaultCredentialsError):
        return FatalQueueError(
            f"no usable Google credentials ({_describe(exc)}); set "
            "GOOGLE_APPLICATION_CREDENTIALS or PUBSUB_EMULATOR_HOST"
        )
    if isinstance(exc, google.auth.exceptions.RefreshError):
        return FatalQueueError(f"the Google credentials do not work ({_describe(exc)})")
    if isinstance(exc, api.InvalidArgument):
        return FatalQueueError(f"{subscription} refused the request ({_describe(exc)})")
    return QueueError(_describe(exc))


class PubSubQueue:
    """One subscription as a `connectors.pull.PullQueue`, through the synchronous client
    (its calls run in a worker thread)."""

    def __init__(
        self,
        client: Any,
        subscription: str,
        batch: int,
        wait_time_s: float,
        publish_timeout_s: float | None = None,
    ) -> None:
        self.client = client
        self.name = subscription
        self.max_batch = batch
        self.wait_time_s = wait_time_s
        self.publish_timeout_s = publish_timeout_s
        self.lease_s: float = DEFAULT_ACK_DEADLINE_S
        """The subscription's ack deadline (read by `check`): what each extension grants."""

    async def _call(self, method: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(method, **kwargs)
        except Exception as exc:
            raise classify(exc, self.name) from exc

    async def check(self) -> None:
        """Fail fast on a missing subscription or refused credentials. An identity without
        `pubsub.subscriptions.get` may still pull: that case is left to the first pull."""
        from google.api_core import exceptions as api

        try:
            found = await asyncio.to_thread(
                self.client.get_subscription,
                request={"subscription": self.name},
                timeout=CALL_TIMEOUT_S,
            )
        except api.PermissionDenied:
            log.debug("cannot read %s's configuration; the first pull will tell", self.name)
            return
        except Exception as exc:
            raise classify(exc, self.name) from exc
        deadline = int(getattr(found, "ack_deadline_seconds", 0) or 0)
        if deadline > 0:
            self.lease_s = min(deadline, MAX_ACK_DEADLINE_S)

    async def receive(self, max_messages: int) -> list[Pulled]:
        from google.api_core import exceptions as api

        started = time.monotonic()
        try:
            response = await asyncio.to_thread(
                self.client.pull,
                request={
                    "subscription": self.name,
                    "max_messages": max(1, min(max_messages, self.max_batch)),
                },
                retry=None,
                timeout=self.wait_time_s,
            )
        except api.DeadlineExceeded:
            return []  # nothing arrived within the wait
        except Exception as exc:
            raise classify(exc, self.name) from exc
        if not response.received_messages:
            # The service may answer an empty pull at once: do not turn that into a busy loop.
            await asyncio.sleep(max(0.0, MIN_EMPTY_PULL_S - (time.monotonic() - started)))
            return []
        return [
            Pulled(
                body=bytes(received.message.data),
                delivery_id=received.message.message_id,
                attributes=dict(received.message.attributes),
                handle=received.ack_id,
            )
            for received in response.received_messages
        ]

    async def delete(self, messages: Sequence[Pulled]) -> list[Pulled]:
        for start in range(0, len(messages), MAX_BATCH):
            chunk = messages[start : start + MAX_BATCH]
            await self._call(
                self.client.acknowledge,
                request={"subscription": self.name, "ack_ids": [m.handle for m in chunk]},
                timeout=CALL_TIMEOUT_S,
            )
        return []

    async def extend(self, messages: Sequence[Pulled]) -> None:
        """Another ack deadline for messages whose publish is pending (ModifyAckDeadline)."""
        for start in range(0, len(messages), MAX_BATCH):
            chunk = messages[start : start + MAX_BATCH]
            await self._call(
                self.client.modify_ack_deadline,
                request={
                    "subscription": self.name,
                    "ack_ids": [message.handle for message in chunk],
                    "ack_deadline_seconds": int(self.lease_s),
                },
                timeout=CALL_TIMEOUT_S,
            )

    async def release(self, messages: Sequence[Pulled]) -> None:
        await self._call(
            self.client.modify_ack_deadline,
            request={
                "subscription": self.name,
                "ack_ids": [message.handle for message in messages],
                "ack_deadline_seconds": 0,
            },
            timeout=CALL_TIMEOUT_S,
        )


def subscriber_client() -> Any:
    """A SubscriberClient, or one line saying why the credentials are unusable."""
    import google.auth.exceptions
    from google.cloud import pubsub_v1

    try:
        emulator = os.environ.get("PUBSUB_EMULATOR_HOST")
        if emulator:
            import grpc
            from google.pubsub_v1.services.subscriber.transports.grpc import (
                SubscriberGrpcTransport,
            )

            channel = grpc.insecure_channel(emulator, options=GRPC_OPTIONS)
            return pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))
        return pubsub_v1.SubscriberClient()
    except google.auth.exceptions.DefaultCredentialsError as exc:
        raise StartupError(
            f"no usable Google credentials ({_describe(exc)}); set "
            "GOOGLE_APPLICATION_CREDENTIALS or PUBSUB_EMULATOR_HOST"
        ) from None


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--subscription", required=True, help="projects/PROJECT/subscriptions/SUBSCRIPTION"
    )
    parser.add_argument(
        "--max-messages",
        type=int,
        default=100,
        metavar="N",
        help="messages pulled and not yet acknowledged or left, at most (default 100)",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=100,
        metavar="N",
        help=f"messages per pull, 1-{MAX_BATCH} (default 100)",
    )
    parser.add_argument(
        "--wait-time",
        type=float,
        default=10.0,
        metavar="S",
        help="how long one pull waits for messages (default 10); also bounds the shutdown",
    )
    add_publishing_arguments(parser)


def _check_arguments(args: argparse.Namespace, settings: Settings) -> str:
    if not SUBSCRIPTION.match(args.subscription):
        raise StartupError(
            f"--subscription {args.subscription!r} is not projects/PROJECT/subscriptions/NAME"
        )
    if args.max_messages < 1 or args.publish_timeout <= 0 or args.wait_time <= 0:
        raise StartupError("--max-messages, --wait-time and --publish-timeout must be positive")
    if not 1 <= args.batch <= MAX_BATCH:
        raise StartupError(f"--batch must be between 1 and {MAX_BATCH}, not {args.batch}")
    topic = command_raw_topic(args, settings)
    try:
        check_topic_name(topic)
    except (ValueError, ConfigError) as exc:
        raise StartupError(f"--topic: {exc}") from None
    return topic


def _run(args: argparse.Namespace, settings: Settings) -> int:
    async def main(topic: str) -> int:
        subscriber = subscriber_client()
        try:
            queue = PubSubQueue(
                subscriber, args.subscription, args.batch, args.wait_time, args.publish_timeout
            )
            publisher = RawPublisher(settings.kafka, topic, args.publish_timeout)
            dead_letters = RawPublisher(
                settings.kafka,
                settings.stream.dead_letter_topic,
                args.publish_timeout,
                max_record_bytes=DEAD_LETTER_MAX_MESSAGE_BYTES - RAW_RECORD_FRAMING_BYTES,
            )
            bridge = PullBridge(
                queue,
                publisher,
                BRIDGE,
                SOURCE,
                TRANSPORT,
                max_in_flight=args.max_messages,
                dead_letters=dead_letters,
                raw_topic=topic,
            )
            return await serve(
                BRIDGE,
                bridge,
                publisher,
                metrics_port=args.metrics_port,
                metrics_host=args.metrics_host,
                dead_letter_publisher=dead_letters,
            )
        finally:
            await asyncio.to_thread(subscriber.close)

    try:
        return asyncio.run(main(_check_arguments(args, settings)))
    except StartupError as exc:
        print(f"connectors {BRIDGE}: {exc}", file=sys.stderr)
        return EXIT_FATAL


COMMAND = BridgeCommand("pull GCS notifications from a Pub/Sub subscription", _add_arguments, _run)
