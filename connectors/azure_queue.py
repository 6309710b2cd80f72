"""The Azure Storage Queue bridge: Event Grid -> Storage Queue -> the raw topic.

    python -m connectors azure-queue --queue NAME --connection-string-env VAR
    python -m connectors azure-queue --queue NAME --account-url URL [--credential-env VAR]

Event Grid's Storage Queue handler writes each event as one queue message whose text is the
base64 of the event's JSON. The bridge publishes that text exactly as received (no decoding:
the client is built without a message decode policy; the azure normalizer decodes it), with
headers `source=azure`, `transport=azure-queue`, `delivery-id` = the queue message id.

The loop, one batch at a time:

1. receive up to `--batch` (at most 32) messages; each becomes invisible to other receivers
   for `--visibility-timeout` seconds;
2. publish every message of the batch (concurrently, on one idempotent acks=all producer);
3. delete a message, with its pop receipt, only once Kafka acknowledged its record.

A message whose publish failed is left alone: it reappears when its visibility timeout
passes and is delivered again (its dequeue count grows). A published message whose delete
fails (its visibility timeout passed first, or the account did not answer) also comes back
and is published twice; the stream drops the copy by the Event Grid event id. Nothing is
deleted that Kafka does not hold. In-flight work is one batch. An empty queue is polled
again after a wait that doubles from 0.1 s up to `--max-idle-wait`; errors back off the same
way up to 30 s; while Kafka refuses writes, the bridge pauses between batches.

Credentials: `--connection-string-env VAR` names the environment variable holding a storage
connection string (never the secret itself on the command line); or `--account-url` with
`--credential-env VAR` holding an account key or a SAS token, or a SAS already in the URL, or
(when the `azure-identity` package is installed) `DefaultAzureCredential`; the identity needs
the "Storage Queue Data Message Processor" role. A missing queue or refused credentials stop
the bridge at start with one line on stderr and exit status 2.

SIGINT / SIGTERM: no new batch is received; the batch in flight is published and deleted
(or left for redelivery), then the bridge exits 0. Metrics: `--metrics-port` serves
Prometheus metrics `bridge_azure_queue_*` on `--metrics-host` (default 127.0.0.1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from connectors.command import BridgeCommand, add_publishing_arguments
from connectors.command import raw_topic as command_raw_topic
from connectors.publisher import PublishFailed, RawPublisher, raw_headers
from streams.config import ConfigError, Settings, check_topic_name

if TYPE_CHECKING:
    from azure.storage.queue import QueueMessage
    from azure.storage.queue.aio import QueueClient

log = logging.getLogger(__name__)

SOURCE = "azure"
TRANSPORT = "azure-queue"
MAX_BATCH = 32  # the service's limit for one receive
MAX_ERROR_BACKOFF_S = 30.0

RECEIVED = Counter("bridge_azure_queue_received", "Queue messages received")
PUBLISHED = Counter("bridge_azure_queue_published", "Messages Kafka acknowledged")
PUBLISH_FAILED = Counter(
    "bridge_azure_queue_publish_failed", "Messages Kafka did not acknowledge (left in the queue)"
)
DELETED = Counter("bridge_azure_queue_deleted", "Messages deleted after Kafka acknowledged them")
DELETE_FAILED = Counter(
    "bridge_azure_queue_delete_failed", "Published messages whose delete failed (delivered again)"
)
ERRORS = Counter("bridge_azure_queue_errors", "Failed queue operations", ["operation"])
IN_FLIGHT = Gauge("bridge_azure_queue_in_flight", "Messages received and not yet settled")
PUBLISH_SECONDS = Histogram(
    "bridge_azure_queue_publish_seconds", "From receiving a message to Kafka's acknowledgement"
)


class StartupError(Exception):
    """The bridge cannot run as configured; the message is the one line the user sees."""


@dataclass(frozen=True)
class Options:
    queue: str
    batch: int
    visibility_timeout: int
    max_idle_wait_s: float


class AzureQueueBridge:
    """Receive, publish, delete: one batch at a time, deleting only what Kafka holds."""

    def __init__(
        self,
        queue: QueueClient,
        publisher: RawPublisher,
        options: Options,
        stop: asyncio.Event,
    ) -> None:
        self.queue = queue
        self.publisher = publisher
        self.options = options
        self.stop = stop

    async def run(self) -> None:
        idle_wait = error_wait = kafka_wait = 0.0
        while not self.stop.is_set():
            try:
                messages = await self.receive()
            except Exception as exc:
                ERRORS.labels("receive").inc()
                error_wait = _next_wait(error_wait, 0.5, MAX_ERROR_BACKOFF_S)
                log.warning(
                    "receiving from queue %s failed (%s); retrying in %.1f s",
                    self.options.queue,
                    _describe(exc),
                    error_wait,
                )
                await self.pause(error_wait)
                continue
            error_wait = 0.0
            if not messages:
                idle_wait = _next_wait(idle_wait, 0.1, self.options.max_idle_wait_s)
                await self.pause(idle_wait)
                continue
            idle_wait = 0.0
            if await self.settle(messages):
                # Kafka is refusing writes: do not churn the queue while it recovers. The
                # failed messages reappear after their visibility timeout.
                kafka_wait = _next_wait(kafka_wait, 0.5, MAX_ERROR_BACKOFF_S)
                await self.pause(kafka_wait)
            else:
                kafka_wait = 0.0

    async def receive(self) -> list[QueueMessage]:
        """One Get Messages call: up to `batch` messages, each hidden for the timeout."""
        pages = self.queue.receive_messages(
            messages_per_page=self.options.batch,
            max_messages=self.options.batch,
            visibility_timeout=self.options.visibility_timeout,
        ).by_page()
        try:
            page = await pages.__anext__()
        except StopAsyncIteration:
            return []
        return [message async for message in page]

    async def settle(self, messages: list[QueueMessage]) -> int:
        """Publish every message and delete those Kafka acknowledged; return how many failed."""
        RECEIVED.inc(len(messages))
        IN_FLIGHT.inc(len(messages))
        received = time.monotonic()
        try:
            outcomes = await asyncio.gather(
                *(self.handle(message, received) for message in messages)
            )
        finally:
            IN_FLIGHT.dec(len(messages))
        return outcomes.count(False)

    async def handle(self, message: QueueMessage, received: float) -> bool:
        """Publish one message; delete it only after Kafka acknowledged it.

        Returns False when Kafka did not acknowledge (the message stays in the queue).
        """
        text: str = message.content or ""
        headers = raw_headers(SOURCE, TRANSPORT, delivery_id=message.id)
        try:
            await self.publisher.publish(text.encode("utf-8"), headers)
        except Exception as exc:
            if not isinstance(exc, PublishFailed):
                log.exception("publishing message %s failed unexpectedly", message.id)
            PUBLISH_FAILED.inc()
            log.warning(
                "message %s (dequeue count %s) not acknowledged by Kafka, left in the queue "
                "for redelivery: %s",
                message.id,
                message.dequeue_count,
                exc,
            )
            return False
        PUBLISH_SECONDS.observe(time.monotonic() - received)
        PUBLISHED.inc()
        try:
            await self.queue.delete_message(message.id, message.pop_receipt)
        except Exception as exc:
            DELETE_FAILED.inc()
            ERRORS.labels("delete").inc()
            log.warning(
                "message %s is in Kafka but its delete failed (%s): it will be delivered "
                "again and the stream drops the copy by event id",
                message.id,
                _describe(exc),
            )
        else:
            DELETED.inc()
        return True

    async def pause(self, seconds: float) -> None:
        """Sleep, waking at once on shutdown."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)


