"""The librdkafka engine (`stream.engine = "librdkafka"`): the Kafka-facing shell of the stages.

The stages' decisions (normalize, route, plan, order) stay where they are and are called
exactly as the aiokafka engine calls them (streams.worker.Pipeline's batch handlers); this
package only moves records between Kafka and those handlers:

* `consumer.RdBatchLoop`: a stage's group member (confluent_kafka.Consumer, KIP-848 or
  classic cooperative-sticky), incremental assignments, batches handed to the event loop;
* `producer.RdRecordSender`: the idempotent producer (normalize, at_least_once emit, sweep);
* `transactions.MemberTransactions`: exactly-once v2 (KIP-447), one transactional producer
  per emit member, offsets sent with the consumer's group metadata.
"""
