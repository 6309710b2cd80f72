"""What the stream knows, held for one comparison: in memory for small sets, on disk for a bucket.

A `KnownSet` answers the comparison's three questions (`connectors.reconcile.drift.compare`):
what the stream last said about a listed key (`lookup`, which also marks the key listed), how
many keys it knows as present (`present`), and which present keys the listing never named
(`unlisted`, in key order). `MemoryKnown` wraps a dict (the tests', `plan`'s, and today's
output-topic reader's, which holds every event anyway); `SpilledKnown` keeps the set in a
temporary RocksDB (rocksdict), so that a run's Python-side memory does not grow with the
bucket: RocksDB's own memory is bounded by its memtables (`SPILL_WRITE_BUFFER_BYTES`, two at
most) and block cache, and the rest lives in files under the system's temporary directory
(roughly 100 bytes a key), deleted when the run ends.

One key may be known under several scopes (an instance taking several providers' events, or
reconcile's own scope next to a provider's: streams.core.emitting). `put_mark` keeps one entry
per scope; a lookup takes the scope whose mark is newest by time (a mark without time loses to
one with; a tie goes to the scope written last in the changelog, which orders all scopes of
one key: they share the key's partition).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol, runtime_checkable

import orjson

from connectors.reconcile.drift import Known

SPILL_WRITE_BUFFER_BYTES = 16 * 1024 * 1024
"""One RocksDB memtable of the spilled set (two at most in memory)."""
LISTED = b"1"
UNLISTED = b"0"


@runtime_checkable
class KnownSet(Protocol):
    present: int
    """Keys the stream knows as present."""

    def lookup(self, key: str) -> Known | None:
        """What the stream last said about `key` (None: nothing); marks `key` listed."""
        ...

    def unlisted(self) -> Iterator[Known]:
        """The present keys never looked up, in key order (UTF-8 bytes: code points)."""
        ...

    def close(self) -> None: ...


class MemoryKnown:
    """A dict of the stream's last word per key."""

    def __init__(self, known: Mapping[str, Known]) -> None:
        self.known = known
        self.present = sum(1 for last in known.values() if last.present)
        self.seen: set[str] = set()

    def lookup(self, key: str) -> Known | None:
        self.seen.add(key)
        return self.known.get(key)

    def unlisted(self) -> Iterator[Known]:
        for key in sorted(self.known):
            last = self.known[key]
            if last.present and key not in self.seen:
                yield last

    def close(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class _Entry:
    scope: str
    type: str
    etag: str | None
    time: float | None
    token: str | None
    order: int


def _encode(entries: list[_Entry]) -> bytes:
    return orjson.dumps([[e.scope, e.type, e.etag, e.time, e.token, e.order] for e in entries])


def _decode(stored: bytes) -> list[_Entry]:
    return [_Entry(*item) for item in orjson.loads(stored)]


def _rank(entry: _Entry) -> tuple[bool, float, int]:
    return (entry.time is not None, entry.time if entry.time is not None else 0.0, entry.order)


def _newest(entries: list[_Entry]) -> _Entry:
    return entries[0] if len(entries) == 1 else max(entries, key=_rank)


def _known(key: str, entry: _Entry) -> Known:
    time = datetime.fromtimestamp(entry.time, UTC) if entry.time is not None else None
    return Known(key=key, type=entry.type, etag=entry.etag, time=time, token=entry.token)


class SpilledKnown:
    """The known set in a temporary RocksDB: object key -> listed flag + its scopes' entries."""

    def __init__(self, directory: str | None = None) -> None:
        import rocksdict

        self.path = Path(tempfile.mkdtemp(prefix="reconcile-known-", dir=directory))
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_write_buffer_size(SPILL_WRITE_BUFFER_BYTES)
        options.set_max_write_buffer_number(2)
        options.set_keep_log_file_num(1)
        self.db = rocksdict.Rdict(str(self.path), options=options)
        writes = rocksdict.WriteOptions()
        writes.disable_wal = True  # type: ignore[method-assign,assignment]  # an attribute
        self.db.set_write_options(writes)
        self.present = 0
        self.keys = 0
        self._order = 0

    def put(self, known: Known) -> None:
        """`known` replaces what was known of its key (a source of one word per key)."""
        time = known.time.timestamp() if known.time is not None else None
        self.put_mark(known.key, "", known.type, known.etag, time, known.token)

    def put_mark(
        self,
        key: str,
        scope: str,
        event_type: str | None,
        etag: str | None,
        time: float | None,
        token: str | None,
    ) -> None:
        """The word of one scope about `key`: its mark's type, the ETag, time and token;
        `event_type` None forgets that scope's word (a tombstone, a record of ids alone)."""
        self._order += 1
        name = key.encode()
        stored = self.db.get(name)
        entries = _decode(stored[1:]) if stored is not None else []
        before = bool(entries) and _newest(entries).type == "created"
        if entries:
            entries = [entry for entry in entries if entry.scope != scope]
        if event_type is not None:
            entries.append(_Entry(scope, event_type, etag, time, token, self._order))
        after = bool(entries) and _newest(entries).type == "created"
        self.present += after - before
        if entries:
            self.keys += stored is None
            self.db[name] = UNLISTED + _encode(entries)
        elif stored is not None:
            self.keys -= 1
            del self.db[name]

    def lookup(self, key: str) -> Known | None:
        name = key.encode()
        stored = self.db.get(name)
        if stored is None:
            return None
        if stored[:1] != LISTED:
            self.db[name] = LISTED + stored[1:]
        return _known(key, _newest(_decode(stored[1:])))

    def unlisted(self) -> Iterator[Known]:
        for name, stored in self.db.items():
            assert isinstance(stored, bytes)
            if stored[:1] == LISTED:
                continue
            entry = _newest(_decode(stored[1:]))
            if entry.type == "created":
                assert isinstance(name, bytes)
                yield _known(name.decode(), entry)

    def close(self) -> None:
        self.db.close()
        shutil.rmtree(self.path, ignore_errors=True)