def _next_wait(current: float, first: float, ceiling: float) -> float:
    """Exponential backoff with a little jitter."""
    wait = first if current <= 0 else min(current * 2, ceiling)
    return min(ceiling, wait * random.uniform(0.9, 1.1))


def _describe(exc: BaseException) -> str:
    """An exception in one line (the SDK's messages span several)."""
    code = getattr(exc, "error_code", None)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    code_text = getattr(code, "value", code)
    return f"{type(exc).__name__}{f' {code_text}' if code_text else ''}: {text}"


def queue_client(args: argparse.Namespace, environ: dict[str, str]) -> QueueClient:
    """The async QueueClient the options describe, without any message encoding policy."""
    from azure.storage.queue.aio import QueueClient

    # The SDK's default retry waits 15 s and more between attempts; the bridge has its own
    # backoff, so keep the SDK's short.
    client_options: dict[str, Any] = {"retry_total": 2, "initial_backoff": 1, "increment_base": 2}
    if args.connection_string_env:
        if args.credential_env:
            raise StartupError("--credential-env goes with --account-url, not a connection string")
        connection_string = environ.get(args.connection_string_env)
        if not connection_string:
            raise StartupError(
                f"environment variable {args.connection_string_env} (--connection-string-env) "
                "is not set"
            )
        try:
            # No message_decode_policy: the text comes back exactly as Event Grid wrote it.
            return QueueClient.from_connection_string(
                connection_string, args.queue, **client_options
            )
        except ValueError as exc:
            raise StartupError(
                f"the connection string in {args.connection_string_env} is not valid: {exc}"
            ) from None
    credential: Any = None
    if args.credential_env:
        credential = environ.get(args.credential_env)
        if not credential:
            raise StartupError(
                f"environment variable {args.credential_env} (--credential-env) is not set"
            )
    elif "sig=" not in args.account_url:
        try:
            from azure.identity.aio import DefaultAzureCredential
        except ImportError:
            raise StartupError(
                "--account-url needs --credential-env VAR (an account key or SAS token), a SAS "
                "in the URL, or the azure-identity package for DefaultAzureCredential"
            ) from None
        credential = DefaultAzureCredential()
    try:
        return QueueClient(args.account_url, args.queue, credential=credential, **client_options)
    except ValueError as exc:
        raise StartupError(f"--account-url {args.account_url!r} is not usable: {exc}") from None


