"""GCS delivery attributes holding a lone surrogate are refused however they are split: one
encode of them all (streams.core.normalizers.gcs `_all_text`) must not pair the halves."""

from __future__ import annotations

import pytest

from streams.core.delivery import Delivery
from streams.core.normalizers import MalformedDelivery
from streams.core.normalizers.gcs import normalize

ATTRIBUTES = {
    "eventType": "OBJECT_FINALIZE",
    "bucketId": "b",
    "objectId": "k",
    "objectGeneration": "1",
    "eventTime": "2026-11-30T00:00:00Z",
}


@pytest.mark.parametrize(
    "extra",
    [
        {"x": "\ud83d", "y": "\ude00"},  # the two halves of one pair, in two values
        {"\ud83d": "\ude00"},  # a name and its value
        {"x\ud83d": "v"},
        {"x": "v\udfff"},
    ],
)
def test_split_surrogates_are_refused(extra: dict[str, str]) -> None:
    with pytest.raises(MalformedDelivery, match="delivery attributes holds a lone UTF-16"):
        normalize(Delivery("gcs", b"", attributes={**ATTRIBUTES, **extra}))


def test_text_attributes_are_read() -> None:
    [event] = normalize(Delivery("gcs", b"", attributes={**ATTRIBUTES, "x": "\U0001f600"}))
    assert (event.bucket, event.key, event.sequencer) == ("b", "k", "1")
