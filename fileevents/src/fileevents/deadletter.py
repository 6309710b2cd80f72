"""The dead-letter topic: where a record goes when it is not an event or its handlers keep
failing.

The write must not fail because of what the record holds, or the partition would retry it
forever: the record's own key, value and headers are written back as the bytes that were
read (never decoded and encoded again), every header this module adds is encoded so that
no string can make it raise and is bounded in length, and a record too large for the
dead-letter topic once these headers are added is written without its own key, value and
headers, which stay on the original topic at the offset the headers name.
"""

from __future__ import annotations

import logging

from aiokafka import AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError, RecordListTooLargeError
from aiokafka.structs import ConsumerRecord

from fileevents.codec import UnreadableRecord
from fileevents.context import EventContext

logger = logging.getLogger("fileevents")

MAX_HEADER_TEXT_BYTES = 4096
"""The longest `error` (or `handler`, `group`) header this module writes, in bytes."""
MAX_OMITTED_KEY_BYTES = 1024
"""How much of the key a dead letter keeps when the record had to be written without its
bytes (so a compacted dead-letter topic still gets a key, and one of bounded size)."""
_ELLIPSIS = "…".encode()


def header_text(text: str, limit: int = MAX_HEADER_TEXT_BYTES) -> bytes:
    """`text` as UTF-8 that cannot fail: a lone surrogate becomes its `\\udxxx` escape, and
    past `limit` bytes the text is cut on a character boundary and ends with `…`."""
    encoded = text[: limit + 1].encode("utf-8", errors="backslashreplace")
    if len(encoded) <= limit:
        return encoded
    kept = encoded[: limit - len(_ELLIPSIS)].decode("utf-8", errors="ignore")
    return kept.encode() + _ELLIPSIS


def describe(error: BaseException) -> str:
    """`ExceptionType: message`, even for an exception whose `str()` raises."""
    try:
        message = str(error)
    except Exception as exc:
        message = f"<str() of the exception raised {type(exc).__name__}>"
    return f"{type(error).__name__}: {message}"


def dead_letter_headers(
    context: EventContext, handler: str, error: BaseException, attempts: int
) -> list[tuple[str, bytes]]:
    """What went wrong and where the record came from (the original headers go first)."""
    return [
        ("error", header_text(describe(error))),
        ("handler", header_text(handler)),
        ("attempts", str(attempts).encode()),
        ("group", header_text(context.group_id)),
        ("original.topic", header_text(context.topic)),
        ("original.partition", str(context.partition).encode()),
        ("original.offset", str(context.offset).encode()),
    ]


class DeadLetterWriter:
    """Writes failed records, bytes unchanged, through an idempotent `acks=all` producer."""

    def __init__(self, producer: AIOKafkaProducer, topic: str) -> None:
        self.topic = topic
        self._producer = producer

    async def send(
        self,
        record: ConsumerRecord[bytes, bytes],
        context: EventContext,
        handler: str,
        error: BaseException,
        attempts: int,
    ) -> None:
        """Return only once Kafka acknowledged the dead letter; raise otherwise.

        The dead letter is `record`'s key, value and headers as read, then the headers of
        `dead_letter_headers`. When Kafka (or the producer's `max_request_size`) refuses it
        as too large, it is written again without the record's bytes: an empty value, the
        key cut to `MAX_OMITTED_KEY_BYTES`, and `dead-letter.omitted` plus the sizes of what
        was left out, so the original can be read at `original.offset` while it is retained.
        """
        ours = dead_letter_headers(context, handler, error, attempts)
        original_headers: list[tuple[str, bytes | None]] = list(record.headers)
        if isinstance(record, UnreadableRecord):
            await self._producer.send_and_wait(
                self.topic,
                value=b"",
                headers=[
                    *ours,
                    ("dead-letter.omitted", b"key,value,headers"),
                    ("original.first-offset", str(record.first_offset).encode()),
                ],
            )
            return
        try:
            await self._producer.send_and_wait(
                self.topic, value=record.value, key=record.key, headers=[*original_headers, *ours]
            )
            return
        except (MessageSizeTooLargeError, RecordListTooLargeError) as exc:
            logger.warning(
                "dead letter of %s[%d]@%d too large (%s): writing it without the record's bytes",
                context.topic,
                context.partition,
                context.offset,
                exc,
            )
        key, value = record.key, record.value
        await self._producer.send_and_wait(
            self.topic,
            value=b"",
            key=None if key is None else key[:MAX_OMITTED_KEY_BYTES],
            headers=[
                *ours,
                ("dead-letter.omitted", b"key,value,headers"),
                ("original.key-bytes", str(-1 if key is None else len(key)).encode()),
                ("original.value-bytes", str(-1 if value is None else len(value)).encode()),
                ("original.header-count", str(len(original_headers)).encode()),
            ],
        )
