"""Errors after which an idempotent producer must be replaced, not merely retried.

After a broker restart aiokafka's idempotent producer can keep failing every send with one of
these (its producer id and sequence numbers no longer match the broker's); only a new
producer recovers. The stream's sender and the bridges' publisher both act on this list.
"""

from __future__ import annotations

from aiokafka.errors import InvalidProducerIdMapping, OutOfOrderSequenceNumber, UnknownProducerId

RENEW_ON = (OutOfOrderSequenceNumber, UnknownProducerId, InvalidProducerIdMapping)
