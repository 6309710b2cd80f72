"""storage-events: object-storage notifications as one clean Kafka stream per instance.

`faust -A streams worker` finds the Faust app as `streams.app` (defined in streams.worker);
it is imported lazily so
that the pure parts (normalizers, rules, the `normalize` command) load without Kafka
settings.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "app":
        from streams.worker import app

        return app
    raise AttributeError(f"module 'streams' has no attribute {name!r}")
