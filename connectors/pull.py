"""The pull-bridge loop, shared by queue bridges: receive, publish, delete only what Kafka holds.

A pull bridge reads a provider queue (an SQS queue, an Azure Storage Queue, a Pub/Sub
subscription: `connectors.sqs`, `connectors.azure_queue`, `connectors.pubsub`, each a
`PullQueue`) and publishes every message's bytes, exactly as received, to a raw
topic. The rule it exists for: **a message is deleted from its queue only after Kafka
acknowledged its write.** A message whose publish failed is left alone; the queue delivers it
again once its visibility timeout (lease) runs out, and the stream drops any copy by event id.

The loop (`PullBridge.run`):

1. Wait for a free slot: at most `max_in_flight` messages are between "received" and
   "deleted or left" at any time (bounded memory and bounded redelivery on a crash).
2. Receive up to `min(queue.max_batch, free slots)` messages (a long poll).
3. Hand the batch to its own task, and go back to 1 (the next long poll runs while the batch
   is published). The task publishes each message (concurrently; `publish` returns only once
   Kafka acknowledged it, else raises `PublishFailed`), then deletes **exactly the
   acknowledged ones** in one batch call. The unacknowledged ones are never deleted.
   While a batch is publishing, a queue with leases (`LeasedQueue`: Pub/Sub's ack deadline)
   has them extended every half lease, so a slow or retrying write to Kafka does not turn
   into a redelivery of messages still in hand.
   A message too large for the raw topic (`RecordTooLarge`: no retry could ever write it)
   is, where the bridge has a dead-letter publisher, written whole to the dead-letter topic
   (its bytes, the raw headers, `error` = why, `error.stage` = `bridge`, `error.topic` = the
   raw topic, as `streams.core.records.dead_letter_record`) and deleted once Kafka holds
   that; without one, or if that write fails, it is left like any failed publish.
4. Errors back off exponentially (0.5 s doubling to 30 s, reset by a good round): a failed
   receive, and a batch with any failed publish (Kafka is likely down: receiving more only to
   fail again would churn the queue). A failed delete is retried a few times; what still
   fails comes back from the queue later and the stream drops the copy.

Shutdown (`stop` set, e.g. by SIGINT/SIGTERM): no new receive starts; a long poll in progress
cannot be interrupted (it ends within its wait time), and whatever it returns is released
back to the queue at once, unpublished; every batch in flight finishes publishing and deletes
what Kafka acknowledged; then `run` returns.

A `FatalQueueError` (the queue does not exist, credentials missing or rejected, access
denied) ends the loop the same way and is raised: the command prints it as one line and
exits with `EXIT_FATAL` (2), whichever the bridge.

Metrics, the same family for every pull bridge (Prometheus, labels `bridge` = `sqs`,
`azure-queue` or `pubsub`, and `queue` = the queue's or subscription's name):
`bridge_pull_received_total`, `bridge_pull_published_total` (Kafka acknowledged),
`bridge_pull_deleted_total` (deleted or acked after that), `bridge_pull_publish_failures_total`
(left in the queue), `bridge_pull_delete_failures_total`, `bridge_pull_receive_errors_total`,
`bridge_pull_released_total` (handed back at shutdown), `bridge_pull_dead_lettered_total` (too
large for the raw topic, written to the dead-letter topic), `bridge_pull_extended_total`
(lease extensions of messages still publishing), the gauge `bridge_pull_in_flight`, and
the histogram `bridge_pull_publish_seconds` (from receiving a message to Kafka's
acknowledgement).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from connectors.publisher import PublishFailed, RawPublisher, RecordTooLarge, raw_headers
from streams.logs import printable

log = logging.getLogger(__name__)

_LABELS = ("bridge", "queue")
RECEIVED = Counter("bridge_pull_received", "Messages received from the queue", _LABELS)
PUBLISHED = Counter("bridge_pull_published", "Messages whose write Kafka acknowledged", _LABELS)
DELETED = Counter(
    "bridge_pull_deleted", "Messages deleted from the queue after Kafka acknowledged them", _LABELS
)
PUBLISH_FAILURES = Counter(
    "bridge_pull_publish_failures",
    "Messages left in the queue (for redelivery) because Kafka did not acknowledge them",
    _LABELS,
)
DELETE_FAILURES = Counter(
    "bridge_pull_delete_failures",
    "Published messages the queue did not delete (they come back; the stream drops the copy)",
    _LABELS,
)
RECEIVE_ERRORS = Counter("bridge_pull_receive_errors", "Failed receive calls", _LABELS)
RELEASED = Counter("bridge_pull_released", "Messages handed back unpublished at shutdown", _LABELS)
DEAD_LETTERED = Counter(
    "bridge_pull_dead_lettered",
    "Messages too large for the raw topic, written whole to the dead-letter topic",
    _LABELS,
)
EXTENDED = Counter(
    "bridge_pull_extended", "Lease extensions of messages whose publish was pending", _LABELS
)
IN_FLIGHT = Gauge("bridge_pull_in_flight", "Messages received and not yet settled", _LABELS)
PUBLISH_SECONDS = Histogram(
    "bridge_pull_publish_seconds",
    "From receiving a message to Kafka's acknowledgement of its record",
    _LABELS,
)

DELETE_ATTEMPTS = 3
EXIT_FATAL = 2
"""Exit code of a pull bridge whose queue cannot be used (missing, credentials refused)."""


class QueueError(Exception):
    """A queue call failed in a way that may pass (network, throttling, 5xx): back off."""


class FatalQueueError(Exception):
    """The queue cannot be used as configured (missing, no or bad credentials, no access).

    The message is one line saying what is wrong; the bridge exits non-zero.
    """


@dataclass(frozen=True, slots=True)
class Pulled:
    """One message as received: its bytes, its transport id, its attributes, its handle."""

    body: bytes
    delivery_id: str
    attributes: Mapping[str, str] = field(default_factory=dict)
    handle: Any = None
    """What the queue needs to delete or release the message (an SQS receipt handle)."""


class PullQueue(Protocol):
    """What the loop needs from a queue. Calls raise QueueError or FatalQueueError."""

    name: str
    max_batch: int

    async def check(self) -> None:
        """Prove the queue exists and the credentials work (FatalQueueError if not)."""

    async def receive(self, max_messages: int) -> list[Pulled]:
        """Up to `max_messages` messages (a long poll: may wait, may return none)."""
        ...

    async def delete(self, messages: Sequence[Pulled]) -> list[Pulled]:
        """Delete the messages; return those the queue did not delete."""
        ...

    async def release(self, messages: Sequence[Pulled]) -> None:
        """Make the messages visible again at once (best effort)."""


@runtime_checkable
class LeasedQueue(Protocol):
    """A queue whose messages are leased for `lease_s` seconds (Pub/Sub's ack deadline) and
    whose leases can be extended while their publish is pending."""

    lease_s: float

    async def extend(self, messages: Sequence[Pulled]) -> None:
        """Lease the messages for another `lease_s` seconds from now (best effort)."""


DEAD_LETTER_STAGE = "bridge"
"""`error.stage` of the dead letters a pull bridge writes."""


class Publisher(Protocol):
    async def publish(
        self, value: bytes, headers: list[tuple[str, bytes]], key: bytes | None = None
    ) -> None: ...


class Backoff:
    """Exponential delays with jitter: 0.5 s, 1 s, 2 s ... up to `maximum`; `reset` restarts."""

    def __init__(self, initial_s: float = 0.5, maximum_s: float = 30.0) -> None:
        self.initial_s = initial_s
        self.maximum_s = maximum_s
        self._next = initial_s

    def next(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self.maximum_s)
        return delay * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self._next = self.initial_s


async def sleep_unless(stop: asyncio.Event, delay_s: float) -> None:
    """Sleep `delay_s`, or less if `stop` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), delay_s)


