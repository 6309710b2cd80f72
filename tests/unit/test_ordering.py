"""streams.core.ordering: per-key order by the provider's own tokens, else by event time.

`stale(incoming, emitted)` asks: is `incoming` older than the event already emitted for
its key? S3 cases are built from PROVIDERS.md §1 (real sequencers, the padding rule, the
EventBridge small-letter examples).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.core.event import FileEvent
from streams.core.ordering import (
    SEQUENCER_WIDTH,
    Mark,
    bounded_mark,
    mark_for,
    order_token,
    recorded_mark,
    scope,
    staleness,
)

T0 = datetime(2026, 3, 12, 2, 7, 57, tzinfo=UTC)
_ids = iter(range(10**9))


def event(provider: str = "s3", sequencer: str | None = None, **fields: Any) -> FileEvent:
    values: dict[str, Any] = {
        "id": f"{provider}:{next(_ids)}",
        "type": "created",
        "key": "k",
        "time": T0,
        "sequencer": sequencer,
        "provider": provider,
    }
    return FileEvent(**(values | fields))


def s3(sequencer: str, **fields: Any) -> FileEvent:
    return event("s3", sequencer, **fields)


def gcs(generation: str | None, metageneration: Any = "1", kind: str = "created") -> FileEvent:
    raw = {"metageneration": metageneration} if metageneration is not None else {}
    return event("gcs", generation, type=kind, raw=raw)


def stale(incoming: FileEvent, emitted: FileEvent) -> bool:
    return staleness(incoming, mark_for(emitted)) is not None


# --- S3 / EventBridge / MinIO sequencers ------------------------------------------------------


def test_s3_token_is_upper_case_and_right_padded() -> None:
    assert order_token(s3("617f08299329d189")) == (
        "aws-sequencer",
        ("617F08299329D189" + "0" * (SEQUENCER_WIDTH - 16),),
    )


@pytest.mark.parametrize("provider", ["s3", "eventbridge", "minio"])
def test_aws_sequenced_providers_share_a_kind(provider: str) -> None:
    found = order_token(event(provider, "0055AED6DCD90281E5"))
    assert found is not None and found[0] == "aws-sequencer"


# (older, newer): real 18-character values from PROVIDERS.md §1, in time order.
REAL_IN_ORDER = [
    "005A934FE6C0A58C72",  # 2018-02-26
    "0063836BDED404C9F2",  # 2022-11-27
    "00657F90C047858AE9",  # 2023-12-18
    "0069B21FFD0745EE4E",  # 2026-03-12
]


@pytest.mark.parametrize(
    ("older", "newer"),
    [(a, b) for i, a in enumerate(REAL_IN_ORDER) for b in REAL_IN_ORDER[i + 1 :]]
    + [
        ("0055AED6DCD90281E5", "0055AED6DCD90281E6"),
        # Right padding: a 16-character EventBridge value against an 18-character S3 one.
        # Left padding (the docs' old rule) would make 00617F08... older than 0063836B...
        ("0063836BDED404C9F2", "617f08299329d189"),
        # The shorter is padded with zeros, so it sorts before a longer one that goes on.
        ("0055AED6DCD90281", "0055AED6DCD90281E5"),
        # Case-normalised: 'a' > 'F' in ASCII, but 0xAA < 0xAB.
        ("00aa", "00AB"),
        ("617F08299329D189", "617f08299329d18a"),
        # Non-hex (aws-lambda-go test data): still a deterministic string order.
        ("Happy Sequencer", "Happy Sequencez"),
    ],
)
def test_s3_sequencer_order(older: str, newer: str) -> None:
    assert stale(s3(older), s3(newer))
    assert not stale(s3(newer), s3(older))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("0055AED6DCD90281E5", "0055AED6DCD90281E5"),
        ("617f08299329d189", "617F08299329D189"),
        # Right-padded with zeros, these are the same value (a plain `<` would call one older).
        ("0055AED6DCD90281", "0055AED6DCD9028100"),
        ("0e042b98180d", "0E042B98180D0000"),
    ],
)
def test_equal_s3_sequencers_both_pass(a: str, b: str) -> None:
    assert not stale(s3(a), s3(b))
    assert not stale(s3(b), s3(a))


def test_s3_sequencer_wins_over_event_time() -> None:
    newer_but_earlier_clock = s3("0069B21FFD0745EE4E", time=T0 - timedelta(hours=1))
    older_but_later_clock = s3("005A934FE6C0A58C72", time=T0 + timedelta(hours=1))
    assert not stale(newer_but_earlier_clock, s3("0063836BDED404C9F2"))
    assert stale(older_but_later_clock, s3("0063836BDED404C9F2"))


def test_sequencers_compare_across_aws_sources() -> None:
    emitted = event("s3", "0063836BDED404C9F2")
    assert not stale(event("eventbridge", "617f08299329d189"), emitted)
    assert stale(event("minio", "005A934FE6C0A58C72"), emitted)


def test_stale_reason_names_the_kind_the_sequencer_and_the_emitted_event() -> None:
    emitted = s3("0063836BDED404C9F2", type="deleted")
    reason = staleness(s3("005A934FE6C0A58C72"), mark_for(emitted))
    assert reason is not None
    assert "aws-sequencer" in reason
    assert "005A934FE6C0A58C72" in reason
    assert emitted.id in reason
    assert "deleted" in reason


HEX = st.text(alphabet="0123456789abcdefABCDEF", min_size=1, max_size=20)
SMALL_HEX = st.text(alphabet="0aA1", min_size=1, max_size=4)


def s3_less(a: str, b: str) -> bool:
    """a < b in the stream's order: an event with a is stale after one with b."""
    return stale(s3(a), s3(b))


