"""streams.engine.membership without a broker: the LeaveGroup v3 bytes, the member names, the words
(the broker side is tests/integration/test_leave_group.py)."""

from __future__ import annotations

import struct

from streams.engine.membership import GroupView, outcome_of, worker_members
from streams.engine.protocol import LeaveGroupResponse_v3, LeaveStaticMembers


def test_leave_group_v3_names_each_member_by_its_instance_id_with_no_member_id() -> None:
    request = LeaveStaticMembers("app-emit", ["w-2-emit"]).prepare({13: (0, 5)})
    assert request.API_VERSION == 3
    # group_id (string), members: array of (member_id "", group_instance_id), KIP-345
    expected = (
        struct.pack(">h", 8)
        + b"app-emit"
        + struct.pack(">i", 1)
        + struct.pack(">h", 0)
        + struct.pack(">h", 8)
        + b"w-2-emit"
    )
    assert request.encode() == expected


def test_a_broker_without_leave_group_v3_cannot_remove_a_static_member() -> None:
    try:
        LeaveStaticMembers("g", ["i"]).prepare({13: (0, 2)})
    except NotImplementedError:
        return
    raise AssertionError("v0-v2 name no instance id: the request must not be built")


def test_the_response_gives_each_members_own_error() -> None:
    body = (
        struct.pack(">ih", 0, 0)
        + struct.pack(">i", 2)
        + struct.pack(">h", 0)
        + struct.pack(">h", 1)
        + b"a"
        + struct.pack(">h", 0)
        + struct.pack(">h", 0)
        + struct.pack(">h", 1)
        + b"b"
        + struct.pack(">h", 25)
    )
    response = LeaveGroupResponse_v3.decode(body)
    assert [(instance, outcome_of(code)) for _, instance, code in response.members] == [
        ("a", "removed"),
        ("b", "not a member"),
    ]


def test_a_worker_is_a_static_member_of_both_stage_groups_and_fausts() -> None:
    assert worker_members("storage-events", "pod-1") == [
        ("storage-events-normalize", "pod-1-normalize"),
        ("storage-events-emit", "pod-1-emit"),
        ("storage-events", "pod-1"),
    ]


def test_a_rebalancing_classic_group_owns_nothing_a_consumer_group_keeps_its_owners() -> None:
    owners = {"w-1-emit": [("t", 0)], "w-2-emit": [("t", 1)]}
    assert GroupView("PreparingRebalance", "classic", owners).owner_of() == {}
    assert GroupView("Stable", "classic", owners).owner_of() == {
        ("t", 0): "w-1-emit",
        ("t", 1): "w-2-emit",
    }
    assert GroupView("Unknown", "consumer", owners).owner_of()[("t", 1)] == "w-2-emit"
