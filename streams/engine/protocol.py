"""The Kafka requests the engine declares itself, in aiokafka's protocol types, because
librdkafka (confluent-kafka 2.16) cannot make them: they are the engine's only use of
aiokafka, each sent through an aiokafka connection where it is needed. Every other call of the
engine goes through confluent-kafka (consumers, producers, transactions, the state restore,
topics, offsets, the cluster id and topic ids, group descriptions and configs).

* ApiVersions v3 (KIP-511, KIP-584): aiokafka knows ApiVersions up to v2, which carries no
  finalized features; the worker reads `group.version` from it before it joins KIP-848 groups
  (streams.engine.librdkafka.group_config).
* LeaveGroup v3 (KIP-345): removing static members by group.instance.id, which neither
  client offers (streams.engine.membership).
"""

from __future__ import annotations

from collections.abc import Sequence
from io import BytesIO
from typing import Any

from aiokafka.protocol.api import Request, RequestStruct, Response, ResponseHeader_v0
from aiokafka.protocol.types import (
    Array,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Schema,
    String,
    TaggedFields,
)

FINALIZED_FEATURES_TAG = 2
"""ApiVersions v3+: the tagged field of the finalized features (KIP-584)."""
FEATURES = CompactArray(
    ("name", CompactString("utf-8")),
    ("max_version_level", Int16),
    ("min_version_level", Int16),
    ("tags", TaggedFields),
)


class ApiVersionsResponseV3(Response):  # type: ignore[misc]  # aiokafka: untyped for mypy
    API_KEY = 18
    API_VERSION = 3
    SCHEMA = Schema(
        ("error_code", Int16),
        (
            "api_keys",
            CompactArray(
                ("api_key", Int16),
                ("min_version", Int16),
                ("max_version", Int16),
                ("tags", TaggedFields),
            ),
        ),
        ("throttle_time_ms", Int32),
        ("tags", TaggedFields),
    )


class ApiVersionsRequestV3(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 18
    API_VERSION = 3
    RESPONSE_TYPE = ApiVersionsResponseV3
    SCHEMA = Schema(
        ("client_software_name", CompactString("utf-8")),
        ("client_software_version", CompactString("utf-8")),
        ("tags", TaggedFields),
    )

    def parse_response_header(self, read_buffer: BytesIO | bytes) -> Any:
        # ApiVersions answers with response header v0 whatever its version (KIP-511): a client
        # cannot know the broker's flexible versions before this answer.
        return ResponseHeader_v0.decode(read_buffer)


class ApiVersionsV3(Request[ApiVersionsRequestV3]):  # type: ignore[misc]
    """aiokafka knows ApiVersions up to v2, which carries no features."""

    API_KEY = 18
    ALLOW_UNKNOWN_API_VERSION = True

    def build(self, request_struct_class: type[ApiVersionsRequestV3]) -> ApiVersionsRequestV3:
        return request_struct_class("storage-events", "1", {})


class LeaveGroupResponse_v3(Response):  # type: ignore[misc]  # aiokafka is untyped here
    API_KEY = 13
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        (
            "members",
            Array(
                ("member_id", String("utf-8")),
                ("group_instance_id", String("utf-8")),  # nullable: -1 length is None
                ("error_code", Int16),
            ),
        ),
    )


class LeaveGroupRequest_v3(RequestStruct):  # type: ignore[misc]
    API_KEY = 13
    API_VERSION = 3
    RESPONSE_TYPE = LeaveGroupResponse_v3
    SCHEMA = Schema(
        ("group_id", String("utf-8")),
        ("members", Array(("member_id", String("utf-8")), ("group_instance_id", String("utf-8")))),
    )


class LeaveStaticMembers(Request[LeaveGroupRequest_v3]):  # type: ignore[misc]
    """LeaveGroup for static members named by group.instance.id (v3 only: older versions
    cannot name an instance id, so a broker without v3 raises NotImplementedError)."""

    API_KEY = 13

    def __init__(self, group_id: str, instance_ids: Sequence[str]) -> None:
        self._group_id = group_id
        self._instance_ids = list(instance_ids)

    def build(self, request_struct_class: type[LeaveGroupRequest_v3]) -> LeaveGroupRequest_v3:
        return request_struct_class(
            self._group_id, [("", instance_id) for instance_id in self._instance_ids]
        )
