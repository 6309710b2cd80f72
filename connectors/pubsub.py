"""The Pub/Sub pull bridge: GCS notifications on a Pub/Sub subscription -> the raw topic.

    python -m connectors pubsub --subscription projects/P/subscriptions/S [--max-messages N]

Streaming pull with google-cloud-pubsub. Each message is published as it came: value = the
message data bytes, headers `source=gcs`, `transport=pubsub-pull`, `delivery-id` = the
message id, and one `attribute.<name>` header per Pub/Sub attribute (GCS puts `eventType`,
`bucketId`, `objectId`, `objectGeneration`, ... there).

Ack after Kafka: the subscriber runs `PubSubBridge.handle` in one of its callback threads.
`handle` hands the publish to the asyncio loop that owns the Kafka producer
(`asyncio.run_coroutine_threadsafe`) and waits, in the callback thread, for Kafka's
acknowledgement; only then does it `ack()` the message. If Kafka does not acknowledge (or
the wait times out, or the bridge is shutting down), it waits a backoff (0.5 s doubling to
30 s while failures go on, so a Kafka outage does not turn into a redelivery storm) and
`nack()`s the message, so Pub/Sub delivers it again. `handle` never raises: an exception
from a callback would stop the whole stream.

Bounded in-flight work: flow control (`--max-messages`, `--max-bytes`) caps the messages
leased and not yet acked or nacked; a pool of at most 32 callback threads publishes them.
Stream errors the library can retry (unavailable, deadline, ...) are retried by it with
backoff; a missing subscription, refused credentials or a denied permission end the bridge
with one line on stderr and exit status 2 (at start, or whenever the stream reports it).

Credentials: Application Default Credentials (`GOOGLE_APPLICATION_CREDENTIALS`, workload
identity, ...); the identity needs `roles/pubsub.subscriber` on the subscription. With
`PUBSUB_EMULATOR_HOST` set, the library talks to that emulator without credentials.

SIGINT / SIGTERM: the stream is closed first; then callbacks publishing finish (their
messages are acked or nacked), callbacks waiting out a backoff nack at once, messages not yet
handed to a callback are nacked by the library, and the bridge exits 0. A message the bridge
took before the stop is at worst redelivered after its ack deadline (a duplicate the stream
drops by id), never acked unpublished. Metrics: `--metrics-port` serves Prometheus metrics
`bridge_pubsub_*` (received, acked, nacked, in flight, publish seconds).

Tests: no package registry this project installs from carries a Pub/Sub emulator, so the
ack-after-publish logic is tested at its seam (`PubSubBridge.handle` with the library's own
`Message` type against the real broker); where Google's emulator is installed (the Google
Cloud CLI's `cloud-pubsub-emulator`), `tests/bridges/test_pubsub.py` also runs this command
against it end to end.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import logging
import random
import re
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from connectors.command import BridgeCommand, add_publishing_arguments
from connectors.command import raw_topic as command_raw_topic
from connectors.publisher import PublishFailed, RawPublisher, raw_headers
from streams.config import ConfigError, Settings, check_topic_name

if TYPE_CHECKING:
    from google.cloud.pubsub_v1.subscriber.message import Message

log = logging.getLogger(__name__)

SOURCE = "gcs"
TRANSPORT = "pubsub-pull"
SUBSCRIPTION = re.compile(r"^projects/[^/]+/subscriptions/[^/]+$")
MAX_CALLBACK_THREADS = 32
MAX_FAILURE_BACKOFF_S = 30.0

RECEIVED = Counter("bridge_pubsub_received", "Pub/Sub messages handed to the bridge")
ACKED = Counter("bridge_pubsub_acked", "Messages acked after Kafka acknowledged them")
NACKED = Counter("bridge_pubsub_nacked", "Messages nacked: Kafka did not acknowledge them")
IN_FLIGHT = Gauge("bridge_pubsub_in_flight", "Messages being published")
PUBLISH_SECONDS = Histogram(
    "bridge_pubsub_publish_seconds", "From the callback to Kafka's acknowledgement"
)


class StartupError(Exception):
    """The bridge cannot run as configured; the message is the one line the user sees."""


class PubSubBridge:
    """The subscriber callback: publish to Kafka, then ack; nack whatever Kafka did not take.

    `loop` is the running event loop the (started) `publisher` belongs to; `handle` is called
    from other threads, never from the loop's own thread.
    """

    def __init__(
        self,
        publisher: RawPublisher,
        loop: asyncio.AbstractEventLoop,
        first_backoff_s: float = 0.5,
    ) -> None:
        self.publisher = publisher
        self.loop = loop
        self.first_backoff_s = first_backoff_s
        # publish() waits up to its timeout for the send and again for the acknowledgement.
        self.wait_s = 2 * publisher.timeout_s + 1.0
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._failures = 0

    def __call__(self, message: Message) -> None:
        self.handle(message)

    def handle(self, message: Message) -> bool:
        """Ack `message` once Kafka holds its record and return True; else nack, return False."""
        RECEIVED.inc()
        IN_FLIGHT.inc()
        started = time.monotonic()
        try:
            self.publish(message)
        except Exception as exc:
            self.back_off(message, exc)
            message.nack()
            NACKED.inc()
            return False
        finally:
            IN_FLIGHT.dec()
        with self._lock:
            self._failures = 0
        PUBLISH_SECONDS.observe(time.monotonic() - started)
        message.ack()
        ACKED.inc()
        return True

    def publish(self, message: Message) -> None:
        """Return only once Kafka acknowledged the message's record; raise otherwise."""
        if self.stopping.is_set():
            raise PublishFailed("the bridge is stopping")
        headers = raw_headers(
            SOURCE,
            TRANSPORT,
            attributes=dict(message.attributes),
            delivery_id=message.message_id,
        )
        future = asyncio.run_coroutine_threadsafe(
            self.publisher.publish(bytes(message.data), headers), self.loop
        )
        try:
            future.result(timeout=self.wait_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise PublishFailed(f"no answer from the publisher in {self.wait_s:.1f} s") from None

    def back_off(self, message: Message, exc: BaseException) -> None:
        """Wait before the nack while failures go on (Pub/Sub redelivers a nack at once)."""
        with self._lock:
            self._failures += 1
            failures = self._failures
        wait = min(MAX_FAILURE_BACKOFF_S, self.first_backoff_s * 2 ** min(failures - 1, 10))
        wait *= random.uniform(0.9, 1.1)
        log.warning(
            "message %s not acknowledged by Kafka (%s); nacking it in %.1f s for redelivery",
            message.message_id,
            exc,
            wait,
        )
        self.stopping.wait(wait)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _fatal(exc: BaseException, subscription: str) -> StartupError | None:
    """The one-line error for a stream failure nobody can retry, else None."""
    from google.api_core import exceptions as api

    if isinstance(exc, api.NotFound):
        return StartupError(f"subscription {subscription} does not exist ({_describe(exc)})")
    if isinstance(exc, api.PermissionDenied):
        return StartupError(
            f"not allowed to pull from {subscription} ({_describe(exc)}); the identity needs "
            "roles/pubsub.subscriber on it"
        )
    if isinstance(exc, api.Unauthenticated | api.Unauthorized):
        return StartupError(f"Pub/Sub refused the credentials ({_describe(exc)})")
    return None


def subscriber_client() -> Any:
    """A SubscriberClient, or one line saying why the credentials are unusable."""
    import google.auth.exceptions
    from google.cloud import pubsub_v1

    try:
        return pubsub_v1.SubscriberClient()
    except google.auth.exceptions.DefaultCredentialsError as exc:
        raise StartupError(
            f"no usable Google credentials ({_describe(exc)}); set "
            "GOOGLE_APPLICATION_CREDENTIALS or PUBSUB_EMULATOR_HOST"
        ) from None


async def check_subscription(subscriber: Any, subscription: str) -> None:
    """Fail fast on a missing subscription or refused credentials.

    A subscriber without `pubsub.subscriptions.get` is denied here although it may pull:
    that case is left to the stream, which reports the same errors.
    """
    import google.auth.exceptions
    from google.api_core import exceptions as api

    try:
        await asyncio.to_thread(
            subscriber.get_subscription, request={"subscription": subscription}, timeout=10
        )
    except api.PermissionDenied:
        log.debug("cannot read %s's configuration; the stream will tell", subscription)
    except api.GoogleAPICallError as exc:
        fatal = _fatal(exc, subscription)
        if fatal is not None:
            raise fatal from None
        log.warning("checking %s failed (%s); pulling anyway", subscription, _describe(exc))
    except google.auth.exceptions.GoogleAuthError as exc:
        raise StartupError(f"the Google credentials do not work ({_describe(exc)})") from None
    except api.RetryError as exc:
        log.warning("checking %s timed out (%s); pulling anyway", subscription, _describe(exc))


async def serve(args: argparse.Namespace, settings: Settings, topic: str) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    subscriber = subscriber_client()
    try:
        await check_subscription(subscriber, args.subscription)
        if args.metrics_port is not None:
            try:
                start_http_server(args.metrics_port, addr=args.metrics_host)
            except OSError as exc:
                raise StartupError(
                    f"cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {exc}"
                ) from None
        publisher = RawPublisher(settings.kafka.bootstrap_servers, topic, args.publish_timeout)
        try:
            if await _started(publisher, stop):
                await _pull(args, subscriber, publisher, stop)
        finally:
            await publisher.stop()
    finally:
        await asyncio.to_thread(subscriber.close)


async def _started(publisher: RawPublisher, stop: asyncio.Event) -> bool:
    """Start the publisher (it waits while Kafka is unreachable) unless stopped first."""
    start = asyncio.ensure_future(publisher.start())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({start, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if start.done():
        start.result()
        return True
    start.cancel()
    return False


def _scheduler(bridge: PubSubBridge, max_threads: int) -> Any:
    """The callback scheduler: a thread pool that tells `bridge` when the stream is closed.

    The streaming pull manager stops its stream before it shuts its scheduler down. Only
    then are callbacks waiting out a backoff woken to nack: a message nacked while the stream
    is still open may be redelivered into it as it closes, and would then wait out the
    stream's 60 s ack deadline instead of coming back at once.
    """
    from google.cloud.pubsub_v1.subscriber.scheduler import ThreadScheduler

    class BridgeScheduler(ThreadScheduler):  # type: ignore[misc]
        def shutdown(self, await_msg_callbacks: bool = False) -> list[Message]:
            bridge.stopping.set()
            dropped: list[Message] = super().shutdown(await_msg_callbacks)
            return dropped

    executor = concurrent.futures.ThreadPoolExecutor(
        max_workers=max_threads, thread_name_prefix="pubsub-callback"
    )
    return BridgeScheduler(executor=executor)


async def _pull(
    args: argparse.Namespace, subscriber: Any, publisher: RawPublisher, stop: asyncio.Event
) -> None:
    from google.cloud import pubsub_v1

    loop = asyncio.get_running_loop()
    bridge = PubSubBridge(publisher, loop)
    streaming = subscriber.subscribe(
        args.subscription,
        callback=bridge,
        flow_control=pubsub_v1.types.FlowControl(
            max_messages=args.max_messages, max_bytes=args.max_bytes
        ),
        scheduler=_scheduler(bridge, min(args.max_messages, MAX_CALLBACK_THREADS)),
        # Cancelling waits for callbacks in progress: their acks and nacks are sent.
        await_callbacks_on_shutdown=True,
    )
    ended = asyncio.Event()
    streaming.add_done_callback(lambda _: loop.call_soon_threadsafe(ended.set))
    log.info(
        "pubsub bridge: %s -> Kafka topic %s (at most %d messages in flight)",
        args.subscription,
        publisher.topic,
        args.max_messages,
    )
    waiters = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(ended.wait())}
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for waiter in waiters:
        waiter.cancel()
    if not streaming.done():
        streaming.cancel()  # returns at once; the shutdown runs in the library's thread
    # The shutdown waits for callbacks, which need this loop for their publishes: wait for
    # it in a thread, never by blocking the loop.
    try:
        await asyncio.to_thread(streaming.result)
    except Exception as exc:
        fatal = _fatal(exc, args.subscription)
        if fatal is not None:
            raise fatal from None
        raise StartupError(f"the streaming pull ended: {_describe(exc)}") from None
    finally:
        bridge.stopping.set()


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--subscription", required=True, help="projects/PROJECT/subscriptions/SUBSCRIPTION"
    )
    parser.add_argument(
        "--max-messages",
        type=int,
        default=100,
        metavar="N",
        help="flow control: messages leased and not yet acked or nacked (default 100)",
    )
    parser.add_argument(
        "--max-bytes",
        type=int,
        default=100 * 1024 * 1024,
        metavar="B",
        help="flow control: bytes of such messages (default 100 MiB)",
    )
    add_publishing_arguments(parser)


def _check_arguments(args: argparse.Namespace, settings: Settings) -> str:
    if not SUBSCRIPTION.match(args.subscription):
        raise StartupError(
            f"--subscription {args.subscription!r} is not projects/PROJECT/subscriptions/NAME"
        )
    if args.max_messages < 1 or args.max_bytes < 1 or args.publish_timeout <= 0:
        raise StartupError("--max-messages, --max-bytes and --publish-timeout must be positive")
    topic = command_raw_topic(args, settings)
    try:
        check_topic_name(topic)
    except (ValueError, ConfigError) as exc:
        raise StartupError(f"--topic: {exc}") from None
    return topic


def _run(args: argparse.Namespace, settings: Settings) -> int:
    try:
        topic = _check_arguments(args, settings)
        asyncio.run(serve(args, settings, topic))
    except StartupError as exc:
        print(f"connectors pubsub: {exc}", file=sys.stderr)
        return 2
    log.info("pubsub bridge stopped")
    return 0


COMMAND = BridgeCommand("pull GCS notifications from a Pub/Sub subscription", _add_arguments, _run)
