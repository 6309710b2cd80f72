"""The marks move and the stamping of deleted marks without an end (streams.migrations, items
3 and 4): state written before per-key state, and before deleted keys' marks expired.

* `migrated_mark`: at a partition's restore (streams.stages.emit `migrate_marks`), each
  `marks` entry becomes its key's `keys` record (unless the key has one), then is tombstoned;
  the pre-scope window's marker is copied as it is. `mark_forget_at` is the restore's expiry
  reader for `marks` meanwhile.
* `stamp_unended`: a deleted key's mark written before marks expired has no `forget_at`; the
  sweep gives it the sweep's time + the grace, so it goes a grace after the upgrade, never
  earlier.
"""

from __future__ import annotations

from streams.core.keystate import KeyState, encode, read_json
from streams.core.ordering import Mark, with_grace
from streams.migrations.reads import LEGACY_UNTIL_KEY

DELETED_MARKER = b"deleted"
"""In every stored mark of a deleted key (its `type`): marks without it are skipped unparsed."""


def read_mark(stored: bytes | None) -> Mark | None:
    """A mark as `marks` stored it; an unreadable one counts as none (unknown order passes)."""
    if stored is None:
        return None
    try:
        data = read_json(stored)
        return Mark.from_json(data) if isinstance(data, dict) else None
    except (ValueError, TypeError):
        return None


def migrated_mark(key: bytes, stored: bytes) -> bytes | None:
    """The `keys` record of a `marks` entry (per-key state's upgrade: a key's mark becomes its
    record's; the pre-scope window's marker is copied as it is); None for an unreadable one."""
    if key == LEGACY_UNTIL_KEY:
        return stored
    mark = read_mark(stored)
    return encode(KeyState(mark=mark)) if mark is not None else None


def mark_forget_at(stored: bytes) -> float | None:
    """When a stored mark is forgotten, None if never (a live key's, or not stamped yet): the
    restore's expiry reader for `marks`."""
    if DELETED_MARKER not in stored:
        return None
    mark = read_mark(stored)
    return mark.forget_at if mark is not None and mark.type == "deleted" else None


def stamp_unended(current: KeyState, now: float, grace_s: float) -> bool:
    """Give `current`'s deleted mark without `forget_at` (written before marks expired) an end
    a grace from `now`; False (nothing changed) for any other record."""
    mark = current.mark
    if mark is None or mark.type != "deleted" or mark.forget_at is not None:
        return False
    current.mark = with_grace(mark, now, grace_s)
    return True
