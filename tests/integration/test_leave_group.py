"""Leaving for good (issue 15, item 4): a static member that will not come back leaves its
groups at once, so its partitions are processed again within 5 s instead of after the session
timeout (30 s here). Two real workers, one group, the real broker (streams.engine.membership)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from support.kafka_io import read_topic
from support.payloads import s3_body, s3_record
from support.worker import ROOT, Topology, Worker, wait_for

from streams.engine.membership import GroupView, admin_client, describe_group

SESSION_TIMEOUT_S = 30
PROCESSED_AGAIN_WITHIN_S = 5.0

pytestmark = pytest.mark.slow  # two workers started per test


def group_view(bootstrap: str, group: str) -> GroupView:
    return describe_group(admin_client(bootstrap), group)


def members_of(bootstrap: str, group: str) -> set[str]:
    """The workers (worker-a, worker-b) with a static member in the group (group.instance.id
    `worker-a`, `worker-a-emit`, ...)."""
    return {"-".join(member.split("-")[:2]) for member in group_view(bootstrap, group).owners}


def send_keys(bootstrap: str, topic: str, tag: str, count: int = 16) -> set[str]:
    """`count` new S3 objects, spread over both raw partitions; their keys."""
    keys = {f"leave/{tag}/{number:02d}.bin" for number in range(count)}

    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for number, key in enumerate(sorted(keys)):
                body = s3_body(s3_record(key, f"{number + 1:016X}"))
                await producer.send_and_wait(
                    topic, body, partition=number % 2, headers=[("source", b"s3")]
                )
        finally:
            await producer.stop()

    asyncio.run(send())
    return keys


def emitted_keys(bootstrap: str, topic: str) -> set[str]:
    return {read.json()["key"] for read in asyncio.run(read_topic(bootstrap, topic))}


@pytest.fixture
def two_workers(
    request: pytest.FixtureRequest, kafka_bootstrap: str, tmp_path: Path
) -> Iterator[tuple[Topology, Worker, Worker]]:
    """worker-a and worker-b, static members of one app (2 partitions: one each); worker-a
    with the environment the test's parameter gives, if any."""
    names = Topology()
    config = names.config(extra=f"session_timeout_s = {SESSION_TIMEOUT_S}")
    workers = [
        Worker(
            kafka_bootstrap,
            config,
            tmp_path / name,
            env={"STREAMS_GROUP_INSTANCE_ID": name, **extra},
        )
        for name, extra in (
            ("worker-a", getattr(request, "param", {})),
            ("worker-b", {}),
        )
    ]
    for worker in workers:
        worker.start()
    try:
        for group in (f"{names.app_id}-normalize", f"{names.app_id}-emit"):
            wait_for(
                lambda group=group: (
                    all(owned for owned in group_view(kafka_bootstrap, group).owners.values())
                    and members_of(kafka_bootstrap, group) == {"worker-a", "worker-b"}
                ),
                60,
                f"both workers to own partitions of {group}",
            )
        for worker in workers:
            worker.wait_ready()
        yield names, workers[0], workers[1]
    finally:
        for worker in workers:
            worker.kill()


def processed_again(
    bootstrap: str, names: Topology, b: Worker, since: float, tag: str
) -> tuple[float, float]:
    """Seconds from `since` until b owns every partition of both stage groups, and until b
    emitted new objects sent to every partition after that."""
    wait_for(
        lambda: b_owns_everything(bootstrap, names),
        SESSION_TIMEOUT_S * 2,
        "the remaining worker to own every partition",
        interval_s=0.05,
    )
    owned = time.monotonic() - since
    keys = send_keys(bootstrap, names.raw, tag)
    wait_for(
        lambda: keys <= emitted_keys(bootstrap, names.output("default")),
        SESSION_TIMEOUT_S * 2,
        "the remaining worker to emit the objects of every partition",
    )
    assert b.process is not None and b.process.poll() is None, b.tail()
    return owned, time.monotonic() - since


def b_owns_everything(bootstrap: str, names: Topology) -> bool:
    for group, topic in (
        (f"{names.app_id}-normalize", names.raw),
        (f"{names.app_id}-emit", f"{names.app_id}.by-key"),
    ):
        view = group_view(bootstrap, group)
        if set(view.owner_of().values()) != {f"worker-b-{group.rsplit('-', 1)[1]}"}:
            return False
        if members_of(bootstrap, group) != {"worker-b"}:
            return False
        if sorted(view.owner_of()) != [(topic, 0), (topic, 1)]:
            return False
    return True


