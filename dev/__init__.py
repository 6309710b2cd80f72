"""Developer tooling: the local Kafka broker (`dev/kafka`) and `make run` (`dev/run.py`)."""
