"""The project's own Apache Kafka broker: `localkafka.py` (the command) and `private` (one
broker of a test's or a benchmark's own)."""
