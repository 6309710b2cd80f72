"""`FileEvents`' Prometheus metrics, per handler, on the real broker: served on
`metrics_port` while `run()` runs (scraped over HTTP here), and the same collector mounted in
an application's own registry."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from datetime import timedelta

import pytest
from consumer_support import create_topics, event, eventually, produce_events, unique
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fileevents import FileEvent, FileEvents, FileEventsMetrics, RetryPolicy

KEY = "reports/q4.pdf"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, found), v in samples.items() if n == name and wanted <= found)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain"), response.headers
        return str(response.read().decode())


@pytest.mark.kafka
def test_handled_failed_retried_and_dead_lettered_are_counted_per_handler(
    kafka_bootstrap: str,
) -> None:
    topic, group = unique("events"), unique("group")
    good, flaky, poison, last = (event(KEY, seq) for seq in range(4))
    garbage = (KEY, b"{not json")
    flaky_left = [1]
    port = free_port()
    events = FileEvents(
        bootstrap_servers=kafka_bootstrap,
        topic=topic,
        group_id=group,
        retry=RetryPolicy(attempts=3, initial_backoff=timedelta(milliseconds=10)),
        commit_interval=timedelta(milliseconds=50),
        metrics_port=port,
        handle_signals=False,
        on_error=lambda failure: None,
    )
    seen: list[str] = []

    @events.on("*")
    async def audit(item: FileEvent) -> None:
        seen.append(item.id)

    @events.on("created")
    async def convert(item: FileEvent) -> None:
        if item.id == poison.id:
            raise RuntimeError("cannot convert")
        if item.id == flaky.id and flaky_left[0]:
            flaky_left[0] -= 1
            raise ConnectionError("busy")
        await asyncio.sleep(0.03)

    prefix = f"{__name__}.test_handled_failed_retried_and_dead_lettered_are_counted_per_handler"
    audit_name, convert_name = f"{prefix}.audit", f"{prefix}.convert"

    async def scenario() -> tuple[str, str]:
        await create_topics(kafka_bootstrap, (topic, 1), (events.dead_letter_topic, 1))
        await produce_events(kafka_bootstrap, topic, [good, flaky, poison, garbage, last])
        task = asyncio.create_task(events.run())
        try:
            await eventually(lambda: task.done() or events.outcomes.total() == 5, 30, "5 records")
            assert not task.done(), task
            served = await asyncio.to_thread(scrape, port)
        finally:
            events.stop()
            await asyncio.wait_for(task, 30)
        mounted = CollectorRegistry()
        mounted.register(events.metrics)  # what an application serving /metrics does
        return served, generate_latest(mounted).decode()

    served, mounted = asyncio.run(scenario())
    assert seen == [good.id, flaky.id, poison.id, last.id]  # a retry resumes at convert
    for text in (served, mounted):
        samples = parse(text)
        mine = {"topic": topic, "group": group}
        assert value(samples, "fileevents_handled_total", handler=audit_name, **mine) == 4
        # good, flaky (its second run), last; poison failed all 3 of its runs
        assert value(samples, "fileevents_handled_total", handler=convert_name, **mine) == 3
        assert value(samples, "fileevents_failed_total", handler=convert_name, **mine) == 4
        assert value(samples, "fileevents_failed_total", handler=audit_name, **mine) == 0
        # Series that never counted exist at 0 (so `increase()` sees their first count).
        never = {**mine, "handler": audit_name}
        for name in ("fileevents_dead_lettered_total", "fileevents_timed_out_total"):
            assert samples[(name, frozenset(never.items()))] == 0, name
        assert value(samples, "fileevents_records_total", outcome="tombstone", **mine) == 0
        assert (
            "fileevents_records_total",
            frozenset({**mine, "outcome": "tombstone"}.items()),
        ) in samples
        assert value(samples, "fileevents_timed_out_total", handler=convert_name, **mine) == 0
        # flaky once, poison twice (its third failure is final)
        assert value(samples, "fileevents_retried_total", handler=convert_name, **mine) == 3
        assert value(samples, "fileevents_dead_lettered_total", handler=convert_name, **mine) == 1
        assert value(samples, "fileevents_dead_lettered_total", handler="<decode>", **mine) == 1
        runs = value(samples, "fileevents_handler_seconds_count", handler=convert_name, **mine)
        assert runs == 7  # every run, failed ones included
        total = value(samples, "fileevents_handler_seconds_sum", handler=convert_name, **mine)
        assert total >= 3 * 0.03  # the three successful runs slept 30 ms each
        fast = value(
            samples, "fileevents_handler_seconds_bucket", handler=convert_name, le="0.025", **mine
        )
        assert fast == 4  # the failures were immediate, the successes took 30 ms
        assert value(samples, "fileevents_records_total", outcome="handled", **mine) == 3
        assert value(samples, "fileevents_records_total", outcome="dead_lettered", **mine) == 2
    assert events.outcomes == {"handled": 3, "dead_lettered": 2}


def test_two_consumers_share_one_collector_and_their_series_differ() -> None:
    """Two `FileEvents` of one process, one collector (registered once in the app's
    registry): each one's counts carry its own topic and group."""
    shared = FileEventsMetrics()
    registry = CollectorRegistry()
    registry.register(shared)
    for name in ("a", "b"):
        FileEvents(bootstrap_servers="x:9092", topic=name, group_id=f"g-{name}", metrics=shared)
        shared.records.labels(name, f"g-{name}", "handled").inc()
    samples = parse(generate_latest(registry).decode())
    assert value(samples, "fileevents_records_total", topic="a", group="g-a") == 1
    assert value(samples, "fileevents_records_total", topic="b", group="g-b") == 1
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(FileEventsMetrics())  # a second collector would clash: share one


