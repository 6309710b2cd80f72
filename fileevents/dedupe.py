"""Dedupe stores: remember which events a consumer group has fully handled, for a while.

The library asks `has(id)` before running an event's handlers and calls `add(id, ttl)` once
they all succeeded; an event that failed is never added, so a redelivery runs it again. The
id it passes is `<group_id>|<scope>|<event.id>` (`dedupe_id`): groups sharing one store never
skip each other's events, and one provider's ids never meet another's. The scope is the one
the stream dedupes in (streams.core.ordering `scope`: the provider, narrowed to the Azure
storage account or the AWS partition; a `reconcile` event's is `reconcile`), so a B2
`eventId` equal to a GCS change's id cannot make that change a duplicate here either.

Before scopes the id was `<group_id>:<event.id>` (`legacy_dedupe_id`). Nothing writes that
form any more; for `dedupe_legacy_window` (default: the dedupe TTL) after `run()` starts, an
id missing under its scoped key is also looked up under the old one, so a redelivery of an
event handled before the upgrade is still a duplicate (fileevents/README.md, "Upgrading").
See fileevents/README.md for the has-then-add race and its alternative.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Protocol

from redis.asyncio import Redis, RedisCluster

from streams.core.event import FileEvent
from streams.core.ordering import scope

_SWEEP_EVERY = 1024


def dedupe_id(group_id: str, event: FileEvent) -> str:
    """The id the store sees for `event` handled by `group_id`: `<group_id>|<scope>|<id>`.

    A scope holds no `|` (nor `:`), so within one group no two (scope, id) share an id, and
    none has the form before scopes (`<group_id>:...`)."""
    return f"{group_id}|{scope(event)}|{event.id}"


def legacy_dedupe_id(group_id: str, event: FileEvent) -> str:
    """The id the store saw for `event` before scopes: `<group_id>:<event.id>`, whatever
    provider issued it. Read during the upgrade window only, never written."""
    return f"{group_id}:{event.id}"


class DedupeStore(Protocol):
    """What `FileEvents(dedupe=...)` needs: a set of ids whose members expire."""

    async def has(self, event_id: str) -> bool:
        """True when `event_id` was added and has not expired yet."""
        ...

    async def add(self, event_id: str, ttl: timedelta) -> None:
        """Remember `event_id` for `ttl`; adding an id already present changes nothing."""
        ...


class DedupeStoreUnavailable(ConnectionError):
    """The dedupe store did not answer when `FileEvents.run()` started: it stops before
    consuming anything (one line saying which store and why), instead of retrying the
    first event's lookup for ever."""


START_UP_CHECK_S = 10.0
"""How long the start-up check waits for the store's answer."""


def store_name(store: DedupeStore) -> str:
    """The store as a log line names it: its class, and for Redis where it connects."""
    name = type(store).__name__
    client = getattr(store, "_redis", None)
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    if "host" in kwargs:
        return f"{name} at {kwargs['host']}:{kwargs.get('port', 6379)}"
    if "path" in kwargs:
        return f"{name} at {kwargs['path']}"
    return name


async def check_store(store: DedupeStore, timeout_s: float = START_UP_CHECK_S) -> None:
    """One lookup, as the first event would make it; `DedupeStoreUnavailable` when it fails
    or takes longer than `timeout_s`."""
    try:
        await asyncio.wait_for(store.has("fileevents:start-up-check"), timeout_s)
    except Exception as exc:
        reason = (
            f"no answer within {timeout_s:g} s"
            if isinstance(exc, TimeoutError)
            else (f"{type(exc).__name__}: {exc}")
        )
        raise DedupeStoreUnavailable(
            f"the dedupe store ({store_name(store)}) does not answer: {reason}; start it, or "
            "run without one (FileEvents(dedupe=None)) or with MemoryDedupeStore() locally"
        ) from None


def ttl_ms(ttl: timedelta) -> int:
    """A TTL in whole milliseconds, at least 1 (Redis refuses 0)."""
    if ttl <= timedelta(0):
        raise ValueError(f"a dedupe TTL must be positive, got {ttl}")
    return max(1, int(ttl / timedelta(milliseconds=1)))


class MemoryDedupeStore:
    """In-process store, for tests and single-process tools: forgotten on exit.

    Expired ids are dropped as they are looked up and in a sweep every 1,024 adds, so
    memory stays bounded by the ids added within one TTL.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._expiry: dict[str, float] = {}
        self._adds = 0

    async def has(self, event_id: str) -> bool:
        expiry = self._expiry.get(event_id)
        if expiry is None:
            return False
        if expiry <= self._clock():
            del self._expiry[event_id]
            return False
        return True

    async def add(self, event_id: str, ttl: timedelta) -> None:
        now = self._clock()
        if self._expiry.get(event_id, 0.0) <= now:
            self._expiry[event_id] = now + ttl_ms(ttl) / 1000
        self._adds += 1
        if self._adds % _SWEEP_EVERY == 0:
            self._expiry = {key: at for key, at in self._expiry.items() if at > now}

    def __len__(self) -> int:
        """How many ids are held, expired ones not swept yet included."""
        return len(self._expiry)


class RedisDedupeStore:
    """Ids as Redis keys with a TTL (`SET <prefix><id> 1 PX <ttl> NX`), via `redis.asyncio`.

    Redis expires them itself, so the store stays bounded by the TTL. Several consumers
    (processes, hosts) of one group share what they handled through it.
    """

    def __init__(self, redis: Redis | RedisCluster, prefix: str = "fileevents:seen:") -> None:
        """`redis` is a `redis.asyncio` client; opening and closing it is up to you."""
        self._redis = redis
        self._prefix = prefix

    def redis_key(self, event_id: str) -> str:
        """The Redis key that records `event_id`."""
        return self._prefix + event_id

    async def has(self, event_id: str) -> bool:
        return bool(await self._redis.exists(self.redis_key(event_id)))

    async def add(self, event_id: str, ttl: timedelta) -> None:
        # NX: a second add neither rewrites the value nor extends the first one's TTL.
        await self._redis.set(self.redis_key(event_id), b"1", px=ttl_ms(ttl), nx=True)
