"""The pipeline against this stack's ceiling, on the same machine, input and run (`make bench`).

    python -m benchmarks.pipeline [--deliveries 200000] [--seed 1] [--rate 2000] [--seconds 10]
        [--sections state,normalizers,webhook] [--profile FILE]
        [--contestants ceiling,floor,pipeline,pipeline-2proc,latency,librdkafka,client-floor,
                       kstreams] [--rounds 1]

    # one process against two (stream.stage_processes), alternating, 3 pairs:
    python -m benchmarks.pipeline --contestants pipeline,pipeline-2proc --sections '' --rounds 3

    # only the pipeline against the new contestants, no other sections (about a minute):
    python -m benchmarks.pipeline --contestants pipeline,librdkafka,kstreams --sections ''

On the real broker (KAFKA_BOOTSTRAP_SERVERS, else the local broker of `make kafka`), with one
raw topic (4 partitions) filled once with a fixed-seed mix weighted like real traffic (mostly
S3 via SQS/SNS and GCS pull, some Azure; 20% redeliveries in another wrapper, 5% out-of-order
pairs), three loops read the same input:

1. ceiling: a bare aiokafka loop (getmany batches, produce every record unchanged with the
   pipeline's producer settings, await the batch, commit); printed also with one record
   batch per partition instead of a `send` per record, the pipeline's own produce path;
2. engine floor: a Faust agent that consumes the topic and does nothing (benchmarks.engine_floor);
3. pipeline: the full worker (normalize, repartition, dedupe, order, output), with its CPU
   time and each stage's time split into waiting for records, handling and committing;
   `pipeline-2proc` the same worker with a process per stage (STREAMS_STAGE_PROCESSES=2);
   `--rounds N` runs the pipeline contestants (and Kafka Streams, 6.) N times, alternating,
   and prints each one's median; the closing ratios are then the medians of each round's
   pipeline / Kafka Streams pair, measured side by side;
4. the new ceiling: a bare librdkafka (confluent-kafka) consume -> produce loop, one
   transaction per batch with its offsets (benchmarks.ceiling);
5. the client floor: the pipeline's Kafka and RocksDB calls for each delivery, in its record
   counts and two stages, with no decisions (benchmarks.client_floor): what any CPython worker
   on these clients pays before it does the job's work;
6. Kafka Streams: the same job on the JVM (benchmarks/kstreams), writing what the pipeline
   writes (issue 32 item 1): stage one parses by source into the canonical event with `raw`
   and the pipeline's ids, applies the bench configuration's instance rules and size bound,
   and writes the event's JSON to its repartition topic (keyed by instance, bucket and object
   key) or a dead letter with the pipeline's headers; stage two dedupes and orders on one
   RocksDB record per key (with a changelog and caching) and writes the event's bytes with
   the CloudEvents headers to its output or stale topic; `exactly_once_v2`; the JVM warmed by
   an untimed first pass over the same topic. Then the check that it wrote what the pipeline
   did (against the pipeline's own functions run in this process, `expected_outputs`, when
   the pipeline did not run): the same ids on output and stale, each with an equal value
   (JSON parsed, compared as objects) and the same header names and values (but a dead
   letter's `error` text), and the same dead letters (`compare_outputs`); one line when so,
   the differences between `!!!` marks when not (exit status 1).

CPU per delivery: the process's user + system time (/proc/<pid>/stat, all threads) over the
timed span, divided by the deliveries: the worker's (with its child process, if any), the
JVM's, the bench process's for the librdkafka loop.

Each figure is events/s from the first input read to the last output acknowledged (for the
pipeline and Kafka Streams alike: the last decided event readable `read_committed` on the
output and stale topics, read from outside, so that neither serves a metrics page meanwhile).
Then
latency at a fixed offered load (`--rate`, `--seconds`): p50/p99 from publishing a delivery to
the raw topic until its event is readable (read_committed) on the output topic, for the
pipeline and (with the `kstreams` contestant) the Kafka Streams job, each started afresh on a
raw topic of its own and warmed by WARM_UP deliveries first, `--latency-rounds` rounds with
the jobs alternating; the last round's figures and their ratio are printed again after the
runs (`--stream-setting` passes `[stream]` settings to the latency run's worker, e.g. a batch
window; BENCH_WORKER_TREE runs another checkout's worker, for before / after rounds).
`--profile` samples the pipeline's worker with py-spy and prints where its time went
(benchmarks.profile). Then the other sections, each its own script: state
(benchmarks.restore), normalizers (benchmarks.normalizers), webhook bridge
(benchmarks.webhook). The last line is `pipeline / kafka-streams: X.XX` (events/s over
events/s; after pipeline / ceiling and the CPU ratio). A measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from confluent_kafka import Consumer, KafkaError

from benchmarks import kstreams
from benchmarks.ceiling import LoopRun, librdkafka_loop
from benchmarks.client_floor import client_floor
from benchmarks.harness import (
    FAUST,
    ROOT,
    WorkerProcess,
    bootstrap_servers,
    free_port,
    kafka_args,
    kafka_settings,
    metric_sums,
    process_tree,
)
from benchmarks.profile import report
from streams.config import StreamConfig, load_settings
from streams.core.delivery import Delivery
from streams.core.emitting import KeyedInput, plan_batch
from streams.core.normalizers import normalize
from streams.core.records import (
    OutRecord,
    RawRecord,
    dead_letter_record,
    delivery_from_raw,
    headers_dict,
    repeated_headers,
)
from streams.core.routing import route
from streams.engine.topics import RAW_MAX_MESSAGE_BYTES
from streams.stages.normalize import DECISIVE_HEADERS, route_policy

PARTITIONS = 4
PY_SPY = Path(sys.executable).with_name("py-spy")
Raw = tuple[bytes, bytes, list[tuple[str, bytes]]]


def s3_body(key: str, sequencer: str, event: str = "ObjectCreated:Put") -> bytes:
    return json.dumps(
        {
            "Records": [
                {
                    "eventVersion": "2.1",
                    "eventSource": "aws:s3",
                    "eventTime": "2026-11-30T00:00:00.000Z",
                    "eventName": event,
                    "s3": {
                        "bucket": {"name": "bench"},
                        "object": {
                            "key": key,
                            "size": 1024,
                            "eTag": "d41d8cd98f00b204e9800998ecf8427e",
                            "sequencer": sequencer,
                        },
                    },
                }
            ]
        }
    ).encode()


def sns(body: bytes, message_id: str) -> bytes:
    return json.dumps(
        {
            "Type": "Notification",
            "MessageId": message_id,
            "TopicArn": "arn:aws:sns:us-east-1:1:bench",
            "Message": body.decode(),
            "Timestamp": "2026-11-30T00:00:01.000Z",
        }
    ).encode()


def gcs(name: str, generation: int) -> tuple[bytes, list[tuple[str, bytes]]]:
    resource = {
        "name": name,
        "bucket": "bench",
        "generation": str(generation),
        "metageneration": "1",
        "size": "2048",
        "etag": "CKXgtZvZ5ooDEAE=",
        "updated": "2026-11-30T00:00:00.010Z",
    }
    attributes = {
        "eventType": "OBJECT_FINALIZE",
        "payloadFormat": "JSON_API_V1",
        "bucketId": "bench",
        "objectId": name,
        "objectGeneration": str(generation),
        "eventTime": "2026-11-30T00:00:00.010Z",
        "notificationConfig": "projects/_/buckets/bench/notificationConfigs/1",
    }
    headers = [("source", b"gcs")] + [(f"attribute.{k}", v.encode()) for k, v in attributes.items()]
    return json.dumps(resource).encode(), headers


def azure(key: str, sequence: int) -> bytes:
    return json.dumps(
        [
            {
                "topic": "/subscriptions/0/resourceGroups/rg/providers/Microsoft.Storage/"
                "storageAccounts/bench",
                "subject": f"/blobServices/default/containers/bench/blobs/{key}",
                "eventType": "Microsoft.Storage.BlobCreated",
                "eventTime": "2026-11-30T00:00:00.0000000Z",
                "id": str(uuid.UUID(int=sequence)),
                "dataVersion": "",
                "metadataVersion": "1",
                "data": {
                    "api": "PutBlob",
                    "contentLength": 1,
                    "eTag": "0x8D4BCC2E4835CD0",
                    "url": f"https://bench.blob.core.windows.net/bench/{key}",
                    "sequencer": f"{sequence:032X}",
                    "blobType": "BlockBlob",
                },
            }
        ]
    ).encode()


def workload(
    count: int, seed: int, redeliveries: float = 0.2, out_of_order: float = 0.05
) -> list[Raw]:
    """`count` raw deliveries; keys so that each key gets a handful of changes."""
    rng = random.Random(seed)
    records: list[Raw] = []
    keys = max(1, count // 8)
    while len(records) < count:
        n = len(records)
        key = f"bench/{rng.randrange(keys):07d}.bin"
        roll = rng.random()
        if roll < 0.65:
            body = s3_body(key, f"{0x0069B21FFD07000000 + n:018X}")
            first: Raw = (key.encode(), body, [("source", b"s3")])
            again: Raw = (key.encode(), sns(body, f"m-{n}"), [("source", b"s3")])
        elif roll < 0.95:
            value, headers = gcs(key, 1_700_000_000_000_000 + n)
            first = again = (key.encode(), value, headers)
        else:
            first = again = (key.encode(), azure(key, n), [("source", b"azure")])
        if rng.random() < out_of_order and records:
            older = records.pop()
            records += [first, older]  # the newer change overtakes the older one
        else:
            records.append(first)
        if rng.random() < redeliveries:
            records.append(again)
    return records[:count]


def expected_ids(records: list[Raw]) -> set[str]:
    ids: set[str] = set()
    for _, value, headers in records:
        header_map = dict(headers)
        delivery = Delivery(
            source=header_map["source"].decode(),
            body=value,
            attributes={
                k.removeprefix("attribute."): v.decode()
                for k, v in headers
                if k.startswith("attribute.")
            },
        )
        ids.update(event.id for event in normalize(delivery))
    return ids


def first_deliveries(records: list[Raw]) -> list[bytes]:
    """The values of the deliveries whose event the pipeline emits: the first of each change
    (every later one, in another wrapper or the same bytes again, is a duplicate)."""
    ids: set[str] = set()
    firsts: list[bytes] = []
    for _, value, headers in records:
        delivery = delivery_from_raw(RawRecord("raw", value, dict(headers)), None)
        new = {event.id for event in normalize(delivery)} - ids
        if new:
            ids |= new
            firsts.append(value)
    return firsts


OutputEntry = tuple[bytes, tuple[str, ...], bytes]
"""One record as the jobs are compared: a digest of its value (parsed JSON, its keys sorted, so
two values digest alike exactly when they are equal as objects; a dead letter's value as it
is), its header names in order, and a digest of its header values (but `error`'s, the
reason in each job's own words)."""
UNCOMPARED_HEADER_VALUES = frozenset({"error"})


def value_digest(value: bytes | None) -> bytes:
    """The digest of an event's JSON as an object (`OutputEntry`)."""
    try:
        parsed = orjson.loads(value or b"null")
        canonical = orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONDecodeError, TypeError):  # integers past 64 bits, which only json reads
        canonical = json.dumps(json.loads(value or b"null"), sort_keys=True).encode()
    return hashlib.sha256(canonical).digest()


