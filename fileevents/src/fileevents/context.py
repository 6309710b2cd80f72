"""Where an event came from: the Kafka record behind it, for handlers that want it."""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka.structs import ConsumerRecord


@dataclass(frozen=True)
class EventContext:
    """The Kafka metadata of one event, passed as a handler's optional second argument."""

    topic: str
    partition: int
    offset: int
    key: str | None
    """The record key: the object key, as the stream writes it."""
    value: bytes | None
    """The record value exactly as read (the canonical event's JSON)."""
    headers: tuple[tuple[str, bytes], ...]
    """Every record header in order (CloudEvents `ce_id`, `ce_type`, `ce_source`, ...)."""
    timestamp_ms: int
    group_id: str
    attempt: int = 1
    """1 on the first run of the event's handlers, 2 on the first retry, and so on."""

    def header(self, name: str) -> str | None:
        """The last header called `name`, decoded as UTF-8, or None."""
        found = None
        for header_name, value in self.headers:
            if header_name == name:
                found = value
        return None if found is None else found.decode("utf-8", errors="replace")

    @classmethod
    def of(
        cls, record: ConsumerRecord[bytes, bytes], group_id: str, attempt: int = 1
    ) -> EventContext:
        """The context of a record just read, whatever it holds: never raises.

        Handlers only see records whose key is UTF-8 and whose headers all have a value
        (fileevents.codec refuses the others), so for them this is exactly what was read.
        For a malformed record, which only `on_error` sees, a key that is not UTF-8 has
        U+FFFD where its bytes were not, and a null header value reads as `b""`; the
        dead-letter topic gets the record itself, unchanged.
        """
        key = record.key
        return cls(
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            key=None if key is None else key.decode("utf-8", errors="replace"),
            value=record.value,
            headers=tuple(
                (name, b"" if value is None else bytes(value)) for name, value in record.headers
            ),
            timestamp_ms=record.timestamp,
            group_id=group_id,
            attempt=attempt,
        )
