"""The Kafka Streams contestant of `make bench`: the pipeline's job on the JVM (SameJob.java).

It writes what the pipeline writes (issue 32 item 1): the canonical event with `raw` through
its repartition topic and on its output and stale topics, the CloudEvents headers, dead
letters with the pipeline's headers, under the bench configuration's instance rules and size
bound (`job_args` passes them from the pipeline's own Settings).

`build()` compiles it with Maven on first use (pom.xml beside this file; the same `mvn` and
~/.m2 cache as dev/kafka/localkafka.py's broker jars, so offline after the first fetch) into
~/.cache/storage-events/kstreams-bench/<hash of the sources>/; `run()` starts one JVM that
first runs the whole job untimed on the filled topic with another application id (warming
the JIT), then the timed pass. The timed figure runs from the first record the timed pass
reads to the moment its last output is readable `read_committed`; the CPU is the JVM's, all
threads (/proc/<pid>/stat), over the same span.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from benchmarks.harness import kafka_settings
from streams.config import Settings
from streams.core.records import CE_DATASCHEMA_BYTES
from streams.engine.topics import EVENT_MAX_MESSAGE_BYTES

HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
SOURCES = sorted((HERE / "src").rglob("*.java"))
CACHE = Path.home() / ".cache" / "storage-events" / "kstreams-bench"


class BuildError(RuntimeError):
    """Maven could not build the job; the message names its log."""


def _fingerprint() -> str:
    digest = hashlib.sha256(POM.read_bytes())
    for source in SOURCES:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def build() -> str:
    """The job's class path (its jar and its dependencies), built once per source version."""
    target = CACHE / _fingerprint()
    done = target / ".complete"
    if not done.exists():
        mvn = shutil.which("mvn")
        if mvn is None or shutil.which("java") is None:
            raise BuildError("the Kafka Streams job needs `mvn` and `java` (17+) on PATH")
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        log = target / "mvn.log"
        with log.open("w") as out:
            result = subprocess.run(
                [
                    *(mvn, "-B", "-q", "-f", str(POM), f"-Dbuild.dir={target}"),
                    *("package", "dependency:copy-dependencies", "-DincludeScope=runtime"),
                    f"-DoutputDirectory={target / 'lib'}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if result.returncode != 0 or not (target / "kstreams-bench-1.jar").exists():
            raise BuildError(f"mvn could not build the Kafka Streams job (see {log})")
        done.touch()
    return f"{target / 'kstreams-bench-1.jar'}:{target / 'lib'}/*"


@dataclass
class StreamsRun:
    """One timed pass: its rate, its JVM's CPU, and the ids on each of its output topics."""

    rate: float
    cpu_seconds: float
    deliveries: int
    counts: dict[str, int]
    emitted: set[str] = field(default_factory=set)
    stale: set[str] = field(default_factory=set)
    topics: tuple[str, str, str] = ("", "", "")
    """Its output, stale and dead-letter topics."""

    @property
    def cpu_per_delivery_us(self) -> float:
        return self.cpu_seconds / self.deliveries * 1e6


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _lines(stream: IO[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line.rstrip("\n"))
    into.put("")


def _next(
    lines: queue.Queue[str], prefix: str, process: subprocess.Popen[str], timeout: float
) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        if line.startswith(prefix):
            return line
        if line == "" and process.poll() is not None:
            break
    raise RuntimeError(f"the Kafka Streams job gave no `{prefix}` line (exit {process.poll()})")


def job_args(settings: Settings) -> list[str]:
    """The job's arguments for what the pipeline reads from `settings`: its one instance's
    rules (name, bucket, prefix, sources), dedupe TTL and deleted-mark grace, the clock-skew
    bound, the events a delivery may hold per source, the event records' size bound and the
    `ce_dataschema` URI."""
    if len(settings.instances) != 1:
        raise ValueError("the Kafka Streams job runs the configuration of one instance")
    instance = settings.instances[0]
    if instance.plugins:
        raise ValueError("the Kafka Streams job applies no instance plugins")
    grace = settings.stream.deleted_mark_grace_s
    return [
        f"instance={instance.name}",
        f"bucket={instance.bucket or ''}",
        f"prefix={instance.prefix}",
        f"sources={','.join(instance.sources) if instance.sources is not None else ''}",
        f"ttl={instance.dedupe_ttl!r}",
        f"grace={grace if grace is not None else instance.dedupe_ttl!r}",
        f"skew={settings.stream.max_clock_skew_s!r}",
        f"dataschema={CE_DATASCHEMA_BYTES.decode()}",
        f"maxbytes={EVENT_MAX_MESSAGE_BYTES}",
        *(f"bound.{source}={settings.stream.events_bound(source)}" for source in JOB_SOURCES),
    ]


JOB_SOURCES = ("s3", "gcs", "azure")
"""The sources the job reads (the bench's deliveries); others are dead-lettered."""


def run(
    bootstrap: str,
    raw_topic: str,
    deliveries: int,
    decided: int,
    workdir: Path,
    create_topics: Callable[..., None],
    settings: Settings,
    warm: bool = True,
    timeout_s: float = 1800,
) -> StreamsRun:
    """Run the job on `raw_topic` (`deliveries` records, `decided` distinct events: each is
    emitted or stale once) with the rules of `settings` (`job_args`); `create_topics(*names)`
    makes its sink topics beforehand."""
    classpath = build()
    suffix = uuid.uuid4().hex[:8]
    output, stale = f"bench-ks-out-{suffix}", f"bench-ks-stale-{suffix}"
    dead_letter = f"bench-ks-dl-{suffix}"
    sinks = [output, stale, dead_letter]
    names = sinks + ([f"{sink}-warm" for sink in sinks] if warm else [])
    create_topics(*names)
    process, log = _start(
        classpath, bootstrap, raw_topic, suffix, sinks, deliveries, workdir, settings, warm
    )
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None and process.stdin is not None
    threading.Thread(target=_lines, args=(process.stdout, lines), daemon=True).start()
    consumer: Consumer | None = None
    try:
        first = int(_next(lines, "first ", process, timeout_s).split()[1]) / 1000
        cpu_at_first = cpu_seconds(process.pid)
        consumer = Consumer(
            {
                **kafka_settings(bootstrap).librdkafka_config(),
                "group.id": f"bench-ks-check-{suffix}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        ids = {output: set[str](), stale: set[str]()}
        assign_all(consumer, [output, stale])
        deadline = time.monotonic() + timeout_s
        while sum(map(len, ids.values())) < decided:
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(
                    f"the Kafka Streams job stopped at {sum(map(len, ids.values()))} of "
                    f"{decided} outputs (log: {log})"
                )
            for message in consumer.consume(num_messages=10_000, timeout=0.05):
                if message.error() is None:
                    ids[str(message.topic())].add(ce_id(message))
        ended = time.time()
        busy = cpu_seconds(process.pid) - cpu_at_first
        done = _next(lines, "done ", process, 600).split()
        counts = {k: int(v) for k, _, v in (word.partition("=") for word in done[2:])}
        process.stdin.write("stop\n")
        process.stdin.flush()
        process.wait(120)
        return StreamsRun(
            rate=deliveries / (ended - first),
            cpu_seconds=busy,
            deliveries=deliveries,
            counts=counts,
            emitted=ids[output],
            stale=ids[stale],
            topics=(output, stale, dead_letter),
        )
    finally:
        if consumer is not None:
            consumer.close()
        if process.poll() is None:
            process.kill()
            process.wait(30)


def _start(
    classpath: str,
    bootstrap: str,
    raw_topic: str,
    suffix: str,
    sinks: list[str],
    deliveries: int,
    workdir: Path,
    settings: Settings,
    warm: bool,
) -> tuple[subprocess.Popen[str], Path]:
    """The job's JVM on `raw_topic`, writing to `sinks` (output, stale, dead letter); its log."""
    output, stale, dead_letter = sinks
    log = workdir / f"kstreams-{suffix}.log"
    with log.open("w") as err:
        process = subprocess.Popen(
            [
                *(
                    "java",
                    "-Xms512m",
                    "-Xmx1g",
                    "-cp",
                    classpath,
                    "dev.storageevents.bench.SameJob",
                ),
                f"bootstrap={bootstrap}",
                f"input={raw_topic}",
                f"app=bench-ks-{suffix}",
                f"output={output}",
                f"stale={stale}",
                f"deadletter={dead_letter}",
                *job_args(settings),
                f"deliveries={deliveries}",
                f"state={workdir / ('ks-state-' + suffix)}",
                f"warm={1 if warm else 0}",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    return process, log


@contextlib.contextmanager
def serve(
    bootstrap: str,
    raw_topic: str,
    deliveries: int,
    workdir: Path,
    create_topics: Callable[..., None],
    settings: Settings,
) -> Iterator[str]:
    """The job running on `raw_topic` (no warm pass of its own: the latency run warms it with
    its first records) until it is left; yields its output topic. `deliveries`: how many the
    caller publishes (the job keeps running after them until stopped)."""
    suffix = uuid.uuid4().hex[:8]
    sinks = [f"bench-ks-out-{suffix}", f"bench-ks-stale-{suffix}", f"bench-ks-dl-{suffix}"]
    create_topics(*sinks)
    process, _ = _start(
        build(), bootstrap, raw_topic, suffix, sinks, deliveries, workdir, settings, False
    )
    try:
        yield sinks[0]
    finally:
        process.kill()
        process.wait(30)


def ce_id(message: Message) -> str:
    """The event id an output record carries (its `ce_id` header, as the pipeline writes)."""
    value = dict(message.headers() or [])["ce_id"]
    return value.decode() if isinstance(value, bytes) else str(value)


def assign_all(consumer: Consumer, topics: list[str]) -> None:
    """Every partition of `topics` from its start (no group coordination: nothing to wait for)."""
    partitions = []
    metadata = consumer.list_topics(timeout=30)
    for topic in topics:
        for number in metadata.topics[topic].partitions:
            partitions.append(TopicPartition(topic, number, OFFSET_BEGINNING))
    consumer.assign(partitions)
