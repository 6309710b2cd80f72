"""Broker faults on a local three-broker cluster, for the chaos run (`--brokers 3`).

A production cluster loses a broker now and then: a machine dies, a pod is evicted. What the
stream must do then is keep going on the other two (replication factor 3, `min.insync.replicas`
2: every write is on two replicas before it is acknowledged, and one broker may be down).
`ClusterFaults.kill_leader` does that to the cluster under load: it SIGKILLs the broker that
leads most of the stream's partitions (no controlled shutdown: its leaderships move only when
the controllers notice it is gone), measures how long the stream makes no progress, restarts
it, and waits until it is back in every partition's in-sync replicas, so that the next kill
never takes the last in-sync replica of a partition. `ClusterFaults.kill_coordinator` does the
same to the broker that is the emit producer's **transaction coordinator** (the leader of its
`__transaction_state` partition, found with FindCoordinator): under load a transaction is open
at that moment, and its `AddPartitionsToTxn`, `AddOffsetsToTxn` or `EndTxn` meets a dead
broker, then a new coordinator that has to load the transaction's state.

Figures of one kill (`BrokerKill`):

* `no_progress_s`: from the SIGKILL until the worker's committed offsets had moved again on
  EVERY partition of the raw topic (`<app id>-normalize`) and of the repartition topic
  (`<app id>-emit`): the longest any part of the stream stood still. Partitions the killed
  broker did not lead may go on sooner (`first_progress_s`); those it led wait for the
  controllers to notice it is gone and move their leadership, and for the harness's producer
  (a bridge's settings: idempotent, acks=all) to write to them again.
* `first_progress_s`: from the SIGKILL until any partition's committed offset moved.
* `restarted_s`: from the SIGKILL until the restarted broker answered again (it is kept down
  until the stream has progressed everywhere, then started).
* `in_sync_s`: from the restart until every partition of every topic (the stream's and
  Kafka's own) had all its replicas in sync again.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError

from dev.kafka.private import PrivateCluster

PROGRESS_TIMEOUT_S = 180.0
IN_SYNC_TIMEOUT_S = 240.0
PROBE_INTERVAL_S = 0.25
TRANSACTION_COORDINATOR = 1
"""FindCoordinator's key type for a transactional id (0 is a group)."""

T = TypeVar("T")
Described = list[dict[str, Any]]
"""aiokafka's describe_topics answer: one dict per topic, `partitions` with leader/replicas/isr"""


@dataclass
class BrokerKill:
    """One SIGKILL of a broker under load; see the module docstring."""

    node: int
    role: str
    """`leader` (of most of the stream's partitions) or `coordinator` (of its transactions)"""
    led: int
    """partitions of the stream's topics it led when it was killed"""
    partitions: int
    """partitions of the stream's topics in all"""
    no_progress_s: float | None = None
    first_progress_s: float | None = None
    restarted_s: float | None = None
    in_sync_s: float | None = None

    def describe(self) -> str:
        def seconds(value: float | None) -> str:
            return "NOT" if value is None else f"{value:.1f} s"

        return (
            f"node {self.node}, {self.role} (led {self.led}/{self.partitions}): "
            "every partition progressed "
            f"after {seconds(self.no_progress_s)} (the first after "
            f"{seconds(self.first_progress_s)}); back after {seconds(self.restarted_s)}, "
            f"in sync {seconds(self.in_sync_s)} later"
        )


Committed = dict[TopicPartition, int]


async def _committed(bootstrap: str, groups: dict[str, str]) -> Committed:
    """The committed offset of every partition of each group's topic ({group: topic})."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    await admin.start()
    try:
        out: Committed = {}
        for group, topic in groups.items():
            offsets = await admin.list_consumer_group_offsets(group)
            out.update({tp: meta.offset for tp, meta in offsets.items() if tp.topic == topic})
        return out
    finally:
        await admin.close()


async def _describe(bootstrap: str, topics: Sequence[str] | None) -> Described:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    await admin.start()
    try:
        described: Described = await admin.describe_topics(
            list(topics) if topics is not None else None
        )
        return described
    finally:
        await admin.close()


async def _coordinator(bootstrap: str, transactional_id: str) -> int:
    """The node coordinating `transactional_id`'s transactions (FindCoordinator, key type 1)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    await client.bootstrap()
    try:
        node: int = await client.coordinator_lookup(TRANSACTION_COORDINATOR, transactional_id)
        return node
    finally:
        await client.close()


