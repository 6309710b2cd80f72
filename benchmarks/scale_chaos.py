"""Scale-out chaos run: membership changes of a 3-worker group under load, output compared
with the ground truth (issue 15, "What it must show").

    python -m benchmarks.scale_chaos [--deliveries 90000] [--rate 750] [--partitions 8]
                                     [--session-timeout-s 10] [--group-protocol consumer|classic]
                                     [--private-broker] [--seed 11] [--json FILE]

The workload, its producer, the reading of the topics and the comparison with the ground
truth are benchmarks/chaos.py's (`build_workload`, `Producer`, `read_topic`, `compare`; see
its docstring for what lost, duplicated, legitimately stale and an order violation are).
The broker is `KAFKA_BOOTSTRAP_SERVERS` (else the local one; `--private-broker` starts one of
its own): nothing here restarts it, and the run's topics and groups have names of their own.

Three workers (`faust -A streams worker`, each with its own state directory, web port and
static group instance id `<app id>-w<n>`), one group per stage, `--partitions` partitions,
exactly_once. While the producer writes at `--rate`, one membership change after another
(each waiting for the group to settle, with a few seconds of steady flow in between):

1. scale-out 1 -> 3: w0 runs alone from the start; w1 and w2 start;
2. SIGKILL of w1, kept down past the session timeout (+3 s), then started again;
3. w2 frozen with SIGSTOP past its session timeout (+3 s), then resumed with SIGCONT;
4. scale-in 3 -> 2: w2 is told to stop and leave for good (SIGUSR1, streams.engine.membership).

Meanwhile a sampler describes both stage groups every 0.2 s (who owns which partition:
streams.engine.membership.describe_group, either group protocol; while a classic group rebalances
nobody does) and reads their committed offsets and the topics'
end offsets. Per partition it reports the seconds without an owner (no member assigned, or
the group rebalancing) and the longest stall (records waiting while its committed offset did
not move: this includes the time a dead or frozen member still held it). Per membership
change it reports how many partitions kept their owner through it and the longest pause among
those (whether the partitions a change does not move keep flowing).

Every worker process is polled: one that exits without the run having stopped it is an
unexpected exit, reported with the error its log ends with, and started again so the run can
go on (as Kubernetes would). After scale-in, "processed again" is the time from the leaving
worker's exit until the committed offset of every partition it owned (both stages) moved.

The run fails (exit 1) on any lost change, duplicate, order violation, missing dead letter,
unexpected worker exit, or a scale-in whose partitions took more than 5 s to be processed
again. `--group-protocol` sets `STREAMS_GROUP_PROTOCOL` for the workers (the rest of the
environment is passed through as it is).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from benchmarks.chaos import Producer, Result, build_workload, compare, lag_now, read_topic
from benchmarks.harness import (
    PrivateBroker,
    WorkerProcess,
    bootstrap_servers,
    finish_on_sigterm,
    free_port,
)
from streams.engine.membership import admin_client, describe_group

PROCESSED_AGAIN_WITHIN_S = 5.0
SAMPLE_EVERY_S = 0.2
ERROR_WORDS = ("ProducerFenced", "Fenced", "Error", "error", "Traceback", "crash")


# ------------------------------------------------------------------------------ the fleet


@dataclass
class Exit:
    worker: str
    code: int | None
    at_s: float
    phase: str
    cause: str


class Fleet:
    """The workers; notices the exits the run did not cause and starts those workers again."""

    def __init__(self, base_env: dict[str, str], app_id: str, workdir: Path, count: int) -> None:
        self.started = time.monotonic()
        self.phase = "start"
        self.unexpected: list[Exit] = []
        self.workers: dict[str, WorkerProcess] = {}
        self.expected_down: set[str] = set(f"w{n}" for n in range(count))
        for n in range(count):
            name = f"w{n}"
            env = {
                **base_env,
                "STREAMS_DATA_DIR": str(workdir / name / "state"),
                "STREAMS_WEB_PORT": str(free_port()),
                "STREAMS_GROUP_INSTANCE_ID": f"{app_id}-{name}",
            }
            (workdir / name).mkdir(parents=True)
            self.workers[name] = WorkerProcess(env, workdir / name / "worker.log")

    def now(self) -> float:
        return time.monotonic() - self.started

    def start(self, name: str) -> None:
        self.expected_down.discard(name)
        self.workers[name].start()

    def wait_ready(self, names: list[str], timeout_s: float = 180) -> float:
        began = time.monotonic()
        deadline = began + timeout_s
        while not all(self.workers[name].ready() for name in names):
            self.check()
            if time.monotonic() > deadline:
                waiting = [name for name in names if not self.workers[name].ready()]
                raise SystemExit(
                    f"{names} not ready after {timeout_s:.0f} s\n"
                    + "\n".join(f"{name}: {self.workers[name].why_not_ready()}" for name in waiting)
                )
            time.sleep(0.1)
        return time.monotonic() - began

    def signal(self, name: str, signum: signal.Signals, expect_exit: bool) -> None:
        if expect_exit:
            self.expected_down.add(name)
        process = self.workers[name].process
        assert process is not None
        process.send_signal(signum)

    def wait_exit(self, name: str, timeout_s: float = 60) -> int:
        process = self.workers[name].process
        assert process is not None
        return process.wait(timeout_s)

    def check(self) -> None:
        """An exit the run did not cause: recorded, and the worker started again."""
        for name, worker in self.workers.items():
            process = worker.process
            if name in self.expected_down or process is None or process.poll() is None:
                continue
            exit_ = Exit(name, process.returncode, self.now(), self.phase, _cause(worker.log))
            self.unexpected.append(exit_)
            print(
                f"#   UNEXPECTED: {name} exited by itself (code {exit_.code}) during "
                f"{exit_.phase}: {exit_.cause}; starting it again",
                flush=True,
            )
            worker.start()

    def watch(self, seconds: float) -> None:
        """Sleep `seconds`, polling every process."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            self.check()
            time.sleep(min(0.1, max(0.0, until - time.monotonic())))

    def stop_all(self) -> None:
        self.expected_down.update(self.workers)
        for worker in self.workers.values():
            process = worker.process
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGCONT)  # a frozen one could not stop
        for worker in self.workers.values():
            worker.stop()


