"""The aiokafka engine (`stream.engine = "aiokafka"`): `consumer.BatchLoop` (a stage member,
eager rebalances), `producer.RecordSender` (record batches per partition, idempotent) and
`transactions.PartitionTransactions` (a transactional producer per input partition)."""