def _probe(make: Callable[[], Awaitable[T]]) -> T | None:
    """One look at the cluster; None when it cannot answer now (a broker is away)."""

    async def bounded() -> T:
        return await asyncio.wait_for(make(), 15)

    try:
        return asyncio.run(bounded())
    except (KafkaError, OSError, TimeoutError):
        return None


def leaders(described: Described) -> Counter[int]:
    """How many partitions each node leads (a leaderless partition counts for node -1)."""
    return Counter(
        int(partition["leader"]) for topic in described for partition in topic["partitions"]
    )


def short_of_replicas(described: Described) -> int:
    """Partitions whose in-sync replicas are fewer than their replicas."""
    return sum(
        1
        for topic in described
        for partition in topic["partitions"]
        if len(partition["isr"]) < len(partition["replicas"])
    )


class ClusterFaults:
    """SIGKILLs the broker leading most of the stream's partitions, and brings it back."""

    def __init__(
        self,
        cluster: PrivateCluster,
        app_id: str,
        raw: str,
        repartition: str,
        stream_topics: Sequence[str],
        transactional_id: str | None = None,
    ) -> None:
        self.cluster = cluster
        self.groups = {f"{app_id}-normalize": raw, f"{app_id}-emit": repartition}
        self.stream_topics = list(stream_topics)
        self.transactional_id = transactional_id
        """The emit producer's (exactly_once), for `kill_coordinator`."""

    def committed(self) -> Committed | None:
        return _probe(lambda: _committed(self.cluster.bootstrap, self.groups))

    def describe(self, topics: Sequence[str] | None) -> Described | None:
        described = _probe(lambda: _describe(self.cluster.bootstrap, topics))
        if described is None or any(topic["error_code"] for topic in described):
            return None
        return described

    def wait_in_sync(self, timeout_s: float = IN_SYNC_TIMEOUT_S) -> bool:
        """Until every partition of every topic has all its replicas in sync."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            described = self.describe(None)  # every topic, Kafka's own included
            if (
                described is not None
                and set(self.stream_topics) <= {topic["topic"] for topic in described}
                and short_of_replicas(described) == 0
            ):
                return True
            time.sleep(1.0)
        return False

    def kill_leader(self) -> BrokerKill:
        """One fault: SIGKILL, progress measured, restart, back in sync (module docstring)."""
        described, before = self._before()
        led = leaders(described)
        node = max(self.cluster.node_ids, key=lambda node_id: (led[node_id], -node_id))
        return self._kill(BrokerKill(node, "leader", led[node], sum(led.values())), before)

    def kill_coordinator(self) -> BrokerKill:
        """The same fault on the emit producer's transaction coordinator."""
        if self.transactional_id is None:
            raise SystemExit("a coordinator kill needs the emit stage's transactional id")
        transactional_id = self.transactional_id
        described, before = self._before()
        node = _probe(lambda: _coordinator(self.cluster.bootstrap, transactional_id))
        if node is None:
            raise SystemExit(f"cannot find the transaction coordinator of {transactional_id}")
        led = leaders(described)
        return self._kill(BrokerKill(node, "coordinator", led[node], sum(led.values())), before)

    def _before(self) -> tuple[Described, Committed]:
        described = self.describe(self.stream_topics)
        before = self.committed()
        if described is None or not before:
            raise SystemExit("cannot read the stream's topics and offsets before a broker kill")
        return described, before

    def _kill(self, kill: BrokerKill, before: Committed) -> BrokerKill:
        node = kill.node
        killed_at = time.monotonic()
        self.cluster.kill(node)
        while time.monotonic() - killed_at < PROGRESS_TIMEOUT_S:
            now = self.committed()
            elapsed = time.monotonic() - killed_at
            if now is not None:
                moved = [now.get(tp, -1) > offset for tp, offset in before.items()]
                if kill.first_progress_s is None and any(moved):
                    kill.first_progress_s = elapsed
                if all(moved):
                    kill.no_progress_s = elapsed
                    break
            time.sleep(PROBE_INTERVAL_S)
        self.cluster.start()
        restarted_at = time.monotonic()
        kill.restarted_s = restarted_at - killed_at
        if self.wait_in_sync():
            kill.in_sync_s = time.monotonic() - restarted_at
        return kill
