"""The engine: the Kafka-facing shell of the stages (consumers, producers, transactions,
local state and its restore). It moves records between Kafka and the stage handlers of
streams.worker, which call the pure decisions of streams.core.

`stream.engine` picks the clients; both keep the same contracts (a stage member handing
batches, `send_all`, a transaction per partition's part):

* `librdkafka/` (confluent-kafka; the default): KIP-848 or classic cooperative-sticky
  members with incremental assignments, exactly-once v2 with one transactional producer per
  emit member;
* `aio/` (aiokafka): eager rebalances, one transactional producer per input partition.

Shared by both: `batches` (a stage's batch and its accounting), `outcomes` (what a send
reports, dead-letter replacements), `store` (RocksDB state with changelogs, restore),
`topics` (the topology and its creation), `offsets`, `binding`, `membership` (leaving the
group for good), `failpoints` (fault injection for the chaos tests).
"""
