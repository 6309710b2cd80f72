"""Fixtures of the consumer-library tests: the session's real Redis server."""

from support.redis_server import redis_server

__all__ = ["redis_server"]