def _cause(log: Path) -> str:
    """The last line of a worker's log naming an error (why it exited)."""
    try:
        lines = log.read_text(errors="replace").splitlines()[-400:]
    except OSError:
        return "(no log)"
    for words in (("ProducerFenced",), ERROR_WORDS):
        for line in reversed(lines):
            found = [line.find(word) for word in words if word in line]
            if found:
                return line[min(found) :].strip()[:200]
    return lines[-1].strip()[:200] if lines else "(empty log)"


# ------------------------------------------------------------------------------ the sampler

MEMBER = re.compile(r"-(w\d+)-(?:normalize|emit)(?:-|$)")


def worker_of(member_id: str) -> str:
    """`w1` from a member's group.instance.id `<app id>-w1-emit`; a member without one is
    shown by its id's start."""
    found = MEMBER.search(member_id)
    return found.group(1) if found else member_id[:12]


@dataclass
class PartitionFigures:
    unowned_s: float = 0.0
    longest_stall_s: float = 0.0
    owners: list[str] = field(default_factory=list)
    """the distinct owners, in order"""


class Sampler(threading.Thread):
    """Every SAMPLE_EVERY_S: owners, committed offsets and end offsets of both stage groups."""

    def __init__(self, bootstrap: str, groups: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.groups = groups
        """group id -> the topic it consumes"""
        self.figures: dict[tuple[str, int], PartitionFigures] = defaultdict(PartitionFigures)
        """(group, partition) -> figures"""
        self.owner: dict[tuple[str, int], str | None] = {}
        self.committed: dict[tuple[str, int], int] = {}
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.samples = 0
        self.error: BaseException | None = None
        self._progress_at: dict[tuple[str, int], float] = {}
        self.history: list[tuple[float, tuple[str, int], str | None, int, int]] = []
        """(time, (group, partition), owning worker, committed offset, end offset)"""

    def run(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    async def _run(self) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=5000)
        describer = admin_client(
            self.bootstrap
        )  # either group protocol (streams.engine.membership)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=None, isolation_level="read_committed"
        )
        await admin.start()
        await consumer.start()
        try:
            partitions: dict[str, list[TopicPartition]] = {}
            for topic in self.groups.values():
                await consumer._client.add_topic(topic)
                partitions[topic] = [
                    TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))
                ]
            previous = time.monotonic()
            while not self.halt.is_set():
                began = time.monotonic()
                # a missed sample (Kafka slow to answer): the next one covers its interval
                with contextlib.suppress(KafkaError, KafkaException, OSError, TimeoutError):
                    await self._sample(admin, describer, consumer, partitions, began - previous)
                    previous = began
                await asyncio.sleep(SAMPLE_EVERY_S)
        finally:
            await consumer.stop()
            await admin.close()

    async def _sample(
        self,
        admin: AIOKafkaAdminClient,
        describer: AdminClient,
        consumer: AIOKafkaConsumer,
        partitions: dict[str, list[TopicPartition]],
        elapsed: float,
    ) -> None:
        now = time.monotonic()
        ends = await consumer.end_offsets([tp for tps in partitions.values() for tp in tps])
        for group, topic in self.groups.items():
            view = describe_group(describer, group)  # blocks this sampler's loop: a few ms
            owners = view.owner_of()
            committed = await admin.list_consumer_group_offsets(group)
            with self.lock:
                for tp in partitions[topic]:
                    key = (group, tp.partition)
                    figures = self.figures[key]
                    member = owners.get((topic, tp.partition))
                    self.owner[key] = member
                    name = None if member is None else worker_of(member)
                    if name is None:
                        figures.unowned_s += elapsed
                    elif not figures.owners or figures.owners[-1] != name:
                        figures.owners.append(name)
                    meta = committed.get(tp)
                    offset = meta.offset if meta is not None and meta.offset >= 0 else 0
                    self.history.append((now, key, name, offset, ends[tp]))
                    moved = offset > self.committed.get(key, -1)
                    self.committed[key] = offset
                    if moved or offset >= ends[tp] or key not in self._progress_at:
                        self._progress_at[key] = now
                    figures.longest_stall_s = max(
                        figures.longest_stall_s, now - self._progress_at[key]
                    )
            self.samples += 1

    def owned_by(self, instance: str) -> list[tuple[str, int]]:
        """(group, partition)s whose owner now is a member of group.instance.id `instance`."""
        with self.lock:
            return [
                key
                for key, member in self.owner.items()
                if member is not None and member.startswith(instance + "-")
            ]

    def offsets(self) -> dict[tuple[str, int], int]:
        with self.lock:
            return dict(self.committed)

    def kept_owner(self, since: float, until: float, touched: set[str]) -> tuple[int, float]:
        """Over a membership change from `since` to `until` (monotonic): how many partitions
        (both stages) had the same owner at its start and end, that owner not one of the
        `touched` workers (the ones the change starts, kills or stops), and the longest pause among
        them: seconds with records waiting and the committed offset not moving. Incremental
        rebalancing keeps that near the commit interval; an eager one pauses them all."""
        with self.lock:
            entries = [entry for entry in self.history if since <= entry[0] <= until]
        by_key: dict[tuple[str, int], list[tuple[float, str | None, int, int]]] = defaultdict(list)
        for at, key, owner, offset, end in entries:
            by_key[key].append((at, owner, offset, end))
        kept, longest = 0, 0.0
        for samples in by_key.values():
            first, last = samples[0][1], samples[-1][1]
            if first is None or first != last or first in touched:
                continue
            kept += 1
            progress_at, offset_before = samples[0][0], samples[0][2]
            for at, _owner, offset, end in samples[1:]:
                if offset > offset_before or offset >= end:
                    progress_at = at
                offset_before = max(offset_before, offset)
                longest = max(longest, at - progress_at)
        return kept, longest