@given(a=HEX, b=HEX)
def test_s3_order_is_right_padded_upper_case_comparison(a: str, b: str) -> None:
    width = max(len(a), len(b))
    expected = a.upper().ljust(width, "0") < b.upper().ljust(width, "0")
    assert s3_less(a, b) == expected


@given(a=SMALL_HEX, b=SMALL_HEX, c=SMALL_HEX)
def test_s3_order_is_a_strict_weak_order(a: str, b: str, c: str) -> None:
    assert not s3_less(a, a)  # irreflexive
    if s3_less(a, b):
        assert not s3_less(b, a)  # asymmetric
        if s3_less(b, c):
            assert s3_less(a, c)  # transitive

    def equivalent(x: str, y: str) -> bool:
        return not s3_less(x, y) and not s3_less(y, x)

    if equivalent(a, b) and equivalent(b, c):
        assert equivalent(a, c)  # incomparability is transitive


# --- Azure -----------------------------------------------------------------------------------


def test_azure_token_is_the_sequencer_verbatim() -> None:
    sequencer = "00000000000004420000000000028963"
    assert order_token(event("azure", sequencer)) == ("azure-sequencer", (sequencer,))


@pytest.mark.parametrize(
    ("older", "newer"),
    [
        ("00000000000004420000000000028963", "00000000000004420000000000028964"),
        ("00000000000004410000000000028964", "00000000000004420000000000028963"),
        # Byte-wise: no case folding, unlike S3 ('B' < 'a').
        ("000000000000000B", "000000000000000a"),
    ],
)
def test_azure_sequencer_byte_wise(older: str, newer: str) -> None:
    assert stale(event("azure", older), event("azure", newer))
    assert not stale(event("azure", newer), event("azure", older))


def test_equal_azure_sequencers_pass() -> None:
    seq = "00000000000004420000000000028963"
    assert not stale(event("azure", seq), event("azure", seq))


# --- GCS -------------------------------------------------------------------------------------


def test_gcs_token() -> None:
    assert order_token(gcs("1587627537231057", "2", "deleted")) == (
        "gcs-generation",
        (1587627537231057, 1, 2),  # generation, deleted after created, metageneration
    )


def test_gcs_generation_compares_as_a_number() -> None:
    assert stale(gcs("9"), gcs("10"))  # "9" > "10" as strings
    assert not stale(gcs("10"), gcs("9"))


def test_gcs_metageneration_breaks_ties() -> None:
    assert stale(gcs("5", "1"), gcs("5", "2"))
    assert not stale(gcs("5", "2"), gcs("5", "1"))


