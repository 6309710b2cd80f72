"""The Azure Storage Queue bridge: Event Grid -> Storage Queue -> the raw topic.

    python -m connectors azure-queue --queue NAME --connection-string-env VAR
    python -m connectors azure-queue --queue NAME --account-url URL [--credential-env VAR]

Event Grid's Storage Queue handler writes each event as one queue message whose text is the
base64 of the event's JSON. The bridge publishes that text exactly as received (no decoding:
the client is built without a message decode policy; the azure normalizer decodes it), with
headers `source=azure`, `transport=azure-queue`, `delivery-id` = the queue message id.

The loop is the pull bridges' own (`connectors.pull.PullBridge`, shared with SQS and Pub/Sub):
receive up to `--batch` (at most 32) messages, each invisible to other receivers for
`--visibility-timeout` seconds; publish each; delete, with its pop receipt, exactly the
messages Kafka acknowledged. A message whose publish failed is left alone: it reappears when
its visibility timeout passes and is delivered again (its dequeue count grows). A published
message whose delete fails also comes back and is published twice; the stream drops the copy
by the Event Grid event id. In flight: one batch. A Storage Queue has no long poll: an empty
queue is polled again after a wait that doubles from 0.1 s up to `--max-idle-wait`; errors
back off (0.5 s doubling to 30 s), and so does the loop while Kafka refuses writes.

Credentials: `--connection-string-env VAR` names the environment variable holding a storage
connection string (never the secret itself on the command line); or `--account-url` with
`--credential-env VAR` holding an account key or a SAS token, or a SAS already in the URL, or
(when the `azure-identity` package is installed) `DefaultAzureCredential`; the identity needs
the "Storage Queue Data Message Processor" role. A missing queue or refused credentials stop
the bridge with one line on stderr and exit status 2 (`connectors.pull.EXIT_FATAL`).

SIGINT / SIGTERM: no new batch is received (a poll in progress ends within
`--max-idle-wait`); the batch in flight is published and deleted (or left for redelivery),
then the bridge exits 0. Metrics: `--metrics-port` serves the pull bridges' family
`bridge_pull_*{bridge="azure-queue",queue=NAME}` (`connectors.pull`) on `--metrics-host`
(default 127.0.0.1).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
from streams.config import ConfigError, Settings, check_topic_name

if TYPE_CHECKING:
    from azure.storage.queue.aio import QueueClient

log = logging.getLogger(__name__)

BRIDGE = "azure-queue"
SOURCE = "azure"
TRANSPORT = "azure-queue"
MAX_BATCH = 32  # the service's limit for one receive
FIRST_IDLE_WAIT_S = 0.1


class StartupError(Exception):
    """The bridge cannot run as configured; the message is the one line the user sees."""


@dataclass(frozen=True)
class Options:
    queue: str
    batch: int
    visibility_timeout: int
    max_idle_wait_s: float


def _describe(exc: BaseException) -> str:
    """An exception in one line (the SDK's messages span several)."""
    code = getattr(exc, "error_code", None)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    code_text = getattr(code, "value", code)
    return f"{type(exc).__name__}{f' {code_text}' if code_text else ''}: {text}"


def classify(exc: Exception, where: str) -> Exception:
    """An SDK failure as FatalQueueError (one line, exit 2) or QueueError (back off, retry)."""
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ResourceNotFoundError,
    )

    if isinstance(exc, ResourceNotFoundError):
        return FatalQueueError(f"{where} does not exist ({_describe(exc)})")
    if isinstance(exc, ClientAuthenticationError):
        return FatalQueueError(
            f"the storage account refused the credentials for {where} ({_describe(exc)})"
        )
    if isinstance(exc, HttpResponseError) and exc.status_code in (401, 403):
        return FatalQueueError(
            f"not allowed to use {where} ({_describe(exc)}); the identity needs the Storage "
            "Queue Data Message Processor role"
        )
    if (
        isinstance(exc, HttpResponseError)
        and exc.status_code is not None
        and 400 <= exc.status_code < 500
        and exc.status_code not in (408, 429)
    ):
        return FatalQueueError(f"cannot use {where} ({_describe(exc)})")
    return QueueError(_describe(exc))


class AzureQueue:
    """One Storage Queue as a `connectors.pull.PullQueue`, through the SDK's async client."""

    def __init__(self, client: QueueClient, options: Options) -> None:
        self.client = client
        self.options = options
        self.name = options.queue
        self.max_batch = options.batch
        self.where = f"queue {client.queue_name!r} at {client.primary_endpoint.split('?')[0]}"
        self._idle_wait = 0.0

    async def check(self) -> None:
        try:
            await self.client.get_queue_properties()
        except Exception as exc:
            raise classify(exc, self.where) from exc

    async def receive(self, max_messages: int) -> list[Pulled]:
        """One Get Messages call; when the queue is empty, a wait (doubling up to
        `max_idle_wait_s`) before answering none, since the service has no long poll."""
        count = max(1, min(max_messages, self.max_batch))
        try:
            pages = self.client.receive_messages(
                messages_per_page=count,
                max_messages=count,
                visibility_timeout=self.options.visibility_timeout,
            ).by_page()
            try:
                page = await pages.__anext__()
                messages = [message async for message in page]
            except StopAsyncIteration:
                messages = []
        except Exception as exc:
            raise classify(exc, self.where) from exc
        if not messages:
            self._idle_wait = min(
                self.options.max_idle_wait_s, max(FIRST_IDLE_WAIT_S, self._idle_wait * 2)
            )
            await asyncio.sleep(self._idle_wait)
            return []
        self._idle_wait = 0.0
        return [
            Pulled(
                body=(message.content or "").encode("utf-8"),
                delivery_id=message.id,
                handle=(message.id, message.pop_receipt),
            )
            for message in messages
        ]

    async def delete(self, messages: Sequence[Pulled]) -> list[Pulled]:
        outcomes = await asyncio.gather(
            *(self.client.delete_message(*message.handle) for message in messages),
            return_exceptions=True,
        )
        left = []
        for message, outcome in zip(messages, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning(
                    "the queue did not delete message %r: %s",
                    message.delivery_id,
                    _describe(outcome),
                )
                left.append(message)
        return left

    async def release(self, messages: Sequence[Pulled]) -> None:
        for message in messages:
            await self.client.update_message(*message.handle, visibility_timeout=0)


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

    async def main() -> int:
        options = Options(args.queue, args.batch, args.visibility_timeout, args.max_idle_wait)
        async with queue_client(args, dict(os.environ)) as client:
            publisher = RawPublisher(settings.kafka, topic, args.publish_timeout)
            bridge = PullBridge(
                AzureQueue(client, options),
                publisher,
                BRIDGE,
                SOURCE,
                TRANSPORT,
                max_in_flight=options.batch,  # one batch at a time
            )
            return await serve(
                BRIDGE,
                bridge,
                publisher,
                metrics_port=args.metrics_port,
                metrics_host=args.metrics_host,
            )

    try:
        topic = _check_arguments(args, settings)
        return asyncio.run(main())
    except StartupError as exc:
        print(f"connectors {BRIDGE}: {exc}", file=sys.stderr)
        return EXIT_FATAL


COMMAND = BridgeCommand(
    "pull Event Grid blob events from an Azure Storage Queue", _add_arguments, _run
)
