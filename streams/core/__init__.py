"""The functional core: what the stream decides, as pure functions over plain data.

No Kafka, HTTP, disk or clock here (a time is always passed in), so every decision is
tested without a broker:

* `normalizers/`: one module per provider, a delivery's bytes to canonical events
  (`normalizers.SOURCES` is the registry);
* `routing`: a raw record to its keyed records or a dead-letter reason;
* `rules`: an instance's filters and key rewriting;
* `emitting`: a batch's dedupe/order plan (what to emit, what is stale, what state to write);
* `keystate`, `state`: a key's state record, and the state's tables, keys and reader (what
  earlier releases wrote is read by streams.migrations, around that reader);
* `ordering`: the per-key sequencer comparison and ordering marks;
* `records`, `keyedhead`, `event`, `delivery`, `schema`, `partitioning`: the records and
  event they work on (a keyed record's head: what stage two decides on), and the partition a
  key lands on (the Java client's murmur2).

They take small frozen policies built once from the settings (streams.policies,
streams.stages.normalize), never the settings module, and import nothing of streams.engine or
streams.stages: the Kafka-facing shell that feeds them is streams.engine; streams.worker joins
the two.
"""

from streams.core import compiled as _compiled

# Before any module of compiled.MODULES is imported: compiled only when the build beside them
# is theirs (a stale one runs the sources, and warns), and STORAGE_EVENTS_PURE is not set.
_compiled.activate()
