"""Dedupe stores: remember which events a consumer group has fully handled, for a while.

The library asks whether the store holds an event's id before running its handlers and
records it once they all succeeded; an event that failed is never recorded, so a
redelivery runs it again. It asks in batches: the events running at once (up to
`max_concurrency`) are looked up together (`has_many`) and recorded together (`add_many`),
one round trip each for a Redis store, every id still its own conditional write. The
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
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from fileevents.errors import WAIT_TIMEOUT
from fileevents.event import FileEvent, scope

if TYPE_CHECKING:  # redis is the `fileevents[redis]` extra: imported by RedisDedupeStore only
    from redis.asyncio import Redis, RedisCluster

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


@runtime_checkable
class DedupeStore(Protocol):
    """What `FileEvents(dedupe=...)` needs: a set of ids whose members expire, read and
    written many ids at a time."""

    async def has_many(self, event_ids: Sequence[str]) -> list[bool]:
        """For each id, in order: True when it was added and has not expired yet."""
        ...

    async def add_many(self, event_ids: Sequence[str], ttl: timedelta) -> None:
        """Remember each id for `ttl`; adding an id already present changes nothing (a
        conditional write per id: it neither rewrites it nor lengthens its TTL)."""
        ...


class PerIdDedupeStore(Protocol):
    """The store interface before batches (`has(id)`, `add(id, ttl)`): still accepted,
    asked one id at a time (concurrently, for the events running at once)."""

    async def has(self, event_id: str) -> bool: ...

    async def add(self, event_id: str, ttl: timedelta) -> None: ...


AnyDedupeStore = DedupeStore | PerIdDedupeStore
"""What `FileEvents(dedupe=...)` takes."""

Exchange = Callable[[Sequence[str], Sequence[str], timedelta], Awaitable[list[bool]]]
"""Record the first ids, then look the second up, in one round trip (`exchange()` of a
store that can)."""


class _PerIdAdapter:
    """A `PerIdDedupeStore` as a `DedupeStore`: the ids of a batch asked concurrently."""

    def __init__(self, store: PerIdDedupeStore) -> None:
        self.store = store

    async def has_many(self, event_ids: Sequence[str]) -> list[bool]:
        return list(await asyncio.gather(*(self.store.has(one) for one in event_ids)))

    async def add_many(self, event_ids: Sequence[str], ttl: timedelta) -> None:
        await asyncio.gather(*(self.store.add(one, ttl) for one in event_ids))


def batching(store: AnyDedupeStore) -> DedupeStore:
    """`store` as the batch interface (adapted when it has only `has` and `add`)."""
    if isinstance(store, DedupeStore):
        return store
    if callable(getattr(store, "has", None)) and callable(getattr(store, "add", None)):
        return _PerIdAdapter(store)
    raise TypeError(
        f"dedupe={type(store).__name__}: a dedupe store has async has_many(ids) and "
        "add_many(ids, ttl) (fileevents.DedupeStore), or async has(id) and add(id, ttl)"
    )


class DedupeBatcher:
    """Gathers the lookups and records of the events running at once into one `has_many`
    and one `add_many` each: a request waits at most until the event loop's next turn.
    A store with `exchange(records, lookups, ttl)` (`RedisDedupeStore` on one Redis) gets
    both in one call: one round trip for the records and the lookups of a turn.

    A failed batch fails each of its requests (the processor retries each, and those
    retries batch again)."""

    def __init__(self, store: AnyDedupeStore, ttl: timedelta, max_batch: int = 512) -> None:
        self.store = batching(store)
        self.in_process = isinstance(store, MemoryDedupeStore)
        """An in-process store answers at once: nothing to gather, asked directly."""
        self._ttl = ttl
        self._max_batch = max_batch
        self._lookups: list[tuple[tuple[str, ...], asyncio.Future[bool]]] = []
        self._records: list[tuple[str, asyncio.Future[None]]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._flushing = False
        exchange = getattr(self.store, "exchange", None)
        self._exchange: Exchange | None = exchange() if callable(exchange) else None

    def seen(self, *event_ids: str) -> Awaitable[bool]:
        """True when the store holds any of `event_ids` (one event's id, and within the
        upgrade window its id before scopes)."""
        if self.in_process:
            return self._seen_now(event_ids)
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._soon()
        self._lookups.append((event_ids, future))
        return future

    def record(self, event_id: str) -> Awaitable[None]:
        """Done once the store holds `event_id` (for the TTL)."""
        if self.in_process:
            return self.store.add_many((event_id,), self._ttl)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._soon()
        self._records.append((event_id, future))
        return future

    async def _seen_now(self, event_ids: tuple[str, ...]) -> bool:
        return any(await self.store.has_many(event_ids))

    def _soon(self) -> None:
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        records, self._records = self._records, []
        lookups, self._lookups = self._lookups, []
        size = self._max_batch
        if self._exchange is not None and len(records) <= size and len(lookups) <= size:
            self._spawn(self._exchanged(self._exchange, records, lookups))
            return
        for start in range(0, len(lookups), size):
            self._spawn(self._look_up(lookups[start : start + size]))
        for start in range(0, len(records), size):
            self._spawn(self._record(records[start : start + size]))

    async def _exchanged(
        self,
        exchange: Exchange,
        records: list[tuple[str, asyncio.Future[None]]],
        lookups: list[tuple[tuple[str, ...], asyncio.Future[bool]]],
    ) -> None:
        ids = [one for event_ids, _ in lookups for one in event_ids]
        try:
            found = await exchange([event_id for event_id, _ in records], ids, self._ttl)
            if len(found) != len(ids):
                raise RuntimeError(f"the store answered {len(found)} of {len(ids)} lookups")
        except Exception as exc:
            for _, pending in records:
                if not pending.done():
                    pending.set_exception(exc)
            for _, future in lookups:
                if not future.done():
                    future.set_exception(exc)
            return
        for _, done in records:
            if not done.done():
                done.set_result(None)
        self._answer(lookups, found)

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)  # held until done: the loop keeps weak references only
        task.add_done_callback(self._tasks.discard)

    async def _look_up(self, batch: list[tuple[tuple[str, ...], asyncio.Future[bool]]]) -> None:
        ids = [one for event_ids, _ in batch for one in event_ids]
        try:
            found = await self.store.has_many(ids)
            if len(found) != len(ids):
                raise RuntimeError(
                    f"{type(self.store).__name__}.has_many answered {len(found)} of {len(ids)}"
                )
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        self._answer(batch, found)

    @staticmethod
    def _answer(
        batch: list[tuple[tuple[str, ...], asyncio.Future[bool]]], found: Sequence[bool]
    ) -> None:
        at = 0
        for event_ids, future in batch:
            hit = any(found[at : at + len(event_ids)])
            at += len(event_ids)
            if not future.done():
                future.set_result(hit)

    async def _record(self, batch: list[tuple[str, asyncio.Future[None]]]) -> None:
        try:
            await self.store.add_many([event_id for event_id, _ in batch], self._ttl)
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for _, future in batch:
            if not future.done():
                future.set_result(None)


class DedupeStoreUnavailable(ConnectionError):
    """The dedupe store did not answer when `FileEvents.run()` started: it stops before
    consuming anything (one line saying which store and why), instead of retrying the
    first event's lookup for ever."""


