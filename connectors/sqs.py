"""The SQS pull bridge: `python -m connectors sqs --queue-url URL --source s3|eventbridge|minio`.

Serves every AWS path into an SQS queue: S3 -> SQS, S3 -> SNS -> SQS (raw message delivery or
the SNS envelope), EventBridge -> SQS; `--source minio` takes MinIO-format records that a relay
forwards into a queue (MinIO itself has no SQS target). The message body is published exactly
as received (its UTF-8 bytes); the stream's normalizer for `--source` unwraps whatever envelope
it is in.

Loop (`connectors.pull`): long poll (`WaitTimeSeconds`, default 20), batches of up to 10,
every message published to the raw topic, then `DeleteMessageBatch` of exactly the messages
Kafka acknowledged. A message whose publish failed is not touched: SQS delivers it again
after the queue's visibility timeout. Keep the visibility timeout above `--publish-timeout`
(the bridge warns otherwise), or a slow acknowledgement lets SQS redeliver a message that is
still being published (harmless: the stream drops the copy by event id).

Raw record headers: `source` (from `--source`), `transport=sqs`, `delivery-id` = the SQS
MessageId, `received-at`, and every message attribute as `attribute.<Name>` (String and
Number values as given, Binary values base64-encoded). SQS system attributes are not copied.

Options: `--endpoint-url` (moto, LocalStack, MinIO; else boto3's own resolution, including
`AWS_ENDPOINT_URL_SQS`), `--region` (else the region in an AWS queue URL, else the usual
chain), `--max-in-flight` (default 100), `--wait-time` (seconds, 0-20), `--raw-topic` (default:
the first of `[stream] raw_topics`), `--publish-timeout` (seconds, default 10),
`--metrics-port` and `--metrics-host` (Prometheus `/metrics`, default host 127.0.0.1; the pull
bridges' family `bridge_pull_*{bridge="sqs",queue=NAME}`, names in `connectors.pull`).
Credentials: the usual AWS chain (environment, shared files, SSO, instance/task roles).

Exit codes: 0 after SIGINT/SIGTERM (the batches in flight are settled first; a long poll in
progress ends within `--wait-time`, and what it brings is handed back to the queue), 2 with
one line on stderr when the queue does not exist or the credentials are missing or refused
(`connectors.pull.EXIT_FATAL`, the same for every pull bridge).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from connectors.command import BridgeCommand, add_publishing_arguments
from connectors.command import raw_topic as command_raw_topic
from connectors.publisher import RawPublisher
from connectors.pull import FatalQueueError, PullBridge, Pulled, QueueError, serve
from streams.config import Settings
from streams.logs import printable

log = logging.getLogger(__name__)

SOURCES = ("s3", "eventbridge", "minio")
TRANSPORT = "sqs"
MAX_BATCH = 10
AWS_QUEUE_HOST = re.compile(r"^sqs[.-]([a-z0-9-]+)\.amazonaws\.com(\.cn)?$")

_MISSING_QUEUE = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}
_REFUSED = {
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "MissingAuthenticationToken",
    "ExpiredToken",
    "ExpiredTokenException",
    "InvalidSecurity",
    "AuthFailure",
}
_DENIED = {"AccessDenied", "AccessDeniedException", "KMS.AccessDeniedException"}
_BAD_REQUEST = {"InvalidAddress", "InvalidParameterValue", "ValidationError"}


def queue_name(queue_url: str) -> str:
    return queue_url.rstrip("/").rsplit("/", 1)[-1] or queue_url


def region_of(queue_url: str) -> str | None:
    """The region in an AWS queue URL (`https://sqs.eu-west-1.amazonaws.com/...`), else None."""
    match = AWS_QUEUE_HOST.match(urlsplit(queue_url).hostname or "")
    return match.group(1) if match else None


def message_attributes(message: Mapping[str, Any]) -> dict[str, str]:
    """SQS message attributes as text: String/Number as given, Binary as base64."""
    attributes: dict[str, str] = {}
    for name, value in (message.get("MessageAttributes") or {}).items():
        if "StringValue" in value:
            attributes[name] = str(value["StringValue"])
        elif "BinaryValue" in value:
            attributes[name] = base64.b64encode(bytes(value["BinaryValue"])).decode()
    return attributes


def classify(exc: Exception, queue_url: str) -> Exception:
    """A boto3 failure as FatalQueueError (one line, exit) or QueueError (back off, retry)."""
    from botocore.exceptions import (
        ClientError,
        NoCredentialsError,
        NoRegionError,
        ParamValidationError,
        PartialCredentialsError,
    )

    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return FatalQueueError(
            f"no usable AWS credentials ({exc}); set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
            "AWS_PROFILE or a role"
        )
    if isinstance(exc, NoRegionError):
        return FatalQueueError("no AWS region: pass --region or set AWS_REGION")
    if isinstance(exc, ParamValidationError):
        return FatalQueueError(f"invalid request for queue {queue_url}: {exc}".replace("\n", " "))
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        query_code = str(error.get("QueryErrorCode", ""))
        message = str(error.get("Message", "")).replace("\n", " ")
        codes = {code, query_code}
        if codes & _MISSING_QUEUE:
            return FatalQueueError(f"queue {queue_url} does not exist ({code})")
        if codes & _REFUSED:
            return FatalQueueError(f"AWS refused the credentials ({code}: {message})")
        if codes & _DENIED:
            return FatalQueueError(f"access denied to queue {queue_url} ({code}: {message})")
        if codes & _BAD_REQUEST:
            return FatalQueueError(f"queue {queue_url} refused the request ({code}: {message})")
        return QueueError(f"{code}: {message}")
    return QueueError(f"{type(exc).__name__}: {exc}")


class SqsQueue:
    """One SQS queue, seen through a boto3 client (its calls run in a worker thread)."""

    max_batch = MAX_BATCH

    def __init__(
        self,
        client: Any,
        queue_url: str,
        wait_time_s: int = 20,
        publish_timeout_s: float | None = None,
    ) -> None:
        self.client = client
        self.queue_url = queue_url
        self.wait_time_s = wait_time_s
        self.publish_timeout_s = publish_timeout_s
        self.name = queue_name(queue_url)
        self.visibility_timeout_s: int | None = None

    async def _call(self, method: Callable[..., Any], **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(method, **kwargs)
        except Exception as exc:
            raise classify(exc, self.queue_url) from exc

    async def check(self) -> None:
        response = await self._call(
            self.client.get_queue_attributes,
            QueueUrl=self.queue_url,
            AttributeNames=["VisibilityTimeout"],
        )
        timeout = response.get("Attributes", {}).get("VisibilityTimeout")
        self.visibility_timeout_s = int(timeout) if timeout is not None else None
        if (
            self.visibility_timeout_s is not None
            and self.publish_timeout_s is not None
            and self.visibility_timeout_s <= self.publish_timeout_s
        ):
            log.warning(
                "queue %s has a visibility timeout of %d s, not above the publish timeout of "
                "%.0f s: a slow write may be delivered twice (the stream drops the copy)",
                self.name,
                self.visibility_timeout_s,
                self.publish_timeout_s,
            )

    async def receive(self, max_messages: int) -> list[Pulled]:
        response = await self._call(
            self.client.receive_message,
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=max(1, min(max_messages, MAX_BATCH)),
            WaitTimeSeconds=self.wait_time_s,
            MessageAttributeNames=["All"],
        )
        return [
            Pulled(
                body=message["Body"].encode("utf-8"),
                delivery_id=message["MessageId"],
                attributes=message_attributes(message),
                handle=message["ReceiptHandle"],
            )
            for message in response.get("Messages", [])
        ]

    async def delete(self, messages: Sequence[Pulled]) -> list[Pulled]:
        left: list[Pulled] = []
        for start in range(0, len(messages), MAX_BATCH):
            chunk = messages[start : start + MAX_BATCH]
            entries = [
                {"Id": str(index), "ReceiptHandle": message.handle}
                for index, message in enumerate(chunk)
            ]
            response = await self._call(
                self.client.delete_message_batch, QueueUrl=self.queue_url, Entries=entries
            )
            for failure in response.get("Failed", []):
                message = chunk[int(failure["Id"])]
                log.warning(
                    "SQS did not delete message %r: %s %s",
                    message.delivery_id,
                    printable(str(failure.get("Code"))),
                    printable(str(failure.get("Message", ""))),
                )
                left.append(message)
        return left

    async def release(self, messages: Sequence[Pulled]) -> None:
        for start in range(0, len(messages), MAX_BATCH):
            chunk = messages[start : start + MAX_BATCH]
            entries = [
                {"Id": str(index), "ReceiptHandle": message.handle, "VisibilityTimeout": 0}
                for index, message in enumerate(chunk)
            ]
            await self._call(
                self.client.change_message_visibility_batch,
                QueueUrl=self.queue_url,
                Entries=entries,
            )


def make_client(
    queue_url: str, endpoint_url: str | None, region: str | None, wait_time_s: int
) -> Any:
    """A boto3 SQS client whose read timeout outlasts the long poll."""
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=5,
        read_timeout=wait_time_s + 15,
        retries={"mode": "standard", "max_attempts": 3},
    )
    session = boto3.session.Session()
    return session.client(
        "sqs",
        endpoint_url=endpoint_url,
        region_name=region or region_of(queue_url),
        config=config,
    )


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue-url", required=True, help="the SQS queue URL")
    parser.add_argument(
        "--source",
        required=True,
        choices=SOURCES,
        help="what the queue carries: s3 (S3 or S3 -> SNS), eventbridge, minio",
    )
    parser.add_argument("--endpoint-url", help="SQS endpoint (moto, LocalStack, MinIO)")
    parser.add_argument("--region", help="AWS region (default: from the queue URL, then AWS)")
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=100,
        help="messages received and not yet deleted or left, at most (default 100)",
    )
    parser.add_argument(
        "--wait-time",
        type=int,
        default=20,
        choices=range(0, 21),
        metavar="SECONDS",
        help="long-poll wait, 0-20 s (default 20); also bounds the shutdown time",
    )
    add_publishing_arguments(parser)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    logging.getLogger("botocore").setLevel(logging.WARNING)  # no "Found credentials" chatter
    if args.max_in_flight < 1:
        print("connectors sqs: --max-in-flight must be at least 1", file=sys.stderr)
        return 2
    raw_topic = command_raw_topic(args, settings)
    client = make_client(args.queue_url, args.endpoint_url, args.region, args.wait_time)
    queue = SqsQueue(client, args.queue_url, args.wait_time, args.publish_timeout)
    publisher = RawPublisher(settings.kafka, raw_topic, args.publish_timeout)

    async def main() -> int:
        bridge = PullBridge(
            queue, publisher, "sqs", args.source, TRANSPORT, max_in_flight=args.max_in_flight
        )
        return await serve(
            "sqs",
            bridge,
            publisher,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
        )

    return asyncio.run(main())


COMMAND = BridgeCommand("SQS pull bridge (S3, S3 -> SNS, EventBridge)", _add_arguments, _run)