@pytest.mark.parametrize(
    ("two_workers", "how"),
    [
        ({}, "SIGUSR1"),
        ({"STREAMS_LEAVE_GROUP_ON_STOP": "true"}, "SIGTERM"),
        ({"STREAMS_STAGE_PROCESSES": "1"}, "SIGUSR1"),  # both members in the one process
    ],
    indirect=["two_workers"],
    ids=["SIGUSR1", "STREAMS_LEAVE_GROUP_ON_STOP", "SIGUSR1-one-process"],
)
def test_a_static_member_leaving_for_good_hands_its_partitions_over_at_once(
    kafka_bootstrap: str,
    two_workers: tuple[Topology, Worker, Worker],
    how: str,
) -> None:
    names, a, b = two_workers
    assert a.process is not None
    a.process.send_signal(getattr(signal, how))
    signalled = time.monotonic()
    assert a.process.wait(40) == 0, a.tail()
    exited = time.monotonic()
    owned, seconds = processed_again(kafka_bootstrap, names, b, exited, how)
    print(
        f"\n{how}: worker-a stopped in {exited - signalled:.2f} s; its partitions were owned "
        f"by worker-b {owned:.2f} s and processed again {seconds:.2f} s after it exited "
        f"(session timeout {SESSION_TIMEOUT_S} s)"
    )
    assert seconds <= PROCESSED_AGAIN_WITHIN_S, a.tail()
    assert b_owns_everything(kafka_bootstrap, names)
    assert "worker-a" not in members_of(kafka_bootstrap, names.app_id)  # Faust's group too
    log = a.log_path.read_text(errors="replace")
    assert f"left group {names.app_id}-emit for good (static member worker-a-emit): removed" in log


def test_remove_member_moves_a_killed_static_members_partitions_at_once(
    kafka_bootstrap: str, two_workers: tuple[Topology, Worker, Worker]
) -> None:
    names, a, b = two_workers
    a.kill()  # SIGKILL: no goodbye; the group would wait out the 30 s session
    killed = time.monotonic()
    removed = subprocess.run(
        [sys.executable, "-m", "streams", "remove-member", "--instance-id", "worker-a"],
        cwd=ROOT,
        env=a.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert removed.returncode == 0, removed.stderr
    assert f"{names.app_id}-normalize: worker-a-normalize: removed" in removed.stdout
    assert f"{names.app_id}-emit: worker-a-emit: removed" in removed.stdout
    assert f"{names.app_id}: worker-a: removed" in removed.stdout
    owned, seconds = processed_again(kafka_bootstrap, names, b, killed, "removed")
    print(
        f"\nremove-member: worker-a's partitions were owned by worker-b {owned:.2f} s and "
        f"processed again {seconds:.2f} s after its SIGKILL (session timeout "
        f"{SESSION_TIMEOUT_S} s)"
    )
    assert seconds <= PROCESSED_AGAIN_WITHIN_S, b.tail()
    assert b_owns_everything(kafka_bootstrap, names)
    again = subprocess.run(
        [sys.executable, "-m", "streams", "remove-member", "--instance-id", "worker-a"],
        cwd=ROOT,
        env=a.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 1, again.stdout  # a member of none of the groups now
    assert "worker-a-emit: not a member" in again.stdout


def test_a_plain_stop_keeps_a_static_members_partitions_for_its_restart(
    kafka_bootstrap: str, two_workers: tuple[Topology, Worker, Worker]
) -> None:
    """Static membership stays for restarts: a SIGTERM without leave-for-good sends no
    LeaveGroup, so the group keeps worker-a's partitions for it (what the tests above change
    only when told the worker is leaving for good)."""
    names, a, _b = two_workers
    assert a.process is not None
    a.process.send_signal(signal.SIGTERM)
    assert a.process.wait(40) == 0, a.tail()
    with pytest.raises(TimeoutError):
        wait_for(
            lambda: b_owns_everything(kafka_bootstrap, names),
            PROCESSED_AGAIN_WITHIN_S,
            "worker-b to be given worker-a's partitions",
        )
    assert "for good" not in a.log_path.read_text(errors="replace")
    a.start()
    wait_for(
        lambda: members_of(kafka_bootstrap, f"{names.app_id}-emit") == {"worker-a", "worker-b"},
        30,
        "worker-a to be back in the emit group",
    )
