"""Runnable consumers of an instance's events (`python -m examples.<name> --help`).

See fileevents/README.md, "Examples".
"""
