"""What the emit stage still reads of state written by earlier releases, kept off the decision
path: each upgrade's windows and moves, in one place, each with when it can go.

The plan (streams.core.emitting.plan_batch) decides against the current layout through
streams.core.state.StateReads; `UpgradeReads` (`reads`) wraps that reader so that, for a window
after an upgrade, a miss also reads the older layouts. The restore moves the old `marks` table
into per-key records (`marks_move`), and the sweep stamps deleted marks that carry no end
(`stamp_unended`). Pure, like the core: no Kafka, disk or clock.

Each one, with the release that wrote the format it reads and what must be true before it is
removed (docs/upgrading.md says what a user sees):

1. **The `seen` window** (`reads.SEEN_UNTIL_KEY`; "Per-key state (2026-12)"). Before per-key
   state every id was a `seen` entry. On a partition's first plan the `keys` entry
   `SEEN_UNTIL_KEY` is set to now + the longest dedupe TTL when the partition had state, else
   now; until then a miss in a key's ids also reads `seen`. Remove once every deployment has run
   a release with per-key state for longer than its longest dedupe TTL (the marker of each
   partition is in the past): then `seen` holds only spilled ids, which the core reads itself.
2. **The pre-scope ids and marks** (`reads.LEGACY_UNTIL_KEY`, `legacy_id_readable`,
   `legacy_mark_applies`; "Provider scopes in the stream's state (2026-12)"). Before scopes,
   ids were `seen` entries `<instance>/<id>` and marks `<instance>/<bucket>/<key>`. Same kind of
   window, its marker `LEGACY_UNTIL_KEY`. Remove under the same condition, counted from the
   first release with scopes; the old mark keys in `keys` then order nothing and are swept like
   any record (a live key's mark of the old key stays on disk until then: deleting those is
   part of the removal).
3. **The marks move** (`marks_move.migrated_mark`, `mark_forget_at`; "Per-key state
   (2026-12)"). A partition's `marks` entries become `keys` records at its first restore, then
   are tombstoned. Remove once every deployment restored each partition with per-key state
   (its `marks` changelog is empty, or only tombstones); the `marks` table and changelog can
   then go too (streams.engine.topics).
4. **Deleted marks without an end** (`marks_move.stamp_unended`; "Deleted keys' marks
   expire"). A deleted key's mark recorded before marks expired has no `forget_at`; the sweep
   stamps it with the sweep's time + the grace. Remove once every partition was swept through
   by a release that stamps (`KEYS_SWEEP_SCAN` per turn: a table of N keys takes N / 50,000
   turns), i.e. no deleted mark without `forget_at` remains.
"""

from streams.migrations.marks_move import mark_forget_at, migrated_mark, stamp_unended
from streams.migrations.reads import (
    LEGACY_UNTIL_KEY,
    SEEN_UNTIL_KEY,
    UpgradeReads,
    legacy_id_readable,
    legacy_mark_applies,
)

__all__ = [
    "LEGACY_UNTIL_KEY",
    "SEEN_UNTIL_KEY",
    "UpgradeReads",
    "legacy_id_readable",
    "legacy_mark_applies",
    "mark_forget_at",
    "migrated_mark",
    "stamp_unended",
]
