"""Bridges: get provider notifications into the raw topic, deciding nothing about them.

A bridge proves a delivery authentic, publishes its bytes exactly as they came (plus what it
knows about the delivery, as Kafka headers), and acknowledges the provider only after Kafka
acknowledged the write.
"""