_NAMES: dict[tuple[str, ...], tuple[str, ...]] = {}
"""Header name tuples, one object each (a bench run holds hundreds of thousands of records)."""


def entry(
    value: bytes | None, headers: Iterable[tuple[str, bytes | None]], parse: bool
) -> OutputEntry:
    listed = [(name, header or b"") for name, header in headers]
    names = tuple(name for name, _ in listed)
    values = hashlib.sha256()
    for name, header in listed:
        if name not in UNCOMPARED_HEADER_VALUES:
            values.update(len(header).to_bytes(4, "big") + header)
    digest = value_digest(value) if parse else hashlib.sha256(value or b"").digest()
    return digest, _NAMES.setdefault(names, names), values.digest()


@dataclass
class Outputs:
    """What one job wrote: its output and stale records by `ce_id`, its dead letters (by
    key, value and headers), and how many ids came twice to one topic."""

    output: dict[str, OutputEntry] = field(default_factory=dict)
    stale: dict[str, OutputEntry] = field(default_factory=dict)
    dead_letters: Counter[tuple[bytes | None, OutputEntry]] = field(default_factory=Counter)
    twice: int = 0

    def add(
        self, role: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, Any]]
    ) -> None:
        if role == "dead-letter":
            self.dead_letters[(key, entry(value, headers, parse=False))] += 1
            return
        ids = self.output if role == "output" else self.stale
        ce_id = dict(headers)["ce_id"]
        ce_id = ce_id.decode() if isinstance(ce_id, bytes) else str(ce_id)
        self.twice += ce_id in ids
        ids[ce_id] = entry(value, headers, parse=True)