async def check_queue(queue: QueueClient, stop: asyncio.Event) -> None:
    """Fail with one line for a missing queue or refused credentials; wait out outages."""
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ResourceNotFoundError,
        ServiceRequestError,
    )

    where = f"queue {queue.queue_name!r} at {queue.primary_endpoint.split('?')[0]}"
    wait = 0.0
    while not stop.is_set():
        try:
            await queue.get_queue_properties()
            return
        except ResourceNotFoundError as exc:
            raise StartupError(f"{where} does not exist ({_describe(exc)})") from None
        except ClientAuthenticationError as exc:
            raise StartupError(
                f"the storage account refused the credentials for {where} ({_describe(exc)})"
            ) from None
        except HttpResponseError as exc:
            if exc.status_code in (401, 403):
                raise StartupError(
                    f"not allowed to use {where} ({_describe(exc)}); the identity needs the "
                    "Storage Queue Data Message Processor role"
                ) from None
            if exc.status_code is not None and 400 <= exc.status_code < 500:
                raise StartupError(f"cannot use {where} ({_describe(exc)})") from None
            failure = _describe(exc)
        except ServiceRequestError as exc:
            failure = _describe(exc)
        wait = _next_wait(wait, 0.5, MAX_ERROR_BACKOFF_S)
        log.warning("cannot reach %s (%s); retrying in %.1f s", where, failure, wait)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)


async def serve(args: argparse.Namespace, settings: Settings, topic: str) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    options = Options(args.queue, args.batch, args.visibility_timeout, args.max_idle_wait)
    async with queue_client(args, dict(os.environ)) as queue:
        await check_queue(queue, stop)
        if stop.is_set():
            return
        if args.metrics_port is not None:
            try:
                start_http_server(args.metrics_port, addr=args.metrics_host)
            except OSError as exc:
                raise StartupError(
                    f"cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {exc}"
                ) from None
        publisher = RawPublisher(settings.kafka.bootstrap_servers, topic, args.publish_timeout)
        start = asyncio.ensure_future(publisher.start())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({start, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not start.done():  # stopped while Kafka was unreachable: nothing was received
            start.cancel()
            stopping.cancel()
            await publisher.stop()
            return
        stopping.cancel()
        log.info(
            "azure-queue bridge: queue %s -> Kafka topic %s (batch %d, visibility timeout %d s)",
            args.queue,
            topic,
            options.batch,
            options.visibility_timeout,
        )
        try:
            await AzureQueueBridge(queue, publisher, options, stop).run()
        finally:
            await publisher.stop()


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue", required=True, help="the storage queue's name")
    account = parser.add_mutually_exclusive_group(required=True)
    account.add_argument(
        "--connection-string-env",
        metavar="VAR",
        help="environment variable holding the storage account's connection string",
    )
    account.add_argument(
        "--account-url", metavar="URL", help="the queue service URL, e.g. https://ACCOUNT.queue..."
    )
    parser.add_argument(
        "--credential-env",
        metavar="VAR",
        help="with --account-url: environment variable holding an account key or a SAS token",
    )
    parser.add_argument(
        "--visibility-timeout",
        type=int,
        default=60,
        metavar="S",
        help="seconds a received message stays hidden; a failed one comes back after it "
        "(default 60)",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=MAX_BATCH,
        metavar="N",
        help=f"messages per receive, 1-{MAX_BATCH} (default {MAX_BATCH})",
    )
    add_publishing_arguments(parser)
    parser.add_argument(
        "--max-idle-wait",
        type=float,
        default=5.0,
        metavar="S",
        help="longest wait between polls of an empty queue (default 5)",
    )


def _check_arguments(args: argparse.Namespace, settings: Settings) -> str:
    """Validate what argparse cannot; return the topic to publish to."""
    if not 1 <= args.batch <= MAX_BATCH:
        raise StartupError(f"--batch must be between 1 and {MAX_BATCH}, not {args.batch}")
    if not 1 <= args.visibility_timeout <= 7 * 24 * 3600:
        raise StartupError("--visibility-timeout must be between 1 s and 7 days")
    if args.publish_timeout <= 0 or args.max_idle_wait <= 0:
        raise StartupError("--publish-timeout and --max-idle-wait must be positive")
    if args.visibility_timeout <= 2 * args.publish_timeout:
        log.warning(
            "--visibility-timeout %d s is not longer than twice --publish-timeout %.1f s: a "
            "slow publish can let a message reappear while it is in flight (a duplicate the "
            "stream drops, never a loss)",
            args.visibility_timeout,
            args.publish_timeout,
        )
    topic = command_raw_topic(args, settings)
    try:
        check_topic_name(topic)
    except (ValueError, ConfigError) as exc:
        raise StartupError(f"--topic: {exc}") from None
    return topic


def _run(args: argparse.Namespace, settings: Settings) -> int:
    # The SDK logs every HTTP request at INFO.
    logging.getLogger("azure").setLevel(logging.WARNING)
    try:
        topic = _check_arguments(args, settings)
        asyncio.run(serve(args, settings, topic))
    except StartupError as exc:
        print(f"connectors azure-queue: {exc}", file=sys.stderr)
        return 2
    log.info("azure-queue bridge stopped")
    return 0


COMMAND = BridgeCommand(
    "pull Event Grid blob events from an Azure Storage Queue", _add_arguments, _run
)
