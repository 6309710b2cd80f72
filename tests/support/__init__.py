"""Helpers for tests that run against the real broker: produce, read, run a worker."""