def expected_outputs(records: list[Raw], raw_topic: str = "raw", batch: int = 1000) -> Outputs:
    """What the pipeline writes for `records` read from `raw_topic` with the bench's
    configuration (`worker_config`), by its own pure functions in this process: stage one's
    checks and `streams.core.routing.route` per delivery (keyed records and dead letters), then
    `streams.core.emitting.plan_batch` (dedupe, then order) over the keyed records in input
    order, with its state in a dict. The ground truth the Kafka Streams job is checked against
    when the pipeline did not run."""
    with tempfile.TemporaryDirectory(prefix="bench-truth-") as tmp:
        config, output = worker_config(Path(tmp), "truth", raw_topic)
        settings = load_settings(config, environ={})
    dead_letter = settings.stream.dead_letter_topic
    policy = route_policy(settings)
    outputs = Outputs()
    inputs: list[KeyedInput] = []

    def take(record: OutRecord) -> None:
        if record.topic == dead_letter:
            outputs.add("dead-letter", record.key, record.value, list(record.headers))
        elif record.topic == output:
            outputs.add("output", record.key, record.value, list(record.headers))
        else:
            outputs.add("stale", record.key, record.value, list(record.headers))

    for key, value, headers in records:
        raw = RawRecord(raw_topic, value, headers_dict(headers))
        repeated = repeated_headers(headers, DECISIVE_HEADERS)
        if len(value) > RAW_MAX_MESSAGE_BYTES or repeated:  # streams.stages.normalize
            letter = dead_letter_record(dead_letter, raw, key, "not routed", "normalize")
            if repeated:
                added = tuple(h for h in letter.headers if h[0].startswith("error"))
                letter.headers = (*((name, v or b"") for name, v in headers), *added)
            take(letter)
            continue
        for record in route(raw, key, policy).records:
            if record.topic == dead_letter:
                take(record)
            else:
                headers_of = dict(record.headers)
                inputs.append(
                    KeyedInput(record.topic, 0, record.key, record.value or b"", headers_of)
                )
    state: dict[tuple[str, int, bytes], bytes] = {}

    class DictState:
        def get(self, table: str, partition: int, key: bytes) -> bytes | None:
            return state.get((table, partition, key))

    for start in range(0, len(inputs), batch):
        plan = plan_batch(inputs[start : start + batch], settings, DictState(), time.time())
        for record in plan.outputs:
            take(record)
        for (table, partition), writes in plan.writes.items():
            for key, value in writes.items():
                state[(table, partition, key)] = value
    return outputs


def expected_decisions(records: list[Raw], raw_topic: str = "raw") -> tuple[set[str], set[str]]:
    """(emitted ids, stale ids) as the pipeline decides them (`expected_outputs`)."""
    outputs = expected_outputs(records, raw_topic)
    return set(outputs.output), set(outputs.stale)


