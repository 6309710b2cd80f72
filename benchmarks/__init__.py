"""Benchmarks: scripts that measure, run by hand or by `make bench`; not part of the test suite."""