@pytest.mark.kafka
def test_a_metrics_port_in_use_stops_run_naming_the_setting(kafka_bootstrap: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        events = FileEvents(
            bootstrap_servers=kafka_bootstrap,
            topic=unique("events"),
            group_id=unique("group"),
            metrics_port=port,
            handle_signals=False,
        )

        @events.on("*")
        async def handle(item: FileEvent) -> None: ...

        with pytest.raises(OSError, match=rf"metrics_port: cannot listen on 127.0.0.1:{port}"):
            asyncio.run(asyncio.wait_for(events.run(), 30))


def test_a_metrics_port_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="metrics_port"):
        FileEvents(bootstrap_servers="x:9092", topic="t", group_id="g", metrics_port=70000)


@pytest.mark.kafka
def test_lag_per_partition_and_events_in_flight(kafka_bootstrap: str) -> None:
    """Three events of three keys hang in their handler: 3 in flight, a lag of 3 on their
    partition; released and done with: 0 and 0."""
    topic, group = unique("events"), unique("group")
    items = [event(f"lag/{index}.bin", index) for index in range(3)]
    release = asyncio.Event()
    started: list[str] = []
    events = FileEvents(
        bootstrap_servers=kafka_bootstrap,
        topic=topic,
        group_id=group,
        commit_interval=timedelta(milliseconds=50),
        handle_signals=False,
    )
    mine = {"topic": topic, "group": group}

    @events.on("*")
    async def hang(item: FileEvent) -> None:
        started.append(item.id)
        await release.wait()

    def samples() -> Samples:
        return parse(generate_latest(events.metrics.registry()).decode())

    async def scenario() -> tuple[Samples, Samples]:
        await create_topics(kafka_bootstrap, (topic, 1))
        await produce_events(kafka_bootstrap, topic, items)
        task = asyncio.create_task(events.run())
        try:
            await eventually(lambda: len(started) == 3, 30, "three handlers at once")
            await eventually(
                lambda: value(samples(), "fileevents_in_flight", **mine) == 3, 5, "in flight"
            )
            await eventually(
                lambda: value(samples(), "fileevents_lag", partition="0", **mine) == 3, 5, "lag"
            )
            hanging = samples()
            release.set()
            await eventually(lambda: events.outcomes.total() == 3, 10, "the events done")
            await eventually(
                lambda: value(samples(), "fileevents_lag", partition="0", **mine) == 0, 5, "no lag"
            )
            return hanging, samples()
        finally:
            events.stop()
            await asyncio.wait_for(task, 30)

    hanging, done = asyncio.run(scenario())
    assert value(hanging, "fileevents_in_flight", **mine) == 3
    assert value(hanging, "fileevents_lag", partition="0", **mine) == 3
    assert value(done, "fileevents_in_flight", **mine) == 0
    assert value(done, "fileevents_lag", partition="0", **mine) == 0