def read_outputs(
    bootstrap: str, output: str, stale: str, dead_letter: str, timeout_s: float = 600
) -> Outputs:
    """Every committed record of a job's output, stale and dead-letter topics (those that
    exist), read to the end of each partition (librdkafka's partition EOF, at the last stable
    offset: the job has stopped writing), not to a pause, which a busy machine can make."""
    consumer = Consumer(
        {
            **kafka_settings(bootstrap).librdkafka_config(),
            "group.id": f"bench-outputs-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    roles = {output: "output", stale: "stale", dead_letter: "dead-letter"}
    outputs = Outputs()
    try:
        existing = consumer.list_topics(timeout=30).topics
        kstreams.assign_all(consumer, [topic for topic in roles if topic in existing])
        pending = {(tp.topic, tp.partition) for tp in consumer.assignment()}
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise SystemExit(f"the end of {sorted(pending)[:3]} not reached in {timeout_s} s")
            for message in consumer.consume(num_messages=10_000, timeout=0.5):
                error = message.error()
                if error is None:
                    outputs.add(
                        roles[str(message.topic())],
                        message.key(),
                        message.value(),
                        list(message.headers() or []),
                    )
                elif error.code() == KafkaError._PARTITION_EOF:
                    pending.discard((str(message.topic()), int(message.partition() or 0)))
    finally:
        consumer.close()
    return outputs


def compare_outputs(streams: Outputs, ours: Outputs) -> list[str]:
    """How the Kafka Streams job's outputs differ from `ours` (the pipeline's): empty when
    both wrote the same ids to output and stale, each with an equal value (parsed JSON) and
    the same header names and values (but `error`), and the same dead letters."""
    problems: list[str] = []
    for role in ("output", "stale"):
        theirs_ids: dict[str, OutputEntry] = getattr(streams, role)
        ours_ids: dict[str, OutputEntry] = getattr(ours, role)
        for what, ids in (
            ("only in kafka-streams", theirs_ids.keys() - ours_ids.keys()),
            ("only in the pipeline", ours_ids.keys() - theirs_ids.keys()),
        ):
            if ids:
                problems.append(f"{role}: {len(ids):,} ids {what}, e.g. {sorted(ids)[:3]}")
        both = theirs_ids.keys() & ours_ids.keys()
        for index, what in ((0, "values"), (1, "header names"), (2, "header values")):
            differ = sorted(i for i in both if theirs_ids[i][index] != ours_ids[i][index])
            if differ:
                example = ""
                if index == 1:
                    example = f" ({theirs_ids[differ[0]][1]} vs {ours_ids[differ[0]][1]})"
                problems.append(
                    f"{role}: {len(differ):,} ids with other {what}, e.g. {differ[:3]}{example}"
                )
    if streams.dead_letters != ours.dead_letters:
        only_theirs = streams.dead_letters - ours.dead_letters
        only_ours = ours.dead_letters - streams.dead_letters
        problems.append(
            f"dead letters: {sum(only_theirs.values())} only in kafka-streams (e.g. "
            f"{[(k, e[1]) for k, e in list(only_theirs)[:2]]}), {sum(only_ours.values())} only "
            f"in the pipeline (e.g. {[(k, e[1]) for k, e in list(only_ours)[:2]]})"
        )
    for name, found in (("kafka-streams", streams), ("the pipeline", ours)):
        if found.twice:
            problems.append(f"{name} wrote {found.twice} ids twice to one topic")
    return problems


async def create_topics(bootstrap: str, *names: str) -> None:
    admin = AIOKafkaAdminClient(**kafka_args(bootstrap))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, PARTITIONS, 1) for name in names])
    finally:
        await admin.close()


async def fill(bootstrap: str, topic: str, records: list[Raw]) -> None:
    producer = AIOKafkaProducer(**kafka_args(bootstrap), linger_ms=20, max_batch_size=512 * 1024)
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value, key=key, headers=headers)
            for key, value, headers in records
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def ceiling(bootstrap: str, source: str, sink: str, count: int) -> float:
    """Bare aiokafka, consume -> produce unchanged (`producer.send` per record), acks=all,
    idempotent: the ceiling of the aiokafka client stack Faust runs on."""
    consumer = AIOKafkaConsumer(
        source,
        **kafka_args(bootstrap),
        group_id=f"ceil-{uuid.uuid4()}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=2000,
    )
    producer = AIOKafkaProducer(
        **kafka_args(bootstrap), acks="all", enable_idempotence=True, linger_ms=5
    )
    await consumer.start()
    await producer.start()
    done, started = 0, 0.0
    try:
        while done < count:
            batches = await consumer.getmany(timeout_ms=1000, max_records=2000)
            if batches and not started:
                started = time.monotonic()
            futures = [
                await producer.send(sink, m.value, key=m.key, headers=list(m.headers))
                for messages in batches.values()
                for m in messages
            ]
            await asyncio.gather(*futures)
            await consumer.commit()
            done += len(futures)
        return done / (time.monotonic() - started)
    finally:
        await producer.stop()
        await consumer.stop()


def http_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


def timed(progress: Callable[[], float], target: float, timeout_s: float) -> float:
    """Seconds from the first progress to `target`, polling every 250 ms (a poll costs the
    worker a metrics page)."""
    deadline = time.monotonic() + timeout_s
    started = None
    while time.monotonic() < deadline:
        value = progress()
        if value > 0 and started is None:
            started = time.monotonic()
        if value >= target and started is not None:
            return time.monotonic() - started
        time.sleep(0.25)
    raise SystemExit(f"no completion within {timeout_s:.0f} s (at {progress()} of {target})")


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            args, cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()


def worker_config(workdir: Path, suffix: str, raw_topic: str, extra: str = "") -> tuple[Path, str]:
    """The bench worker's settings file (`extra`: more `[stream]` lines) and output topic."""
    output = f"bench-out-{suffix}"
    config = workdir / f"{suffix}.toml"
    config.write_text(
        f'[stream]\napp_id = "bench-{suffix}"\nraw_topics = ["{raw_topic}"]\n'
        f'repartition_topic = "bench-{suffix}.by-key"\ndead_letter_topic = "bench-dl-{suffix}"\n'
        f'partitions = {PARTITIONS}\n{extra}[[instances]]\nname = "default"\ntopic = "{output}"\n'
        f'stale_topic = "bench-stale-{suffix}"\n'
    )
    return config, output


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds so far of `pid` and each of its descendants (cpu_seconds)."""
    seconds = {}
    for member in process_tree(pid):
        try:
            seconds[member] = cpu_seconds(member)
        except OSError:
            continue
    return seconds


def stage_breakdown(port: int) -> str:
    """Where each stage's wall-clock time went (the worker's storage_events_stage_* metrics)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return "  (no stage metrics)"
    samples: dict[tuple[str, ...], float] = {}
    for line in text.splitlines():
        if line.startswith("storage_events_stage_") and "_created" not in line:
            name, _, value = line.rpartition(" ")
            labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', name)))
            samples[(name.split("{")[0], *(f"{k}={v}" for k, v in labels))] = float(value)
    lines = []
    for stage in ("normalize", "emit"):
        batches = samples.get(("storage_events_stage_batches_total", f"stage={stage}"), 0.0)
        records = samples.get(("storage_events_stage_records_total", f"stage={stage}"), 0.0)
        seconds = {
            phase: samples.get(
                ("storage_events_stage_seconds_total", f"phase={phase}", f"stage={stage}"), 0.0
            )
            for phase in ("fetch", "handle", "commit")
        }
        lines.append(
            f"  {stage:<9} {batches:>6,.0f} batches, {records / max(batches, 1):>6,.0f} records "
            "each; seconds waiting for records {fetch:.1f}, handling (until acknowledged) "
            "{handle:.1f}, committing offsets {commit:.1f}".format(**seconds)
        )
    phases = {
        phase: samples.get(
            ("storage_events_stage_seconds_total", f"phase={phase}", "stage=emit"), 0.0
        )
        for phase in ("txn-produce", "txn-offsets", "txn-commit")
    }
    if any(phases.values()):
        lines.append(
            "  emit transactions, seconds in: producing {txn-produce:.1f}, "
            "send_offsets_to_transaction {txn-offsets:.1f}, commit_transaction "
            "{txn-commit:.1f}".format(**phases)
        )
    return "\n".join(lines)