class PullBridge:
    """The loop of one pull bridge (see the module docstring)."""

    def __init__(
        self,
        queue: PullQueue,
        publisher: Publisher,
        bridge: str,
        source: str,
        transport: str,
        max_in_flight: int = 100,
        backoff: Backoff | None = None,
        dead_letters: Publisher | None = None,
        raw_topic: str = "",
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.queue = queue
        self.publisher = publisher
        self.dead_letters = dead_letters
        """Where a message too large for the raw topic goes (None: it is left in the queue)."""
        self.raw_topic = raw_topic or str(getattr(publisher, "topic", ""))
        self.source = source
        self.transport = transport
        self.max_in_flight = max_in_flight
        self.backoff = backoff or Backoff()
        self._labels = {"bridge": bridge, "queue": queue.name}
        for metric in (
            RECEIVED,
            PUBLISHED,
            DELETED,
            PUBLISH_FAILURES,
            DELETE_FAILURES,
            RECEIVE_ERRORS,
            RELEASED,
            DEAD_LETTERED,
            EXTENDED,
            IN_FLIGHT,
            PUBLISH_SECONDS,
        ):
            metric.labels(**self._labels)  # every series exists from the start, at 0
        self._in_flight = 0
        self._settled = asyncio.Event()
        self._kafka_failing = False
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def run(self, stop: asyncio.Event) -> None:
        """Receive, publish and delete until `stop` is set (or a FatalQueueError, raised)."""
        try:
            while not stop.is_set():
                free = await self._free_slots(stop)
                if stop.is_set():
                    break
                if self._kafka_failing:
                    await sleep_unless(stop, self.backoff.next())
                    if stop.is_set():
                        break
                messages = await self._receive(min(self.queue.max_batch, free), stop)
                if not messages:
                    continue
                if stop.is_set():
                    await self._release(messages)
                    break
                self._start_batch(messages)
        finally:
            # Every batch in flight publishes and deletes what Kafka acknowledged.
            while self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _free_slots(self, stop: asyncio.Event) -> int:
        while self._in_flight >= self.max_in_flight and not stop.is_set():
            self._settled.clear()
            waiters = [
                asyncio.ensure_future(self._settled.wait()),
                asyncio.ensure_future(stop.wait()),
            ]
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
        return self.max_in_flight - self._in_flight

    async def _receive(self, max_messages: int, stop: asyncio.Event) -> list[Pulled]:
        try:
            messages = await self.queue.receive(max_messages)
        except FatalQueueError:
            raise
        except Exception as exc:
            RECEIVE_ERRORS.labels(**self._labels).inc()
            delay = self.backoff.next()
            log.warning(
                "receive from %s failed (%s); retrying in %.1f s", self.queue.name, exc, delay
            )
            await sleep_unless(stop, delay)
            return []
        if messages:
            RECEIVED.labels(**self._labels).inc(len(messages))
        elif not self._kafka_failing:
            self.backoff.reset()
        return messages

    async def _release(self, messages: Sequence[Pulled]) -> None:
        try:
            await self.queue.release(messages)
        except Exception as exc:  # they come back after their visibility timeout instead
            log.warning("could not release %d messages at shutdown: %s", len(messages), exc)
        RELEASED.labels(**self._labels).inc(len(messages))

    def _start_batch(self, messages: list[Pulled]) -> None:
        self._in_flight += len(messages)
        IN_FLIGHT.labels(**self._labels).inc(len(messages))
        task = asyncio.ensure_future(self._settle(messages))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, messages: list[Pulled]) -> None:
        """Publish the batch, then delete exactly the messages Kafka acknowledged."""
        renewing = (
            asyncio.ensure_future(self._keep_leased(messages))
            if isinstance(self.queue, LeasedQueue)
            else None
        )
        try:
            try:
                errors = await asyncio.gather(*(self._publish(message) for message in messages))
            finally:
                if renewing is not None:
                    renewing.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await renewing
            acknowledged = [
                message for message, error in zip(messages, errors, strict=True) if error is None
            ]
            failed = [
                (message.delivery_id, error)
                for message, error in zip(messages, errors, strict=True)
                if error is not None
            ]
            if failed:
                self._kafka_failing = True
                shown = ", ".join(delivery_id for delivery_id, _ in failed[:5])
                log.warning(
                    "%d of %d messages from %s not acknowledged by Kafka (%s); left in the "
                    "queue for redelivery: message %s%s",
                    len(failed),
                    len(messages),
                    self.queue.name,
                    printable(failed[0][1]),
                    printable(shown),
                    f" and {len(failed) - 5} more" if len(failed) > 5 else "",
                )
            else:
                if self._kafka_failing:
                    log.info("Kafka acknowledges writes again")
                self._kafka_failing = False
                self.backoff.reset()
            if acknowledged:
                await self._delete(acknowledged)
        except Exception:  # a bug here must not kill the loop; the messages come back
            log.exception("settling a batch from %s failed", self.queue.name)
        finally:
            self._in_flight -= len(messages)
            IN_FLIGHT.labels(**self._labels).dec(len(messages))
            self._settled.set()

    async def _keep_leased(self, messages: Sequence[Pulled]) -> None:
        """Every half lease, extend the leases of the batch (cancelled once it is published)."""
        assert isinstance(self.queue, LeasedQueue)
        every_s = max(self.queue.lease_s / 2, 0.5)
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.queue.extend(messages)
            except Exception as exc:  # the lease runs out: a redelivery, a copy the stream drops
                log.warning(
                    "could not extend the lease of %d messages from %s: %s",
                    len(messages),
                    self.queue.name,
                    exc,
                )
                continue
            EXTENDED.labels(**self._labels).inc(len(messages))

    async def _publish(self, message: Pulled) -> str | None:
        """Publish one message; None once Kafka acknowledged it (or, too large for the raw
        topic, its dead letter), else what went wrong."""
        received = time.monotonic()
        headers = raw_headers(
            self.source,
            self.transport,
            attributes=message.attributes,
            delivery_id=message.delivery_id,
        )
        try:
            await self.publisher.publish(message.body, headers)
        except RecordTooLarge as exc:
            if self.dead_letters is None:
                PUBLISH_FAILURES.labels(**self._labels).inc()
                return str(exc)
            return await self._dead_letter(message, headers, str(exc))
        except PublishFailed as exc:
            PUBLISH_FAILURES.labels(**self._labels).inc()
            return str(exc)
        except Exception as exc:
            PUBLISH_FAILURES.labels(**self._labels).inc()
            log.exception("publishing message %r failed", message.delivery_id)
            return repr(exc)
        PUBLISHED.labels(**self._labels).inc()
        PUBLISH_SECONDS.labels(**self._labels).observe(time.monotonic() - received)
        return None

    async def _dead_letter(
        self, message: Pulled, headers: list[tuple[str, bytes]], reason: str
    ) -> str | None:
        """Write a message the raw topic cannot take, whole, to the dead-letter topic."""
        assert self.dead_letters is not None
        error = f"too large for the raw topic ({len(message.body)} bytes of data): {reason}"
        letter = [
            *headers,
            ("error", error.encode()[:4096]),
            ("error.stage", DEAD_LETTER_STAGE.encode()),
            ("error.topic", self.raw_topic.encode()),
        ]
        try:
            await self.dead_letters.publish(message.body, letter)
        except PublishFailed as exc:
            PUBLISH_FAILURES.labels(**self._labels).inc()
            return f"{reason}; its dead letter was not written either: {exc}"
        DEAD_LETTERED.labels(**self._labels).inc()
        log.error(
            "message %r from %s (%d bytes) is too large for the raw topic %s: written to the "
            "dead-letter topic (%s)",
            message.delivery_id,
            self.queue.name,
            len(message.body),
            self.raw_topic,
            reason,
        )
        return None

    async def _delete(self, acknowledged: list[Pulled]) -> None:
        """Delete messages Kafka holds; retry the call a few times, never more than these."""
        for attempt in range(1, DELETE_ATTEMPTS + 1):
            try:
                left = await self.queue.delete(acknowledged)
            except FatalQueueError as exc:
                left, error = list(acknowledged), str(exc)
            except Exception as exc:
                if attempt < DELETE_ATTEMPTS:
                    await asyncio.sleep(0.2 * 2**attempt)
                    continue
                left, error = list(acknowledged), str(exc)
            else:
                error = "the queue refused them"
            DELETED.labels(**self._labels).inc(len(acknowledged) - len(left))
            if left:
                DELETE_FAILURES.labels(**self._labels).inc(len(left))
                log.warning(
                    "%d published messages not deleted from %s (%s); they will be delivered "
                    "again and the stream drops the copies",
                    len(left),
                    self.queue.name,
                    error,
                )
            return