START_UP_CHECK_S = 10.0
"""How long the start-up check waits for the store's answer."""


def store_name(store: AnyDedupeStore) -> str:
    """The store as a log line names it: its class, and for Redis where it connects."""
    if isinstance(store, _PerIdAdapter):
        return store_name(store.store)
    name = type(store).__name__
    client = getattr(store, "_redis", None)
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    if "host" in kwargs:
        return f"{name} at {kwargs['host']}:{kwargs.get('port', 6379)}"
    if "path" in kwargs:
        return f"{name} at {kwargs['path']}"
    return name


async def check_store(store: AnyDedupeStore, timeout_s: float = START_UP_CHECK_S) -> None:
    """One lookup, as the first events would make it; `DedupeStoreUnavailable` when it fails
    or takes longer than `timeout_s`."""
    try:
        lookup = batching(store).has_many(["fileevents:start-up-check"])
        await asyncio.wait_for(lookup, timeout_s)
    except Exception as exc:
        reason = (
            f"no answer within {timeout_s:g} s"
            if isinstance(exc, WAIT_TIMEOUT)
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

    Expired ids are dropped as they are looked up and in a sweep every 1,024 adds (once one
    may have expired), so memory stays bounded by the ids added within one TTL.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._expiry: dict[str, float] = {}
        self._adds = 0
        self._soonest = float("inf")
        """No id held expires before this: a sweep before it would find nothing to drop
        (and copying every id each 1,024 adds cost ~10 µs per add at 100,000 ids held)."""

    async def has(self, event_id: str) -> bool:
        expiry = self._expiry.get(event_id)
        if expiry is None:
            return False
        if expiry <= self._clock():
            del self._expiry[event_id]
            return False
        return True

    async def add(self, event_id: str, ttl: timedelta) -> None:
        await self.add_many((event_id,), ttl)

    async def has_many(self, event_ids: Sequence[str]) -> list[bool]:
        now = self._clock()
        expiry = self._expiry
        found = []
        for event_id in event_ids:
            at = expiry.get(event_id)
            if at is not None and at <= now:
                del expiry[event_id]
                at = None
            found.append(at is not None)
        return found

    async def add_many(self, event_ids: Sequence[str], ttl: timedelta) -> None:
        now = self._clock()
        until = now + ttl_ms(ttl) / 1000
        expiry = self._expiry
        if until < self._soonest:
            self._soonest = until
        for event_id in event_ids:
            if expiry.get(event_id, 0.0) <= now:
                expiry[event_id] = until
            self._adds += 1
            if self._adds % _SWEEP_EVERY == 0 and self._soonest <= now:
                self._expiry = expiry = {key: at for key, at in expiry.items() if at > now}
                self._soonest = min(expiry.values(), default=float("inf"))

    def __len__(self) -> int:
        """How many ids are held, expired ones not swept yet included."""
        return len(self._expiry)


_EXCHANGE = """
local recorded = tonumber(ARGV[2])
for i = 1, recorded do
    redis.call('SET', KEYS[i], '1', 'PX', ARGV[1], 'NX')
end
local found = {}
for i = recorded + 1, #KEYS do
    found[#found + 1] = redis.call('EXISTS', KEYS[i])
end
return found
"""
"""Records (a conditional write per id), then lookups, in one command on one Redis."""

_ADD_MANY = """
for _, key in ipairs(KEYS) do
    redis.call('SET', key, '1', 'PX', ARGV[1], 'NX')
end
return #KEYS
"""
"""`add_many` on one Redis: a conditional write per id, in one command."""


class RedisDedupeStore:
    """Ids as Redis keys with a TTL (`SET <prefix><id> 1 PX <ttl> NX`), via `redis.asyncio`.

    Redis expires them itself, so the store stays bounded by the TTL. Several consumers
    (processes, hosts) of one group share what they handled through it. A batch is one
    command on one Redis: `MGET` to look ids up, a script running `SET ... PX ... NX` per
    id to record them (each id still its own conditional write); on a `RedisCluster`,
    whose keys of one batch live on many nodes, a pipeline of `EXISTS` / `SET NX` instead
    (no MULTI; redis-py splits it per node).
    """

    def __init__(self, redis: Redis | RedisCluster, prefix: str = "fileevents:seen:") -> None:
        """`redis` is a `redis.asyncio` client; opening and closing it is up to you."""
        from redis.asyncio import Redis  # the [redis] extra, there when a client is given

        self._redis = redis
        self._single = isinstance(redis, Redis)
        self._prefix = prefix
        single = self._single
        self._add_many = redis.register_script(_ADD_MANY) if single else None
        self._exchange = redis.register_script(_EXCHANGE) if single else None

    def exchange(self) -> Exchange | None:
        """On one Redis (not a cluster): record some ids and look others up in one
        command (the records first), for `DedupeBatcher`."""
        script = self._exchange
        if script is None:
            return None
        prefix = self._prefix

        async def exchange(
            records: Sequence[str], lookups: Sequence[str], ttl: timedelta
        ) -> list[bool]:
            keys = [prefix + event_id for event_id in records]
            keys.extend(prefix + event_id for event_id in lookups)
            found = await script(keys=keys, args=[ttl_ms(ttl), len(records)])
            return [bool(one) for one in found]

        return exchange

    def redis_key(self, event_id: str) -> str:
        """The Redis key that records `event_id`."""
        return self._prefix + event_id

    async def has(self, event_id: str) -> bool:
        return bool(await self._redis.exists(self.redis_key(event_id)))

    async def add(self, event_id: str, ttl: timedelta) -> None:
        # NX: a second add neither rewrites the value nor extends the first one's TTL.
        await self._redis.set(self.redis_key(event_id), b"1", px=ttl_ms(ttl), nx=True)

    async def has_many(self, event_ids: Sequence[str]) -> list[bool]:
        if not event_ids:
            return []
        prefix = self._prefix
        if self._single:
            found = await self._redis.mget([prefix + event_id for event_id in event_ids])
            return [value is not None for value in found]
        pipeline = self._redis.pipeline(transaction=False)
        for event_id in event_ids:
            pipeline.exists(self._prefix + event_id)
        return [bool(found) for found in await pipeline.execute()]

    async def add_many(self, event_ids: Sequence[str], ttl: timedelta) -> None:
        if not event_ids:
            return
        milliseconds = ttl_ms(ttl)
        if self._add_many is not None:
            keys = [self._prefix + event_id for event_id in event_ids]
            await self._add_many(keys=keys, args=[milliseconds])
            return
        pipeline = self._redis.pipeline(transaction=False)
        for event_id in event_ids:
            pipeline.set(self._prefix + event_id, b"1", px=milliseconds, nx=True)
        await pipeline.execute()
