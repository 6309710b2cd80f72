"""A steady feed of S3 deliveries of fresh keys, from a thread, for tests that change a worker
under load (kills, partition moves)."""

from __future__ import annotations

import threading

from confluent_kafka import Producer

from support.kafka_io import raw
from support.payloads import s3_body, s3_record


class Feed(threading.Thread):
    """`<prefix>/<n>.txt` every 25 ms until `stopped` is set (load, not timing); `sent` keeps
    the keys in order. Each key's sequencer is its number."""

    def __init__(self, bootstrap: str, topic: str, prefix: str) -> None:
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topic = topic
        self.prefix = prefix
        self.sent: list[str] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.025):
            key = f"{self.prefix}/{len(self.sent)}.txt"
            value, headers = raw(s3_body(s3_record(key, f"{len(self.sent) + 1:016X}")), "s3")
            self.producer.produce(self.topic, value, key=key.encode(), headers=headers)
            self.producer.poll(0)
            self.sent.append(key)
        self.producer.flush(30)