# ------------------------------------------------------------------------------ the run


@dataclass
class Change:
    what: str
    at_s: float
    figures: str
    under_load: bool = True
    kept_owner: int = 0
    """partitions (both stages) with the same owner before and after the change"""
    kept_owner_pause_s: float = 0.0
    """the longest pause of those during the change (records waiting, no commit)"""


@dataclass
class ScaleResult:
    date: str = ""
    command: str = ""
    group_protocol: str = ""
    partitions: int = 0
    session_timeout_s: float = 0.0
    rate: float = 0.0
    data: Result = field(default_factory=Result)
    changes: list[Change] = field(default_factory=list)
    unexpected_exits: list[Exit] = field(default_factory=list)
    scale_in_processed_again_s: float | None = None
    scale_in_partitions: int = 0
    per_partition: dict[str, dict[str, float | str]] = field(default_factory=dict)
    samples: int = 0
    wall_s: float = 0.0
    failures: list[str] = field(default_factory=list)

    def table(self) -> str:
        data = self.data
        rows = [
            ("raw deliveries", f"{data.deliveries} (malformed {data.malformed_sent})"),
            ("distinct changes sent", str(data.changes_sent)),
            ("emitted (distinct ce_id)", str(data.emitted)),
            ("legitimately stale", str(data.stale)),
            ("**lost**", f"**{data.lost}**"),
            ("**duplicated**", f"**{data.duplicated}** ({data.duplicate_copies} extra records)"),
            ("**per-key order violations**", f"**{data.order_violations}**"),
            (
                "malformed sent / dead-lettered",
                f"{data.malformed_sent} / {data.malformed_dead_lettered}",
            ),
        ]
        rows += [
            (f"{change.what}" + ("" if change.under_load else " (after the load)"), change.figures)
            for change in self.changes
        ]
        rows.append(
            (
                "**worker exits the run did not cause**",
                f"**{len(self.unexpected_exits)}**"
                + "".join(
                    f"; {e.worker} during {e.phase} (code {e.code}): {e.cause[:160]}"
                    for e in self.unexpected_exits
                ),
            )
        )
        again = (
            "not measured"
            if self.scale_in_processed_again_s is None
            else f"{self.scale_in_processed_again_s:.2f} s"
        )
        rows.append(
            (
                f"**scale-in: its {self.scale_in_partitions} partitions processed again after**",
                f"**{again}** (limit {PROCESSED_AGAIN_WITHIN_S:.0f} s)",
            )
        )
        rows.append(("wall time", f"{self.wall_s:.0f} s ({self.samples} group samples)"))
        width = max(len(name) for name, _ in rows)
        lines = [
            f"scale-out chaos run {self.date}, group protocol {self.group_protocol}, "
            f"{self.partitions} partitions, session timeout {self.session_timeout_s:.0f} s, "
            f"{self.rate:.0f}/s, exactly_once: `{self.command}`",
            "",
            f"| {'measure':<{width}} | value |",
            f"|{'-' * (width + 2)}|-------|",
        ]
        lines += [f"| {name:<{width}} | {value} |" for name, value in rows]
        lines += [
            "",
            "Per partition: seconds without an owner (no member assigned, or the group "
            "rebalancing) / longest stall (records waiting, committed offset not moving) / "
            "owners in turn",
            "",
            "| partition | normalize unowned | normalize stall | emit unowned | emit stall "
            "| normalize owners | emit owners |",
            "|---|---|---|---|---|---|---|",
        ]
        for partition in sorted({int(key.split("/")[1]) for key in self.per_partition}):
            n = self.per_partition.get(f"normalize/{partition}", {})
            e = self.per_partition.get(f"emit/{partition}", {})
            lines.append(
                f"| {partition} | {n.get('unowned_s', 0):.1f} | {n.get('longest_stall_s', 0):.1f} "
                f"| {e.get('unowned_s', 0):.1f} | {e.get('longest_stall_s', 0):.1f} "
                f"| {n.get('owners', '')} | {e.get('owners', '')} |"
            )
        verdict = "PASS" if not self.failures else "FAIL: " + "; ".join(self.failures)
        lines += ["", f"result: {verdict}"]
        return "\n".join(lines)


