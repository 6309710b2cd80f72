"""The stage runners of the worker, between the pure decisions (streams.core) and the Kafka
shell (streams.engine): `normalize` (stage one), `emit` (stage two) and `pipeline`, which wires
both to their group members, producers, transactions and state. The process that hosts them
is streams.worker.
"""