def test_gcs_created_before_deleted_of_the_same_generation() -> None:
    assert stale(gcs("5", "1", "created"), gcs("5", "1", "deleted"))
    assert not stale(gcs("5", "1", "deleted"), gcs("5", "1", "created"))


def test_gcs_a_new_generation_follows_a_delete() -> None:
    assert not stale(gcs("6", "1", "created"), gcs("5", "1", "deleted"))
    assert stale(gcs("5", "1", "deleted"), gcs("6", "1", "created"))


def test_gcs_same_event_twice_passes() -> None:
    assert not stale(gcs("5", "1"), gcs("5", "1"))


@pytest.mark.parametrize("metageneration", [None, "", "x", "\u00b2", "9" * 5000, True, 3.5])
def test_gcs_unusable_metageneration_counts_as_zero(metageneration: Any) -> None:
    # "²".isdigit() is True but int("²") fails; a huge digit string exceeds int()'s limit.
    # Either used to raise out of the emit stage and stop the worker on every restart.
    found = order_token(gcs("5", metageneration))
    assert found == ("gcs-generation", (5, 0, 0))


@pytest.mark.parametrize("generation", [None, "", "abc", "\u00b2"])
def test_gcs_without_a_usable_generation_has_no_token(generation: str | None) -> None:
    assert order_token(gcs(generation)) is None


# --- fallback to event time, unknown order ------------------------------------------------------


@pytest.mark.parametrize("provider", ["supabase", "b2", "box", "cloudinary", "appwrite"])
def test_providers_without_tokens_have_none(provider: str) -> None:
    assert order_token(event(provider, "123")) is None


@pytest.mark.parametrize("provider", ["s3", "azure"])
def test_an_empty_sequencer_is_no_token(provider: str) -> None:
    assert order_token(event(provider, "")) is None
    assert order_token(event(provider, None)) is None


def test_time_decides_between_tokenless_events() -> None:
    earlier = event("supabase", time=T0)
    later = event("supabase", time=T0 + timedelta(milliseconds=1))
    assert stale(earlier, later)
    assert not stale(later, earlier)
    assert not stale(event("supabase", time=T0), earlier)  # same time: both pass


def test_time_decides_between_tokens_of_different_kinds() -> None:
    emitted = s3("0069B21FFD0745EE4E", time=T0)
    assert stale(event("azure", "0000000000000001", time=T0 - timedelta(seconds=1)), emitted)
    assert not stale(event("azure", "0000000000000001", time=T0 + timedelta(seconds=1)), emitted)


def test_time_decides_when_only_one_side_has_a_token() -> None:
    emitted = event("supabase", time=T0)
    assert stale(s3("FFFF", time=T0 - timedelta(seconds=1)), emitted)
    assert not stale(s3("0000", time=T0 + timedelta(seconds=1)), emitted)


def test_time_reason() -> None:
    emitted = event("box", time=T0)
    reason = staleness(event("box", time=T0 - timedelta(seconds=1)), mark_for(emitted))
    assert reason is not None
    assert "event time" in reason
    assert emitted.id in reason


@pytest.mark.parametrize(("incoming_time", "emitted_time"), [(None, T0), (T0, None), (None, None)])
def test_unknown_order_passes(
    incoming_time: datetime | None, emitted_time: datetime | None
) -> None:
    assert not stale(event("box", time=incoming_time), event("box", time=emitted_time))
    assert not stale(s3("0000", time=incoming_time), event("box", time=emitted_time))


def test_nothing_emitted_yet_passes() -> None:
    assert staleness(s3("0000"), None) is None


# --- Mark --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "emitted",
    [
        s3("617f08299329d189"),
        gcs("1587627537231057", "3", "deleted"),
        event("azure", "00000000000004420000000000028963"),
        event("box"),
        event("box", time=None),
        event("supabase", time=datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)),
    ],
    ids=["s3", "gcs", "azure", "box", "box-no-time", "microseconds"],
)
def test_mark_json_round_trip(emitted: FileEvent) -> None:
    mark = mark_for(emitted)
    assert (mark.event_id, mark.type) == (emitted.id, emitted.type)
    restored = Mark.from_json(json.loads(json.dumps(mark.to_json())))
    assert restored == mark