def _wait_settled(sampler: Sampler, fleet: Fleet, members: int, timeout_s: float = 120) -> float:
    """Seconds until every partition of both groups has an owner among `members` distinct
    workers (the group settled after a change)."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        fleet.check()
        with sampler.lock:
            owners = dict(sampler.owner)
        distinct = {worker_of(member) for member in owners.values() if member}
        if owners and all(owners.values()) and len(distinct) == members:
            return time.monotonic() - began
        time.sleep(0.1)
    raise SystemExit(f"the groups did not settle on {members} workers in {timeout_s:.0f} s")


def _processed_again(
    sampler: Sampler, keys: list[tuple[str, int]], fleet: Fleet, timeout_s: float = 60
) -> float | None:
    """Seconds until the committed offset of every one of `keys` moved past where it was."""
    began = time.monotonic()
    seen = sampler.samples
    while sampler.samples < seen + 2 * len(sampler.groups):  # offsets read after `began`
        time.sleep(0.02)
    before = sampler.offsets()
    waiting = set(keys)
    while waiting and time.monotonic() - began < timeout_s:
        fleet.check()
        now = sampler.offsets()
        waiting = {key for key in waiting if now.get(key, -1) <= before.get(key, -1)}
        time.sleep(0.05)
    return None if waiting else time.monotonic() - began


def run(args: argparse.Namespace, command: str) -> ScaleResult:
    started = time.monotonic()
    result = ScaleResult(
        date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        command=command,
        group_protocol=args.group_protocol
        or os.environ.get("STREAMS_GROUP_PROTOCOL", "consumer (default)"),
        partitions=args.partitions,
        session_timeout_s=args.session_timeout_s,
        rate=args.rate,
    )
    data = result.data
    data.deliveries, data.guarantee = args.deliveries, "exactly_once"
    print(f"# building {args.deliveries} deliveries ...", flush=True)
    work = build_workload(args.deliveries, args.keys, args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="scale-chaos-"))
    broker = PrivateBroker(workdir / "kafka") if args.private_broker else None
    if broker is not None:
        print(f"# starting a private broker in {workdir / 'kafka'} ...", flush=True)
        broker.start()
    bootstrap = broker.bootstrap if broker is not None else bootstrap_servers()
    app_id = f"scale-{uuid.uuid4().hex[:8]}"
    raw, output, stale_topic, dead = (
        f"{app_id}.{name}" for name in ("raw", "events", "stale", "dlq")
    )
    config = workdir / "streams.toml"
    config.write_text(
        f'[stream]\napp_id = "{app_id}"\nraw_topics = ["{raw}"]\n'
        f'repartition_topic = "{app_id}.by-key"\ndead_letter_topic = "{dead}"\n'
        f'partitions = {args.partitions}\nprocessing_guarantee = "exactly_once"\n'
        f"session_timeout_s = {args.session_timeout_s}\n"
        f'[[instances]]\nname = "default"\ntopic = "{output}"\nstale_topic = "{stale_topic}"\n'
    )
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "STREAMS_CONFIG": str(config)}
    env.pop("STREAMS_FAILPOINT", None)
    env.pop("STREAMS_LEAVE_GROUP_ON_STOP", None)
    if args.group_protocol:
        env["STREAMS_GROUP_PROTOCOL"] = args.group_protocol
    fleet = Fleet(env, app_id, workdir, 3)
    groups = {f"{app_id}-normalize": raw, f"{app_id}-emit": f"{app_id}.by-key"}
    sampler = Sampler(bootstrap, groups)
    producer = Producer(bootstrap, raw, work.deliveries, args.rate)
    away = args.session_timeout_s + 3.0
    keep = False

    window = {"since": 0.0}

    def change(what: str, figures: str, touched: set[str]) -> None:
        kept, pause = sampler.kept_owner(window["since"], time.monotonic(), touched)
        figures += (
            f"; {kept} partitions kept their owner, their longest pause {pause:.1f} s"
            if kept
            else "; no partition kept its owner"
        )
        result.changes.append(
            Change(what, fleet.now(), figures, producer.is_alive(), kept, round(pause, 2))
        )
        print(f"#   {what}: {figures}", flush=True)

    def step(phase: str, action: Callable[[], None]) -> None:
        fleet.phase = phase
        fleet.watch(args.steady_s)
        window["since"] = time.monotonic()
        action()

    try:
        fleet.phase = "start"
        fleet.start("w0")
        fleet.wait_ready(["w0"])
        sampler.start()
        _wait_settled(sampler, fleet, 1)
        print(f"# w0 ready; producing for ~{args.deliveries / args.rate:.0f} s", flush=True)
        producer.start()

        def scale_out() -> None:
            began = time.monotonic()
            fleet.start("w1")
            fleet.start("w2")
            ready = fleet.wait_ready(["w1", "w2"])
            _wait_settled(sampler, fleet, 3)
            change(
                "scale-out 1 -> 3",
                f"w1, w2 ready {ready:.1f} s after their start; both groups on 3 workers "
                f"{time.monotonic() - began:.1f} s after it",
                {"w1", "w2"},
            )

        def kill_past_session() -> None:
            fleet.signal("w1", signal.SIGKILL, expect_exit=True)
            fleet.wait_exit("w1")
            fleet.watch(away)
            fleet.start("w1")
            ready = fleet.wait_ready(["w1"])
            _wait_settled(sampler, fleet, 3)
            change(
                "SIGKILL w1, down past the session timeout",
                f"down {away:.0f} s; ready {ready:.1f} s after its restart",
                {"w1"},
            )

        def freeze_past_session() -> None:
            exits_before = len(fleet.unexpected)
            fleet.signal("w2", signal.SIGSTOP, expect_exit=False)
            fleet.watch(away)
            fleet.signal("w2", signal.SIGCONT, expect_exit=False)
            resumed = time.monotonic()
            fleet.watch(args.session_timeout_s)  # a crash on resume comes within this
            crashed = [e for e in fleet.unexpected[exits_before:] if e.worker == "w2"]
            fleet.wait_ready(["w2"])
            _wait_settled(sampler, fleet, 3)
            outcome = (
                f"w2 EXITED after SIGCONT (code {crashed[0].code}) and was started again"
                if crashed
                else "w2 carried on after SIGCONT"
            )
            change(
                "SIGSTOP w2 past the session timeout, then SIGCONT",
                f"frozen {away:.0f} s; {outcome}; w2 ready and both groups on 3 workers "
                f"{time.monotonic() - resumed:.1f} s after SIGCONT",
                {"w2"},
            )

        def scale_in() -> None:
            instance = f"{app_id}-w2"
            owned = sampler.owned_by(instance)
            result.scale_in_partitions = len(owned)
            signalled = time.monotonic()
            fleet.signal("w2", signal.SIGUSR1, expect_exit=True)
            code = fleet.wait_exit("w2")
            exited = time.monotonic()
            again = _processed_again(sampler, owned, fleet)
            result.scale_in_processed_again_s = again
            _wait_settled(sampler, fleet, 2)
            change(
                "scale-in 3 -> 2 (w2: SIGUSR1, leave for good)",
                f"w2 stopped in {exited - signalled:.1f} s (exit {code}); its {len(owned)} "
                f"partitions processed again "
                + ("NOT within 60 s" if again is None else f"{again:.2f} s")
                + " after its exit",
                {"w2"},
            )

        step("scale-out", scale_out)
        step("SIGKILL", kill_past_session)
        step("SIGSTOP", freeze_past_session)
        step("scale-in", scale_in)
        fleet.phase = "drain"
        while producer.is_alive():
            fleet.watch(0.5)
        if producer.error is not None:
            raise SystemExit(f"the producer failed: {producer.error!r}")
        print("# production done; waiting for the workers to drain ...", flush=True)
        deadline = time.monotonic() + args.drain_timeout_s
        settled_count = 0
        while settled_count < 2:
            if time.monotonic() > deadline:
                result.failures.append(f"the workers did not drain in {args.drain_timeout_s} s")
                break
            fleet.check()
            lags = [lag_now(bootstrap, group, [topic]) for group, topic in groups.items()]
            drained = all(lag is not None and lag[0] == 0 for lag in lags)
            settled_count = settled_count + 1 if drained else 0
            fleet.watch(0.5)
        sampler.halt.set()
        sampler.join(10)
        fleet.stop_all()
        print("# reading the output, stale and dead-letter topics ...", flush=True)
        outputs = asyncio.run(read_topic(bootstrap, output))
        stale = asyncio.run(read_topic(bootstrap, stale_topic))
        dead_letters = asyncio.run(read_topic(bootstrap, dead))
        compare(work, outputs, stale, dead_letters, data)
        result.failures.extend(data.failures)
        if data.duplicated:
            result.failures.append(f"{data.duplicated} changes emitted more than once")
        result.unexpected_exits = list(fleet.unexpected)
        if fleet.unexpected:
            result.failures.append(
                f"{len(fleet.unexpected)} worker exit(s) the run did not cause: "
                + ", ".join(f"{e.worker} during {e.phase}" for e in fleet.unexpected)
            )
        again = result.scale_in_processed_again_s
        if again is None or again > PROCESSED_AGAIN_WITHIN_S:
            result.failures.append(
                "after scale-in the stopped worker's partitions were not processed again "
                f"within {PROCESSED_AGAIN_WITHIN_S:.0f} s"
            )
        if not all(change.under_load for change in result.changes):
            result.failures.append("a membership change came after the load (raise --deliveries)")
        result.samples = sampler.samples
        for (group, partition), figures in sorted(sampler.figures.items()):
            stage = group.rsplit("-", 1)[1]
            result.per_partition[f"{stage}/{partition}"] = {
                "unowned_s": round(figures.unowned_s, 2),
                "longest_stall_s": round(figures.longest_stall_s, 2),
                "owners": " ".join(figures.owners),
            }
        keep = bool(result.failures) or args.keep
    finally:
        sampler.halt.set()
        fleet.stop_all()
        if broker is not None:
            broker.stop()
        if keep:
            print(f"# kept {workdir} (w*/worker.log)", flush=True)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result.wall_s = time.monotonic() - started
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=90_000)
    parser.add_argument("--rate", type=float, default=750.0, help="raw deliveries per second")
    parser.add_argument("--keys", type=int, default=2000, help="distinct object keys per source")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--session-timeout-s", type=float, default=10.0)
    parser.add_argument(
        "--steady-s", type=float, default=5.0, help="steady flow before each membership change"
    )
    parser.add_argument(
        "--group-protocol",
        choices=("consumer", "classic"),
        help="STREAMS_GROUP_PROTOCOL for the workers (default: the environment's, if any)",
    )
    parser.add_argument("--private-broker", action="store_true")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--drain-timeout-s", type=float, default=300.0)
    parser.add_argument("--keep", action="store_true", help="keep the run's directory")
    parser.add_argument("--json", type=Path, help="also write the figures here, as JSON")
    args = parser.parse_args(argv)
    finish_on_sigterm()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    random.seed(args.seed)
    command = "python -m benchmarks.scale_chaos " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    result = run(args, command.strip())
    print(result.table(), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(result), indent=2))
    return 1 if result.failures else 0


if __name__ == "__main__":
    sys.exit(main())