def start_worker(
    bootstrap: str,
    raw_topic: str,
    workdir: Path,
    name: str,
    processes: int | None = None,
    extra: str = "",
) -> tuple[WorkerProcess, int, str]:
    """`faust -A streams worker` on `raw_topic` with a fresh app id, its stages in
    `processes` processes (None: the default), `extra` lines in its `[stream]` settings:
    (worker, web port, output). With BENCH_WORKER_TREE set, the worker runs that checkout's
    `streams` and `fileevents` (PYTHONPATH), e.g. a `git worktree` of the code before a
    change, for before / after rounds in one run."""
    suffix = uuid.uuid4().hex[:8]
    config, output = worker_config(workdir, suffix, raw_topic, extra)
    port = free_port()
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "STREAMS_CONFIG": str(config),
        "STREAMS_DATA_DIR": str(workdir / suffix),
        "STREAMS_WEB_PORT": str(port),
    }
    if processes is not None:
        env["STREAMS_STAGE_PROCESSES"] = str(processes)
    if os.environ.get("BENCH_WORKER_TREE"):
        tree = os.environ["BENCH_WORKER_TREE"]
        env["PYTHONPATH"] = f"{tree}{os.pathsep}{tree}/fileevents/src"
    worker = WorkerProcess(env, workdir / f"{name}-{suffix}.log")
    worker.start()
    return worker, port, output


@dataclass(frozen=True)
class PipelineRun:
    """The full worker's figures, and its output and stale topics (for the id check)."""

    rate: float
    cpu_seconds: float
    output: str
    stale: str
    dead_letter: str


