"""The dead-letter topic: where an event goes when its handlers keep failing."""

from __future__ import annotations

from aiokafka import AIOKafkaProducer

from fileevents.context import EventContext


def dead_letter_headers(
    context: EventContext, handler: str, error: BaseException, attempts: int
) -> list[tuple[str, bytes]]:
    """The original headers, then what went wrong and where the record came from."""
    return [
        *context.headers,
        ("error", f"{type(error).__name__}: {error}".encode()),
        ("handler", handler.encode()),
        ("attempts", str(attempts).encode()),
        ("group", context.group_id.encode()),
        ("original.topic", context.topic.encode()),
        ("original.partition", str(context.partition).encode()),
        ("original.offset", str(context.offset).encode()),
    ]


class DeadLetterWriter:
    """Writes failed records, bytes unchanged, through an idempotent `acks=all` producer."""

    def __init__(self, producer: AIOKafkaProducer, topic: str) -> None:
        self.topic = topic
        self._producer = producer

    async def send(
        self, context: EventContext, handler: str, error: BaseException, attempts: int
    ) -> None:
        """Return only once Kafka acknowledged the record; raise otherwise."""
        await self._producer.send_and_wait(
            self.topic,
            value=context.value,
            key=None if context.key is None else context.key.encode("utf-8", "surrogateescape"),
            headers=dead_letter_headers(context, handler, error, attempts),
        )