async def start_publisher(publisher: RawPublisher, stop: asyncio.Event) -> bool:
    """Start the publisher (it retries while Kafka is unreachable); False if stopped first."""
    starting = asyncio.ensure_future(publisher.start())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if starting.done():
        starting.result()
        return True
    starting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await starting
    await publisher.stop()
    return False


def fail(bridge: str, message: str) -> int:
    """Print the one-line error a bridge exits with; the exit code (EXIT_FATAL)."""
    print(f"connectors {bridge}: {message}", file=sys.stderr)
    return EXIT_FATAL


async def serve(
    bridge_name: str,
    bridge: PullBridge,
    publisher: RawPublisher,
    metrics_port: int | None = None,
    stop: asyncio.Event | None = None,
    metrics_host: str = "127.0.0.1",
    dead_letter_publisher: RawPublisher | None = None,
) -> int:
    """Run one pull bridge as a command; the exit code.

    Checks the queue first (a missing queue or bad credentials fail fast, whether Kafka is up
    or not: one line on stderr, exit 2), then connects to Kafka (retrying while it is
    unreachable), then loops until SIGINT or SIGTERM (exit 0 once the batches in flight are
    settled). `bridge.publisher` must be `publisher`, and `bridge.dead_letters`
    `dead_letter_publisher` (started and stopped with it).
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    queue = bridge.queue
    backoff = Backoff()
    while True:
        try:
            await queue.check()
            break
        except FatalQueueError as exc:
            return fail(bridge_name, str(exc))
        except QueueError as exc:
            delay = backoff.next()
            log.warning("cannot reach queue %s (%s); retrying in %.1f s", queue.name, exc, delay)
            await sleep_unless(stop, delay)
            if stop.is_set():
                return 0
    if metrics_port is not None:
        try:
            start_http_server(metrics_port, addr=metrics_host)
        except OSError as exc:
            reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
            return fail(
                bridge_name,
                f"cannot serve metrics on {metrics_host}:{metrics_port} ({reason}); set "
                "--metrics-port to a free port",
            )
    if not await start_publisher(publisher, stop):
        return 0
    if dead_letter_publisher is not None and not await start_publisher(dead_letter_publisher, stop):
        await publisher.stop()
        return 0
    log.info(
        "%s bridge: %s -> Kafka topic %s (source %s), up to %d messages in flight",
        bridge_name,
        queue.name,
        publisher.topic,
        bridge.source,
        bridge.max_in_flight,
    )
    try:
        await bridge.run(stop)
    except FatalQueueError as exc:
        return fail(bridge_name, str(exc))
    finally:
        await publisher.stop()
        if dead_letter_publisher is not None:
            await dead_letter_publisher.stop()
    log.info("%s bridge stopped", bridge_name)
    return 0
