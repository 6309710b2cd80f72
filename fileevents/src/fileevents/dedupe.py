"""Dedupe stores: remember which events a consumer group has fully handled, for a while.

The library asks whether the store holds an event's id before running its handlers and
records it once they all succeeded; an event that failed is never recorded, so a
redelivery runs it again. It asks in batches (`DedupeBatcher`): the events of a fetched
batch are looked up together before they start (`has_many`), and the ids of handled events
written together (`add_many`), every id still its own conditional write; an event is done
with (its offset may be committed) once its id's write is acknowledged. A Redis store gets
the writes and lookups of one exchange in one command. The id it passes is
`<group_id>|<scope>|<event.id>` (`dedupe_id`): groups sharing one store never skip each
other's events, and one provider's ids never meet another's. The scope is the one
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

import msgspec

from fileevents.errors import WAIT_TIMEOUT
from fileevents.event import Scoped, scope

if TYPE_CHECKING:  # redis is the `fileevents[redis]` extra: imported by RedisDedupeStore only
    from redis.asyncio import Redis, RedisCluster

_SWEEP_EVERY = 1024
_json = msgspec.json.Encoder().encode
_FOUND = ord("1")


class Identified(Scoped, Protocol):
    """What `dedupe_id` reads of an event: a `FileEvent`, or its `codec.Identity`."""

    @property
    def id(self) -> str: ...


def dedupe_id(group_id: str, event: Identified) -> str:
    """The id the store sees for `event` handled by `group_id`: `<group_id>|<scope>|<id>`.

    A scope holds no `|` (nor `:`), so within one group no two (scope, id) share an id, and
    none has the form before scopes (`<group_id>:...`)."""
    return f"{group_id}|{scope(event)}|{event.id}"


def legacy_dedupe_id(group_id: str, event: Identified) -> str:
    """The id the store saw for `event` before scopes: `<group_id>:<event.id>`, whatever
    provider issued it. Read during the upgrade window only, never written."""
    return f"{group_id}:{event.id}"


@runtime_checkable
class DedupeStore(Protocol):
    """What `FileEvents(dedupe=...)` needs: a set of ids whose members expire, read and
    written many ids at a time. A consumer makes at most two calls at once, never two
    `add_many`: a `has_many` may run while an `add_many` is in flight, so a store that is not
    safe for concurrent calls serialises them itself."""

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
    """The consumer's traffic with a store, in batches: one exchange at a time carrying every
    write and lookup asked for since the one before was sent, and beside it, while it is in
    flight, at most one more of the lookups asked for meanwhile (a fetched batch's events
    need not wait for the writes of the batch before). A store with
    `exchange(records, lookups, ttl)` (`RedisDedupeStore` on one Redis) gets both in one
    call, one round trip; another gets an `add_many` and a `has_many`.

    Lookups are asked for many ids at once (`look_up`: a fetched batch's events, answered by
    one future); writes are queued (`write`) and told, in bulk, once acknowledged
    (`on_written`) or failed (`on_write_failed`), so no task waits for them. A failed
    exchange fails each of its lookups and writes: the processor retries each (never taking
    an id for new or for done on a failure)."""

    def __init__(
        self,
        store: AnyDedupeStore,
        ttl: timedelta,
        on_written: Callable[[list[Any]], None] | None = None,
        on_write_failed: Callable[[list[Any], Exception], None] | None = None,
        max_batch: int = 2048,
    ) -> None:
        self.store = batching(store)
        self.in_process = isinstance(store, MemoryDedupeStore)
        """An in-process store answers at once: nothing to gather, asked directly."""
        self.ttl = ttl
        self.on_written = on_written or _ignore
        """Told the items `write` queued once the store holds their ids."""
        self.on_write_failed = on_write_failed or _ignore_failed
        """Told the items of a write that failed, and why: not written."""
        self._max_batch = max_batch
        self._lookups: list[tuple[Sequence[str], asyncio.Future[list[bool]]]] = []
        self._writes: list[tuple[str, Any]] = []
        self._pump: asyncio.Task[None] | None = None
        self._sending = False
        """Whether the pump's exchange is in flight."""
        self._side: asyncio.Task[None] | None = None
        """Lookups sent while the pump's exchange is in flight (`_run_lookups`)."""
        exchange = getattr(self.store, "exchange", None)
        self._exchange: Exchange | None = exchange() if callable(exchange) else None

    def look_up(self, event_ids: Sequence[str]) -> asyncio.Future[list[bool]]:
        """For each of `event_ids`, in order, whether the store holds it: answered by the
        next exchange."""
        future: asyncio.Future[list[bool]] = asyncio.get_running_loop().create_future()
        self._lookups.append((event_ids, future))
        self._start()
        return future

    async def seen(self, *event_ids: str) -> bool:
        """True when the store holds any of `event_ids` (one event's id, and within the
        upgrade window its id before scopes)."""
        if self.in_process:
            return any(await self.store.has_many(event_ids))
        return any(await self.look_up(event_ids))

    def write(self, event_id: str, item: Any) -> None:
        """Record `event_id` in the next exchange; `item` goes to `on_written` once it is
        (or to `on_write_failed`)."""
        self._writes.append((event_id, item))
        self._start()

    async def add(self, event_id: str) -> None:
        """Record `event_id` now, on its own (an in-process store, and retries)."""
        await self.store.add_many((event_id,), self.ttl)

    async def close(self) -> None:
        """Stop exchanging: what is queued or in flight is dropped (neither written nor
        answered)."""
        for pump in (self._pump, self._side):
            if pump is not None and not pump.done():
                pump.cancel()
                await asyncio.wait([pump])
        self._pump = self._side = None
        self._sending = False
        for _, future in self._lookups:
            future.cancel()
        self._lookups, self._writes = [], []

    def _start(self) -> None:
        if self._pump is None:
            # A task, so everything asked for in this turn of the loop goes in one exchange.
            self._pump = asyncio.get_running_loop().create_task(
                self._run(), name="fileevents:dedupe"
            )
        elif self._sending and self._lookups and self._side is None:
            # The pump's exchange is in flight: lookups go now in a second one of their own
            # rather than after it (`_run_lookups`).
            self._side = asyncio.get_running_loop().create_task(
                self._run_lookups(), name="fileevents:dedupe-lookups"
            )

    async def _run(self) -> None:
        try:
            while self._lookups or self._writes:
                self._sending = True
                try:
                    await self._exchange_once()
                finally:
                    self._sending = False
        finally:
            if self._pump is asyncio.current_task():
                self._pump = None

    async def _run_lookups(self) -> None:
        """Lookups alone, while the pump's exchange is in flight: a second exchange at most.
        Safe in any order with the pump's writes: a record is looked up only once every
        write of its key's earlier events by this consumer is acknowledged (the dispatcher
        makes it a job then), and an event is done with only once its own write is."""
        try:
            while self._lookups and self._sending:
                await self._exchange_once(lookups_only=True)
        finally:
            if self._side is asyncio.current_task():
                self._side = None

    def _take(
        self, lookups_only: bool = False
    ) -> tuple[list[tuple[str, Any]], list[tuple[Sequence[str], Any]]]:
        """The writes (none if `lookups_only`) and lookups of the next exchange: whole
        requests, about `max_batch` ids at most (a request larger than that goes alone)."""
        room = self._max_batch
        writes = self._writes
        if lookups_only:
            writes = []
        elif len(writes) > room:
            writes, self._writes = writes[:room], writes[room:]
        else:
            self._writes = []
        room -= len(writes)
        lookups = self._lookups
        taken = 0
        size = 0
        for event_ids, _ in lookups:
            size += len(event_ids)
            if taken and size > room:
                break
            taken += 1
        lookups, self._lookups = lookups[:taken], lookups[taken:]
        return writes, lookups

    async def _exchange_once(self, lookups_only: bool = False) -> None:
        writes, lookups = self._take(lookups_only)
        ids = [one for event_ids, _ in lookups for one in event_ids]
        written = [event_id for event_id, _ in writes]
        write_error: Exception | None = None
        lookup_error: Exception | None = None
        found: list[bool] = []
        try:
            if self._exchange is not None:
                try:
                    found = await self._exchange(written, ids, self.ttl)
                except Exception as exc:
                    write_error = lookup_error = exc
            else:
                if written:
                    try:
                        await self.store.add_many(written, self.ttl)
                    except Exception as exc:
                        write_error = exc
                if ids:
                    try:
                        found = await self.store.has_many(ids)
                    except Exception as exc:
                        lookup_error = exc
        except asyncio.CancelledError:
            for _, future in lookups:
                future.cancel()
            raise
        if lookup_error is None and len(found) != len(ids):
            lookup_error = RuntimeError(
                f"the dedupe store answered {len(found)} of {len(ids)} lookups"
            )
        if writes:
            items = [item for _, item in writes]
            if write_error is None:
                self.on_written(items)
            else:
                self.on_write_failed(items, write_error)
        at = 0
        for event_ids, future in lookups:
            if future.done():  # cancelled
                at += len(event_ids)
                continue
            if lookup_error is not None:
                future.set_exception(lookup_error)
                future.exception()  # its events read it; none may be left (revoked)
            else:
                future.set_result(found[at : at + len(event_ids)])
            at += len(event_ids)