def test_staleness_is_the_same_against_a_restored_mark() -> None:
    for emitted, incoming in [
        (gcs("5", "2"), gcs("5", "1")),
        (gcs("5", "1"), gcs("6", "1")),
        (s3("0063836BDED404C9F2"), s3("005A934FE6C0A58C72")),
        (s3("0063836BDED404C9F2"), s3("617f08299329d189")),
    ]:
        mark = mark_for(emitted)
        restored = Mark.from_json(json.loads(json.dumps(mark.to_json())))
        assert staleness(incoming, restored) == staleness(incoming, mark)


def test_mark_json_shape() -> None:
    emitted = event("gcs", "5", id="gcs:abc", type="deleted", raw={"metageneration": "2"})
    assert mark_for(emitted).to_json() == {
        "kind": "gcs-generation",
        "token": [5, 1, 2],
        "time": T0.timestamp(),
        "id": "gcs:abc",
        "type": "deleted",
    }


def test_mark_from_partial_json() -> None:
    assert Mark.from_json({}) == Mark(kind=None, token=None, time=None, event_id="", type="")


# --- scopes ----------------------------------------------------------------------------------

ARM = "/subscriptions/0000/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts"


@pytest.mark.parametrize(
    ("provider", "raw", "expected"),
    [
        ("s3", {"awsRegion": "us-east-1"}, "s3"),
        ("s3", {}, "s3"),
        ("s3", {"awsRegion": "cn-northwest-1"}, "s3@aws-cn"),
        ("s3", {"awsRegion": "us-gov-west-1"}, "s3@aws-us-gov"),
        ("s3", {"awsRegion": "us-isob-east-1"}, "s3@aws-iso-b"),
        ("s3", {"awsRegion": "us-iso-east-1"}, "s3@aws-iso"),
        ("eventbridge", {"region": "cn-north-1"}, "eventbridge@aws-cn"),
        ("minio", {"awsRegion": "cn-north-1"}, "minio"),  # a MinIO region names nothing
        ("azure", {"topic": f"{ARM}/MyAccount"}, "azure@myaccount"),
        ("azure", {"source": f"{ARM}/other1/blobServices/default"}, "azure@other1"),
        ("azure", {"topic": "/subscriptions/0/resourceGroups/rg"}, "azure"),
        ("azure", {"topic": f"{ARM}/a|b:c"}, "azure"),  # not an account name
        ("azure", {}, "azure"),
        ("gcs", {"bucket": "b"}, "gcs"),
        ("supabase", {}, "supabase"),
        ("box", {}, "box"),
    ],
)
def test_scope(provider: str, raw: dict[str, Any], expected: str) -> None:
    assert scope(event(provider, raw=raw)) == expected


@given(origin=st.text(max_size=80))
def test_a_scope_never_holds_a_key_separator(origin: str) -> None:
    found = scope(event("azure", raw={"topic": f"{ARM}/{origin}"}))
    assert not {"|", "/", ":"} & set(found)


# --- clock skew --------------------------------------------------------------------------------


def test_a_mark_beyond_the_bound_loses_its_time_only() -> None:
    mark = mark_for(s3("0055AED6DCD90281E5", time=T0 + timedelta(days=1)))
    bounded = bounded_mark(mark, T0.timestamp() + 300)
    assert bounded is not None
    assert (bounded.time, bounded.token, bounded.kind) == (None, mark.token, mark.kind)
    assert bounded_mark(mark, mark.time or 0.0) == mark
    assert bounded_mark(None, 0.0) is None


def test_a_future_time_is_not_recorded_the_last_one_stays() -> None:
    last = mark_for(event("box", time=T0))
    future = mark_for(event("box", time=T0 + timedelta(days=3650)))
    recorded = recorded_mark(future, last, T0.timestamp() + 300)
    assert (recorded.event_id, recorded.time) == (future.event_id, T0.timestamp())
    assert recorded_mark(future, None, T0.timestamp() + 300).time is None
    assert recorded_mark(last, None, T0.timestamp()) == last