def decided_at(bootstrap: str, topics: list[str], decided: int, timeout_s: float) -> float:
    """`time.monotonic()` once `decided` distinct ids are readable `read_committed` on
    `topics` (the output and stale topics), read as the Kafka Streams run's are: from
    outside, so that the worker serves no metrics page meanwhile."""
    consumer = Consumer(
        {
            **kafka_settings(bootstrap).librdkafka_config(),
            "group.id": f"bench-decided-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    ids: set[str] = set()
    try:
        kstreams.assign_all(consumer, topics)
        deadline = time.monotonic() + timeout_s
        while len(ids) < decided:
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"no completion within {timeout_s:.0f} s ({len(ids)} of {decided})"
                )
            for message in consumer.consume(num_messages=10_000, timeout=0.05):
                if message.error() is None:
                    ids.add(kstreams.ce_id(message))
        return time.monotonic()
    finally:
        consumer.close()


def run_pipeline(
    bootstrap: str,
    raw_topic: str,
    count: int,
    decided: int,
    workdir: Path,
    profile: Path | None = None,
    processes: int = 1,
) -> PipelineRun:
    """Events/s of the full worker (its stages in `processes` processes), from its first
    delivery read (its metrics page, polled) to its `decided` distinct events readable on
    its output and stale topics (read from outside, as the Kafka Streams run's); with
    `profile`, py-spy samples it meanwhile (raw stacks)."""
    worker, port, output = start_worker(bootstrap, raw_topic, workdir, "pipeline", processes)
    pid = worker.pid
    profiler: subprocess.Popen[bytes] | None = None
    cpu_at_start: list[dict[int, float]] = []

    def start_profiler() -> None:
        """py-spy from the first delivery handled on: start-up is not the pipeline."""
        nonlocal profiler
        if profile is not None and profiler is None:
            profiler = subprocess.Popen(
                [
                    *(str(PY_SPY), "record", "--pid", str(pid), "--rate", "200"),
                    *("--idle", "--nonblocking", "--format", "raw", "--output", str(profile)),
                    *(("--subprocesses",) if processes > 1 else ()),  # the stage child too
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

    try:

        def received() -> float:
            figures = metric_sums(port, "storage_events_received_total")
            return figures["storage_events_received_total"]

        timed(received, 1, 1800)  # until the worker read its first delivery: the clock starts
        started = time.monotonic()
        cpu_at_start.append(tree_cpu_seconds(pid))
        start_profiler()
        stale = output.replace("bench-out-", "bench-stale-", 1)  # worker_config's names
        seconds = decided_at(bootstrap, [output, stale], decided, 1800) - started
        at_end = tree_cpu_seconds(pid)
        each = [at_end[member] - cpu_at_start[0].get(member, 0.0) for member in at_end]
        busy = sum(each)
        print(
            f"  worker CPU {busy:.1f} s in {seconds:.1f} s ({busy / seconds:.0%} of one core; "
            + (
                f"per process {', '.join(f'{part:.1f} s' for part in each)}; "
                if len(each) > 1
                else ""
            )
            + "the rest it waits for Kafka)",
            flush=True,
        )
        print(stage_breakdown(port), flush=True)
        dead_letter = output.replace("bench-out-", "bench-dl-", 1)
        return PipelineRun(count / seconds, busy, output, stale, dead_letter)
    finally:
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
            profiler.wait(60)
        worker.stop()


def run_floor(bootstrap: str, raw_topic: str, count: int, workdir: Path) -> float:
    port = free_port()
    floor = spawn(
        [str(FAUST), "-A", "benchmarks.engine_floor", "worker", "-l", "info"],
        {
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "BENCH_TOPIC": raw_topic,
            "BENCH_APP_ID": f"floor-{uuid.uuid4().hex[:8]}",
            "BENCH_WEB_PORT": str(port),
            "BENCH_DATA_DIR": str(workdir / "floor"),
        },
        workdir / "floor.log",
    )
    try:

        def consumed() -> float:
            answer = http_json(f"http://127.0.0.1:{port}/count")
            return float(answer["consumed"]) if answer else 0.0

        return count / timed(consumed, count, 900)
    finally:
        stop(floor)


LATENCY_JOBS = ("pipeline", "kstreams")
"""The jobs whose latency `make bench` measures, alternating: the worker and its Kafka Streams
peer (the same job, benchmarks.kstreams)."""
WARM_UP = 20_000
"""Deliveries each latency run publishes (as fast as it can) and sees decided before its timed
part: the JIT, the caches, the producers' and coordinators' first requests are behind it."""


@dataclass(frozen=True)
class Latency:
    """One latency run: publish -> readable read_committed on the output, per timed event."""

    job: str
    delays: list[float]
    """Seconds, sorted."""
    offered: int

    def quantile(self, q: float) -> float:
        """The `q` quantile in milliseconds (nearest rank)."""
        return self.delays[min(len(self.delays) - 1, int(len(self.delays) * q))] * 1000

    def line(self, rate: float, seconds: float) -> str:
        if not self.delays:
            return f"{self.job}: no event arrived"
        return (
            f"{self.job}: p50 {self.quantile(0.5):.0f} ms, p99 {self.quantile(0.99):.0f} ms "
            f"({len(self.delays)} of {self.offered} events at {rate:,.0f}/s for {seconds:.0f} s, "
            f"after {WARM_UP:,} warm-up deliveries)"
        )


def latency(
    bootstrap: str,
    rate: float,
    seconds: float,
    workdir: Path,
    job: str = "pipeline",
    extra: str = "",
) -> Latency:
    """Publish -> readable (read_committed) on `job`'s output topic, for `seconds` at `rate`
    deliveries/s, once WARM_UP deliveries published before are readable. `job`: the worker
    (`pipeline`, with the `[stream]` settings `extra`) or its Kafka Streams peer
    (`kstreams`), each on a raw topic of its own, started for the run."""
    suffix = uuid.uuid4().hex[:8]
    raw_topic = f"bench-lat-raw-{suffix}"
    asyncio.run(create_topics(bootstrap, raw_topic))
    total = int(rate * seconds)
    with contextlib.ExitStack() as running:
        if job == "pipeline":
            worker, _, output = start_worker(bootstrap, raw_topic, workdir, "latency", extra=extra)
            running.callback(worker.stop)
            worker.wait_ready()
        else:
            output = running.enter_context(
                kstreams.serve(
                    bootstrap,
                    raw_topic,
                    WARM_UP + total,
                    workdir,
                    lambda *names: asyncio.run(create_topics(bootstrap, *names)),
                    load_settings(worker_config(workdir, "kstreams", raw_topic)[0], environ={}),
                )
            )
        asyncio.run(create_topics(bootstrap, output))  # the reader may start before the job
        return asyncio.run(_publish_and_time(bootstrap, raw_topic, output, rate, total, job))


async def _publish_and_time(
    bootstrap: str, raw_topic: str, output: str, rate: float, total: int, job: str
) -> Latency:
    consumer = AIOKafkaConsumer(
        output,
        **kafka_args(bootstrap),
        group_id=None,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await consumer.start()
    producer = AIOKafkaProducer(**kafka_args(bootstrap), acks="all", linger_ms=0)
    await producer.start()
    sent: dict[str, float] = {}
    arrived: dict[str, float] = {}

    async def collect() -> None:
        while True:
            for messages in (await consumer.getmany(timeout_ms=200)).values():
                now = time.monotonic()
                for message in messages:
                    arrived.setdefault(dict(message.headers)["ce_id"].decode(), now)

    def delivery(n: int) -> tuple[str, str, bytes]:
        key = f"lat/{n % 1000:04d}"
        body = s3_body(key, f"{0x0069B21FFD07000000 + n:018X}")
        [event] = normalize(Delivery("s3", body))
        return event.id, key, body

    async def arrived_all(ids: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not all(i in arrived for i in ids):
            await asyncio.sleep(0.1)

    collector = asyncio.create_task(collect())
    try:
        warm = [delivery(n) for n in range(WARM_UP)]
        pending = [
            await producer.send(raw_topic, body, key=key.encode(), headers=[("source", b"s3")])
            for _, key, body in warm
        ]
        await asyncio.gather(*pending)
        await arrived_all([event_id for event_id, _, _ in warm], 600)
        timed = [delivery(n) for n in range(WARM_UP, WARM_UP + total)]
        started = time.monotonic()
        for n, (event_id, key, body) in enumerate(timed):
            await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
            sent[event_id] = time.monotonic()
            await producer.send(raw_topic, body, key=key.encode(), headers=[("source", b"s3")])
        await producer.flush()
        await arrived_all(list(sent), 60)
    finally:
        collector.cancel()
        await producer.stop()
        await consumer.stop()
    return Latency(job, sorted(arrived[i] - sent[i] for i in sent if i in arrived), total)


SECTIONS = {
    "state": ["-m", "benchmarks.restore"],
    "normalizers": ["-m", "benchmarks.normalizers"],
    "webhook": ["-m", "benchmarks.webhook"],
}
"""The issue's other figures, each its own script (and process: the normalizer benchmark pins
itself to one core)."""


def run_section(name: str) -> None:
    if name not in SECTIONS:
        raise SystemExit(f"unknown section {name!r}; known: {', '.join(SECTIONS)}")
    print(f"\n## {name}: python {' '.join(SECTIONS[name])}", flush=True)
    finished = subprocess.run([sys.executable, *SECTIONS[name]], cwd=ROOT, check=False)
    if finished.returncode != 0:
        print(f"({name} failed with exit code {finished.returncode})", flush=True)
    print(flush=True)


PIPELINES = {"pipeline": 1, "pipeline-2proc": 2}
"""The pipeline contestants: the worker with its stages in this many processes."""
CONTESTANTS = (
    "ceiling",
    "floor",
    "pipeline",
    "pipeline-2proc",
    "latency",
    "librdkafka",
    "client-floor",
    "kstreams",
)
"""What reads the filled topic, in the order run: the aiokafka ceiling, the engine
floor, the pipeline, the latency run (its own topic), the bare librdkafka loop
(benchmarks.ceiling), the client floor (benchmarks.client_floor) and the Kafka Streams job
(benchmarks.kstreams)."""


def check_same_outputs(streams: Outputs, ours: Outputs, against: str) -> bool:
    """Print whether the Kafka Streams job wrote what `ours` holds (`compare_outputs`): one
    line when it did, the differences between `!!!` marks when it did not."""
    problems = compare_outputs(streams, ours)
    if not problems:
        print(
            f"same outputs: kafka-streams and {against} wrote the same {len(ours.output):,} ids "
            f"to output and {len(ours.stale):,} to stale, equal values (JSON parsed, compared "
            "as objects, `raw` included), the same header names (and values, but `error`), "
            f"and the same {sum(ours.dead_letters.values()):,} dead letters",
            flush=True,
        )
        return True
    print(f"!!! MISMATCH: kafka-streams and {against} wrote different records !!!", flush=True)
    for problem in problems:
        print(f"!!!   {problem}", flush=True)
    return False


def per_delivery(cpu_s: float, count: int) -> str:
    return f"CPU {cpu_s:.1f} s = {cpu_s / count * 1e6:,.0f} µs per delivery"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=2000.0, help="offered load for latency")
    parser.add_argument("--seconds", type=float, default=10.0, help="latency run length")
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help="the other figures to print, comma-separated (default: all): " + ", ".join(SECTIONS),
    )
    parser.add_argument(
        "--contestants",
        default=",".join(CONTESTANTS),
        help="what reads the filled topic, comma-separated (default: all): "
        + ", ".join(CONTESTANTS)
        + "; e.g. `--contestants pipeline,kstreams,librdkafka --sections ''` for the new ones",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the pipeline contestants this many times, alternating (medians printed)",
    )
    parser.add_argument(
        "--latency-rounds",
        type=int,
        default=2,
        help="latency runs per job, the jobs alternating (the last round's figures are quoted)",
    )
    parser.add_argument(
        "--stream-setting",
        action="append",
        default=[],
        metavar="NAME = VALUE",
        help="a `[stream]` setting line for the latency run's worker (TOML), e.g. "
        "'batch_within_s = 0.005'; repeatable",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="sample the pipeline's worker with py-spy and summarise it",
    )
    args = parser.parse_args()
    chosen = [name for name in args.contestants.split(",") if name]
    unknown = sorted(set(chosen) - set(CONTESTANTS))
    if unknown:
        raise SystemExit(f"unknown contestant(s) {unknown}; known: {', '.join(CONTESTANTS)}")
    bootstrap = bootstrap_servers()
    records = workload(args.deliveries, args.seed)
    count = len(records)
    distinct = len(expected_ids(records))
    print(
        f"# {count} deliveries (seed {args.seed}), {distinct} distinct "
        f"changes, {PARTITIONS} partitions, broker {bootstrap}, {os.cpu_count()} cores",
        flush=True,
    )
    raw_topic = f"bench-raw-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topics(bootstrap, raw_topic))
    asyncio.run(fill(bootstrap, raw_topic, records))

    def new_sink() -> str:
        sink = f"bench-sink-{uuid.uuid4().hex[:8]}"
        asyncio.run(create_topics(bootstrap, sink))
        return sink

    top = floor = None
    bare: LoopRun | None = None
    same = True  # the Kafka Streams job decided as the pipeline (exit status 1 if not)
    pipeline: PipelineRun | None = None
    streams: kstreams.StreamsRun | None = None
    streams_runs: list[kstreams.StreamsRun] = []
    """One Kafka Streams run per round, each right after that round's pipeline runs."""
    latencies: list[Latency] = []
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        workdir = Path(tmp)
        if "ceiling" in chosen:
            top = asyncio.run(ceiling(bootstrap, raw_topic, new_sink(), count))
            print(
                f"ceiling   (bare aiokafka consume -> produce): {top:>10,.0f} events/s", flush=True
            )
        if "floor" in chosen:
            floor = run_floor(bootstrap, raw_topic, count, workdir)
            print(
                f"engine floor (Faust agent, no work):        {floor:>10,.0f} events/s", flush=True
            )
        runs: dict[str, list[PipelineRun]] = {}
        for _ in range(args.rounds):
            for name, processes in PIPELINES.items():
                if name not in chosen:
                    continue
                run = run_pipeline(
                    bootstrap,
                    raw_topic,
                    count,
                    distinct,
                    workdir,
                    args.profile,
                    processes=processes,
                )
                runs.setdefault(name, []).append(run)
                print(
                    f"{name:<15}(full worker, {processes} process{'es' if processes > 1 else ''}):"
                    f"  {run.rate:>10,.0f} events/s; worker {per_delivery(run.cpu_seconds, count)}",
                    flush=True,
                )
            if "kstreams" in chosen:
                streams_runs.append(
                    kstreams.run(
                        bootstrap,
                        raw_topic,
                        count,
                        distinct,
                        workdir,
                        lambda *names: asyncio.run(create_topics(bootstrap, *names)),
                        settings=load_settings(
                            worker_config(workdir, "kstreams", raw_topic)[0], environ={}
                        ),
                    )
                )
                decided = ", ".join(f"{k} {v:,}" for k, v in streams_runs[-1].counts.items())
                print(
                    f"kafka-streams (the same job, exactly_once_v2, warm JVM): "
                    f"{streams_runs[-1].rate:>10,.0f} events/s; JVM (all threads) "
                    f"{per_delivery(streams_runs[-1].cpu_seconds, count)}; {decided}",
                    flush=True,
                )
        # The ratios below are the default worker's (stream.stage_processes), when it ran.
        default = StreamConfig().stage_processes
        ran = sorted(runs.items(), key=lambda item: PIPELINES[item[0]] != default)
        pipeline = next((found[0] for _, found in ran), None)
        pipelines = next((found for _, found in ran), [])  # one per round, as streams_runs
        if args.rounds > 1 or len(runs) > 1:
            for name, found in runs.items():
                rates = sorted(run.rate for run in found)
                cpus = sorted(run.cpu_seconds for run in found)
                print(
                    f"{name}: median of {len(found)}: {rates[len(rates) // 2]:,.0f} events/s "
                    f"(range {rates[0]:,.0f}-{rates[-1]:,.0f}), "
                    f"{per_delivery(cpus[len(cpus) // 2], count)}",
                    flush=True,
                )
        if "latency" in chosen:
            jobs = [job for job in LATENCY_JOBS if job == "pipeline" or "kstreams" in chosen]
            extra = "".join(f"{setting}\n" for setting in args.stream_setting)
            for round_ in range(args.latency_rounds):
                for job in jobs if round_ % 2 == 0 else reversed(jobs):
                    measured = latency(bootstrap, args.rate, args.seconds, workdir, job, extra)
                    latencies.append(measured)
                    print(f"  latency round {round_ + 1}, {measured.line(args.rate, args.seconds)}")
        if "librdkafka" in chosen:
            loop = librdkafka_loop(bootstrap, raw_topic, new_sink(), count)
            print(
                f"ceiling, librdkafka (confluent-kafka consume -> produce, a transaction per "
                f"batch): {loop.rate:,.0f} events/s; bench process "
                f"{per_delivery(loop.cpu_seconds, count)}",
                flush=True,
            )
        if "client-floor" in chosen:
            firsts = first_deliveries(records)
            bare = client_floor(
                bootstrap,
                raw_topic,
                lambda *names: asyncio.run(create_topics(bootstrap, *names)),
                firsts,
                count,
                len(firsts),
            )
            print(
                f"client floor (the pipeline's Kafka and RocksDB calls, no decisions; per-key "
                f"state: one read, one changelog record per emitted event): "
                f"{bare.rate:,.0f} events/s; bench process {per_delivery(bare.cpu_seconds, count)}",
                flush=True,
            )
        if streams_runs:
            streams = streams_runs[0]
            if pipeline is not None:
                ours = read_outputs(
                    bootstrap, pipeline.output, pipeline.stale, pipeline.dead_letter
                )
                against = "the pipeline"
            else:
                ours, against = expected_outputs(records, raw_topic), "the pipeline's rules"
            same = check_same_outputs(read_outputs(bootstrap, *streams.topics), ours, against)
    last = {measured.job: measured for measured in latencies if measured.delays}  # last rounds
    for measured in last.values():
        print(
            f"latency, publish -> readable read_committed, {measured.line(args.rate, args.seconds)}"
        )
    if len(last) == 2:
        mine, peer = last["pipeline"], last["kstreams"]
        print(
            f"latency, pipeline / kafka-streams: p50 "
            f"{mine.quantile(0.5) / peer.quantile(0.5):.2f}, p99 "
            f"{mine.quantile(0.99) / peer.quantile(0.99):.2f}"
        )
    if args.profile is not None and args.profile.exists():
        print("\n".join(report(args.profile)))
    for name in filter(None, args.sections.split(",")):
        run_section(name)
    if pipeline is not None and floor is not None:
        print(f"pipeline / engine floor: {pipeline.rate / floor:.3f}")
    if pipeline is not None and top is not None:
        print(f"pipeline / ceiling: {pipeline.rate / top:.3f}")
    if bare is not None and streams is not None:
        print(
            f"client floor / kafka-streams: {bare.rate / streams.rate:.2f} events/s, "
            f"{bare.cpu_seconds / streams.cpu_seconds:.2f} CPU per delivery"
        )
    pairs = list(zip(pipelines, streams_runs, strict=False))
    if pairs:
        # Each round's pipeline against that round's Kafka Streams run (side by side); with
        # several rounds, the medians of those pairs' ratios.
        cpu = sorted(ours.cpu_seconds / theirs.cpu_seconds for ours, theirs in pairs)
        rate = sorted(ours.rate / theirs.rate for ours, theirs in pairs)
        if len(pairs) > 1:
            print(
                f"{len(pairs)} rounds, pipeline / kafka-streams per round: events/s "
                f"{', '.join(f'{ratio:.2f}' for ratio in rate)}; CPU per delivery "
                f"{', '.join(f'{ratio:.2f}' for ratio in cpu)} (medians below)"
            )
        print(f"worker CPU per delivery, pipeline / kafka-streams JVM: {cpu[len(cpu) // 2]:.2f}")
        print(f"pipeline / kafka-streams: {rate[len(rate) // 2]:.2f}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
