"""The engine: the Kafka-facing shell of the stages (consumers, producers, transactions,
local state and its restore). It moves records between Kafka and the stage runners of
streams.stages, which call the pure decisions of streams.core.

* `librdkafka/` (confluent-kafka): KIP-848 or classic cooperative-sticky members with
  incremental assignments, the idempotent producer, exactly-once v2 with one transactional
  producer per emit member;
* `batches` (a stage's batch and its accounting), `outcomes` (what a send reports,
  dead-letter replacements), `store` (RocksDB state with changelogs, restore), `topics` (the
  topology and its creation), `offsets`, `binding`, `membership` (leaving the group for
  good), `failpoints` (fault injection for the chaos tests).
"""