def _ignore(items: list[Any]) -> None:
    return None


def _ignore_failed(items: list[Any], error: Exception) -> None:
    return None


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
local prefix, ttl = ARGV[1], ARGV[2]
for _, id in ipairs(cjson.decode(ARGV[3])) do
    redis.call('SET', prefix .. id, '1', 'PX', ttl, 'NX')
end
local found = {}
for i, id in ipairs(cjson.decode(ARGV[4])) do
    found[i] = redis.call('EXISTS', prefix .. id) == 1 and '1' or '0'
end
return table.concat(found)
"""
"""Writes (a conditional write per id), then lookups, in one command on one Redis: the ids
as two JSON arrays (two arguments, whatever their number: redis-py packs each argument in
Python), the answers as one string of `0` and `1`. Keys are `ARGV[1]` (the prefix) and an
id: on one Redis a script may name keys it was not given in `KEYS`; on a cluster, where it
may not, `RedisDedupeStore` uses no script."""

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
    (processes, hosts) of one group share what they handled through it. On one Redis the
    consumer's exchange (`exchange()`: the writes, then the lookups) is one script call
    running `SET ... PX ... NX` per id written and `EXISTS` per id looked up; `has_many` is
    one `MGET`, `add_many` one script. On a `RedisCluster`, whose keys of one batch live on
    many nodes, a pipeline of `EXISTS` / `SET NX` instead (no MULTI; redis-py splits it per
    node).
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
            found = await script(
                keys=(), args=(prefix, ttl_ms(ttl), _json(records), _json(lookups))
            )
            if isinstance(found, str):  # a client with decode_responses=True
                found = found.encode("ascii")
            return [one == _FOUND for one in found]

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
