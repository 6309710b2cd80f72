"""`HEADERS_READ` names every HTTP header a normalizer reads: the webhook bridge refuses a
request that repeats one of them (issue 23 #2), so a header read here but not listed would
be one the bridge and the worker could read differently."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from support.payloads import supabase_insert

from streams.core.delivery import Delivery
from streams.core.normalizers import HEADERS_READ, SOURCES, normalizer_for

FIXTURES = Path(__file__).parent / "fixtures"


class Recording(Mapping[str, str]):
    """Headers that remember every name asked for (`*` when iterated: all of them)."""

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._headers = dict(headers)
        self.asked: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.asked.add(name)
        return self._headers[name]

    def __contains__(self, name: object) -> bool:
        self.asked.add(str(name))
        return name in self._headers

    def __iter__(self) -> Iterator[str]:
        self.asked.add("*")
        return iter(self._headers)

    def __len__(self) -> int:
        self.asked.add("*")
        return len(self._headers)


@pytest.mark.parametrize("source", [source for source in SOURCES if source != "reconcile"])
def test_each_normalizer_reads_only_the_headers_it_declares(source: str) -> None:
    bodies = [path.read_bytes() for path in sorted((FIXTURES / source).glob("*.json"))]
    if source == "supabase":  # no captured deliveries in fixtures/
        bodies.append(supabase_insert("a/b.txt", "2027-01-01T00:00:00Z"))
    assert bodies, f"no fixtures for {source}"
    asked: set[str] = set()
    for body in bodies:
        for events in ("buckets.*.files.*.create", "buckets.*.files.*.delete"):
            headers = Recording({"x-appwrite-webhook-events": events, "content-type": "x"})
            # Malformed for this source or not: what it read counts.
            with contextlib.suppress(Exception):
                normalizer_for(source)(Delivery(source, body, headers))
            asked |= headers.asked
    assert asked <= HEADERS_READ.get(source, frozenset())
    if source == "appwrite":
        assert asked == {"x-appwrite-webhook-events"}  # the recording sees what is read
