"""Publish raw deliveries to Kafka and say, truthfully, whether Kafka holds them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    InvalidProducerIdMapping,
    KafkaError,
    OutOfOrderSequenceNumber,
    UnknownProducerId,
)
from aiokafka.partitioner import DefaultPartitioner

from streams.config import RAW_RECORD_FRAMING_BYTES
from streams.engine.topics import RAW_MAX_MESSAGE_BYTES
from streams.kafka_settings import KafkaAccessError, KafkaSettings, check_access

log = logging.getLogger(__name__)

# Never forwarded as `header.*`: they carry the credentials that admitted the delivery.
SECRET_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization", "x-api-key"})


RENEW_ON = (OutOfOrderSequenceNumber, UnknownProducerId, InvalidProducerIdMapping)
"""Errors after which an idempotent producer must be replaced, not merely retried: after a
broker restart aiokafka's idempotent producer can keep failing every send with one of these
(its producer id and sequence numbers no longer match the broker's)."""

RAW_RECORD_MAX_BYTES = RAW_MAX_MESSAGE_BYTES - RAW_RECORD_FRAMING_BYTES
"""Value + header bytes of the largest raw record a bridge writes: what the raw topic takes,
less Kafka's framing. The webhook's limits keep it there by configuration; a pulled message
larger than this (a Pub/Sub message may carry 10 MB) is refused before it is sent."""


HEALTH_WINDOW_S = 3.0
"""`kafka_ok()` is true while Kafka acknowledged a write or answered a metadata request
within this long."""
PROBE_EVERY_S = 1.0
"""Without a write acknowledged meanwhile, ask Kafka for metadata this often."""


class PublishFailed(Exception):
    """Kafka did not acknowledge the write in time; the provider must deliver again."""


class RecordTooLarge(PublishFailed):
    """The record is over what its topic takes (RAW_RECORD_MAX_BYTES for a raw topic): no retry
    can ever write it."""


def headers_size(headers: list[tuple[str, bytes]]) -> int:
    """Bytes of the header names and values of a record (what bounds it besides its value)."""
    return sum(len(name.encode("utf-8", errors="replace")) + len(value) for name, value in headers)


def raw_headers(
    source: str,
    transport: str,
    http_headers: Mapping[str, str] | None = None,
    attributes: Mapping[str, str] | None = None,
    delivery_id: str | None = None,
) -> list[tuple[str, bytes]]:
    """The raw-topic headers for one delivery (contract in streams.core.records)."""
    headers = [
        ("source", source.encode()),
        ("transport", transport.encode()),
        ("delivery-id", (delivery_id or uuid.uuid4().hex).encode()),
        ("received-at", f"{time.time():.6f}".encode()),
    ]
    for name, value in (http_headers or {}).items():
        if name.lower() not in SECRET_HEADERS:
            headers.append((f"header.{name.lower()}", value.encode("utf-8", errors="replace")))
    for name, value in (attributes or {}).items():
        headers.append((f"attribute.{name}", value.encode("utf-8", errors="replace")))
    return headers


class KeylessSticky:
    """Partitions as aiokafka's default does (murmur2 of the key, like the Java client),
    except for records without a key (the bridges' deliveries): instead of a random
    partition each, those of one time slice share a partition, and the next slice that has
    records takes the next partition. The records of one linger window then share a batch,
    so the producer sends fewer, fuller produce requests (the idea of Kafka's sticky
    partitioner, KIP-480), while the turns still spread the records evenly over the
    partitions whatever the arrival pattern."""

    SLICE_S = 0.005

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._default = DefaultPartitioner()
        self._slice = 0
        self._turn = 0

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        if key is not None:
            partition: int = self._default(key, all_partitions, available)
            return partition
        now = int(self._clock() / self.SLICE_S)
        if now != self._slice:
            self._slice = now
            self._turn += 1
        choices = sorted(available) if available else all_partitions
        return choices[self._turn % len(choices)]


def producer_settings(
    kafka: KafkaSettings | str, timeout_s: float, max_request_size: int = RAW_MAX_MESSAGE_BYTES
) -> dict[str, Any]:
    """The bridges' producer: idempotent, acks=all, records as large as the raw topic allows,
    a request timeout as long as a delivery may wait (benchmarks.webhook builds its bare
    handler's producer from this too); connected as `kafka` says (TLS, SASL)."""
    return {
        **KafkaSettings.of(kafka).aiokafka_args(),
        "client_id": "storage-events-bridge",
        "acks": "all",
        "max_request_size": max_request_size,
        "enable_idempotence": True,
        "linger_ms": 2,
        "partitioner": KeylessSticky(),
        "request_timeout_ms": int(timeout_s * 1000),
    }


def _retrieve_exception(future: asyncio.Future[object]) -> None:
    if not future.cancelled():
        future.exception()


class RawPublisher:
    """An idempotent producer (acks=all) whose `publish` returns only once Kafka has the record.

    `max_record_bytes` (value, key and headers) is what `topic` takes less Kafka's framing:
    RAW_RECORD_MAX_BYTES for a raw topic; a pull bridge's dead-letter publisher takes more."""

    def __init__(
        self,
        kafka: KafkaSettings | str,
        topic: str,
        timeout_s: float,
        max_record_bytes: int = RAW_RECORD_MAX_BYTES,
    ) -> None:
        self.topic = topic
        self.timeout_s = timeout_s
        self.max_record_bytes = max_record_bytes
        self.kafka = KafkaSettings.of(kafka)
        self.bootstrap_servers = self.kafka.bootstrap_servers
        self._producer: AIOKafkaProducer | None = None
        self._renewal: asyncio.Task[None] | None = None
        self._probe: asyncio.Task[None] | None = None
        self._answered_at: float | None = None
        """When Kafka last acknowledged a write or answered a metadata request (monotonic)."""

    def kafka_ok(self, now: float | None = None) -> bool:
        """Whether Kafka answered this producer within HEALTH_WINDOW_S: what `/healthz` says,
        now (not whether it connected once)."""
        now = time.monotonic() if now is None else now
        return self._answered_at is not None and now - self._answered_at < HEALTH_WINDOW_S

    async def _probe_kafka(self) -> None:
        """Every PROBE_EVERY_S without an acknowledged write, refresh the producer's metadata
        (one small request to a broker); a success counts as an answer from Kafka."""
        while True:
            await asyncio.sleep(PROBE_EVERY_S)
            producer = self._producer
            if producer is None:
                continue
            if self._answered_at is not None and (
                time.monotonic() - self._answered_at < PROBE_EVERY_S
            ):
                continue
            try:
                async with asyncio.timeout(HEALTH_WINDOW_S):
                    answered = await producer.client.force_metadata_update()
            except (KafkaError, TimeoutError, OSError):
                answered = False
            if answered:
                self._answered_at = time.monotonic()

    async def start(self) -> None:
        """Connect, retrying while Kafka is unreachable; raise KafkaAccessError (one line
        naming the setting) when it refuses the credentials or its certificate is not
        trusted: waiting would not change that."""
        problem = await check_access(self.kafka)  # before the producer logs its own lines
        if problem is not None and problem[1]:
            raise KafkaAccessError(problem[0])
        delay = 0.5
        while True:
            # aiokafka binds a producer to the running loop: make it here, not in __init__.
            self._producer = AIOKafkaProducer(
                **producer_settings(
                    self.kafka,
                    self.timeout_s,
                    max(RAW_MAX_MESSAGE_BYTES, self.max_record_bytes + RAW_RECORD_FRAMING_BYTES),
                )
            )
            try:
                await self._producer.start()
            except KafkaError as exc:
                with contextlib.suppress(Exception):  # it never connected: nothing to flush
                    await self._producer.stop()
                problem = await check_access(self.kafka)
                if problem is not None and problem[1]:
                    raise KafkaAccessError(problem[0]) from None
                why = problem[0] if problem is not None else repr(exc)
                log.warning("bridge cannot reach Kafka (%s); retrying in %.1f s", why, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self._answered_at = time.monotonic()
            if self._probe is None or self._probe.done():
                self._probe = asyncio.get_running_loop().create_task(self._probe_kafka())
            return

    async def stop(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
        if self._renewal is not None:
            self._renewal.cancel()
        if self._producer is not None:
            await self._producer.stop()

    async def publish(
        self, value: bytes, headers: list[tuple[str, bytes]], key: bytes | None = None
    ) -> None:
        """Write one record; raise PublishFailed unless Kafka acknowledged it in time."""
        size = len(value) + headers_size(headers) + len(key or b"")
        if size > self.max_record_bytes:
            raise RecordTooLarge(
                f"a record of {size} bytes (value, key and headers) is over the "
                f"{self.max_record_bytes} that topic {self.topic} takes"
            )
        if self._producer is None:
            raise PublishFailed("the publisher is not started")
        try:
            # asyncio.timeout, not wait_for: no task of its own per write (the hot path).
            async with asyncio.timeout(self.timeout_s):
                future = await self._producer.send(self.topic, value, key=key, headers=headers)
            # shield: a timed-out answer must not cancel the write itself; if it lands later,
            # the provider's retry becomes a duplicate the stream drops by id.
            # A write that fails after its answer timed out is only logged by the retry.
            future.add_done_callback(_retrieve_exception)
            async with asyncio.timeout(self.timeout_s):
                await asyncio.shield(future)
            self._answered_at = time.monotonic()
        except (KafkaError, TimeoutError) as exc:
            if isinstance(exc, RENEW_ON):
                self._renew_in_background()
            raise PublishFailed(f"Kafka did not acknowledge the write: {exc!r}") from exc

    def _renew_in_background(self) -> None:
        """Replace a producer whose idempotence state the broker no longer accepts (after a
        broker restart aiokafka can fail every later send with OutOfOrderSequenceNumber).
        Until the new one is connected, deliveries get 503."""
        if self._renewal is not None and not self._renewal.done():
            return
        old, self._producer = self._producer, None

        async def renew() -> None:
            log.warning("renewing the Kafka producer after a producer-state error")
            if old is not None:
                with contextlib.suppress(KafkaError):
                    await old.stop()
            await self.start()

        self._renewal = asyncio.get_running_loop().create_task(renew())
