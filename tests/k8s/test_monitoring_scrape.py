"""Every alert of k8s/monitoring/prometheusrule.yaml and every query of the Grafana dashboard,
evaluated by a real Prometheus (Debian's `prometheus` package) against real scrapes.

Scraped, each on a free port of 127.0.0.1, every second: a worker (`faust -A streams
worker`, honor_labels as in the ServiceMonitor) on the session's broker, the webhook bridge,
the SQS bridge (on moto's SQS), a `fileevents` consumer of the worker's output
(`metrics_port`), and a Pushgateway (honor_labels) holding what two reconcile runs pushed.
Traffic makes every labelled series exist: events emitted, a duplicate, a stale one, filtered
ones, a malformed delivery (dead letter), a record the output topic
refuses, a stage that cannot write (failpoint STREAMS_UNWRITABLE_TOPIC), webhook deliveries
accepted and refused, consumer handlers that fail and time out.

Then through the HTTP API: each expression must be accepted (`/api/v1/query`), each product
metric it names must be among the scraped series (`/api/v1/label/__name__/values`), and
what the traffic must trip does: every dashboard query returns series, and the alerts on dead
letters, refused records, a stuck stage, a high stale share (grouped by the storage
`instance`) and the consumer's dead letters and timeouts return the series that would fire.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import promql_parser
import pytest
import yaml
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from support.kafka_io import produce, raw
from support.moto_server import aws_client, unique_name
from support.payloads import s3_body, s3_record
from support.worker import ROOT, Topology, Worker, free_port, wait_for

from connectors.reconcile.report import JOB, Compared, RunMetrics
from fileevents import FileEvent, FileEvents, RetryPolicy

if TYPE_CHECKING:
    from support.pushgateway import Pushgateway

pytest_plugins = ["support.moto_server", "support.pushgateway"]
pytestmark = pytest.mark.kafka

MONITORING = ROOT / "k8s" / "monitoring"
PRODUCT = re.compile(r"^(?:storage_events|bridge|fileevents)_[a-z_]+$")
EXTERNAL = {
    "kafka_consumergroup_lag": "Strimzi's Kafka Exporter",
    "kube_statefulset_status_replicas_ready": "kube-state-metrics",
    "kube_statefulset_replicas": "kube-state-metrics",
}
"""Metrics the rules read from exporters the product does not ship (not scraped here)."""
EXPECTED_TO_FIRE = {
    "StorageEventsDeadLetters",
    "StorageEventsRecordsRefused",
    "StorageEventsStageStuck",
    "StorageEventsStaleRateHigh",
    "FileEventsDeadLetters",
    "FileEventsHandlerTimeouts",
    "StorageEventsReconcileDriftAgain",
}


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("prometheus is missing in CI: `make promtool` installs Debian's prometheus")
    pytest.skip("the prometheus server is not installed (Debian: `make promtool`)")


def get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read() or b"{}")


def metric_names(expression: str) -> set[str]:
    """Every metric an expression selects, from its syntax tree (promql-parser)."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"a selector without a metric name in {expression}"
            names.add(node.name)
            return
        for attribute in ("lhs", "rhs", "expr", "param", "vector_selector"):
            child = getattr(node, attribute, None)
            if child is not None and not isinstance(child, str | int | float):
                walk(child)
        for argument in getattr(node, "args", None) or ():
            walk(argument)

    walk(promql_parser.parse(expression))
    return names


def product_names(expression: str) -> set[str]:
    return {name for name in metric_names(expression) if PRODUCT.match(name)}


def foreign_names(expression: str) -> set[str]:
    return {name for name in metric_names(expression) if not PRODUCT.match(name)}


@dataclass
class Query:
    where: str
    expr: str
    must_return: bool


def alert_queries() -> list[Query]:
    spec = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())["spec"]
    return [
        Query(f"alert {rule['alert']}", rule["expr"], rule["alert"] in EXPECTED_TO_FIRE)
        for group in spec["groups"]
        for rule in group["rules"]
    ]


def dashboard_queries() -> list[Query]:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = (
                target["expr"]
                .replace("$__rate_interval", "1m")
                .replace("$__range", "5m")
                .replace("$instance", ".*")
            )
            found.append(Query(f"panel {panel['title']!r} {target['refId']}", expr, True))
    variables = dashboard["templating"]["list"]
    for variable in variables:
        query = variable.get("query")
        if isinstance(query, dict):
            metric = re.fullmatch(r"label_values\((\w+), *(\w+)\)", query["query"])
            assert metric, variable
            found.append(
                Query(f"variable {variable['name']}", f"group by ({metric[2]}) ({metric[1]})", True)
            )
    return found


@dataclass
class Prometheus:
    """A real Prometheus server on a free port, its TSDB in a temporary directory."""

    directory: Path
    targets: dict[str, tuple[int, bool]]  # job -> (port, honor_labels)
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
            "scrape_configs": [
                {
                    "job_name": job,
                    "honor_labels": honor,
                    "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
                }
                for job, (port, honor) in self.targets.items()
            ],
        }
        (self.directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        log = (self.directory / "prometheus.log").open("ab")
        self.process = subprocess.Popen(
            [
                prometheus_binary(),
                f"--config.file={self.directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

        def ready() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    return bool(response.status == 200)
            except OSError:
                return False

        wait_for(ready, 60, "prometheus to be ready")

    def log(self) -> str:
        return (self.directory / "prometheus.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def query(self, expr: str) -> dict[str, Any]:
        return dict(get_json(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})))

    def names(self) -> set[str]:
        return set(get_json(f"{self.url}/api/v1/label/__name__/values")["data"])

    def scraped_since(self, moment: float, scrapes: int = 3) -> bool:
        """Every target up, and scraped at least `scrapes` times since `moment` (so each
        series that existed then has the samples `rate` needs)."""
        targets = get_json(f"{self.url}/api/v1/targets")["data"]["activeTargets"]
        if len(targets) != len(self.targets) or any(t["health"] != "up" for t in targets):
            return False
        window = max(1, int(time.time() - moment))
        result = self.query(f"min(count_over_time(up[{window}s]))")["data"]["result"]
        return bool(result) and float(result[0]["value"][1]) >= scrapes


class Bridge:
    """A bridge subprocess (`python -m connectors ...`) with its log."""

    def __init__(self, command: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def metrics_text(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def post(url: str, body: bytes) -> int:
    request = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


class Consumer:
    """A `fileevents` consumer of an output topic, in a thread of its own, metrics served."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.port = free_port()
        self.events = FileEvents(
            bootstrap_servers=bootstrap,
            topic=topic,
            group_id=f"dashboards-{uuid.uuid4().hex[:8]}",
            retry=RetryPolicy(attempts=2, initial_backoff=timedelta(milliseconds=10)),
            metrics_port=self.port,
            handle_signals=False,
            on_error=lambda failure: None,
        )

        @self.events.on("*")
        async def index(event: FileEvent) -> None: ...

        @self.events.on("created", timeout=timedelta(milliseconds=200))
        async def thumbnail(event: FileEvent) -> None:
            if event.key.startswith("consumer/fails"):
                raise RuntimeError("cannot make a thumbnail")
            if event.key.startswith("consumer/hangs"):
                await asyncio.Event().wait()

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="fileevents", daemon=True)
        self.error: BaseException | None = None
        self._thread.start()

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self.events.run())
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self.events.stop)
        self._thread.join(30)


async def create_topic(bootstrap: str, name: str, config: dict[str, str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 2, 1, topic_configs=config)])
    finally:
        await admin.close()


@pytest.fixture(scope="module")
def scraped(
    kafka_bootstrap: str,
    moto_server: str,
    pushgateway: Pushgateway,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Prometheus, Worker]]:
    """The four processes with their traffic done, and a Prometheus that scraped it all,
    with the Pushgateway where two reconcile runs of `default` pushed drift in a row."""
    prometheus_binary()  # skip (or fail in CI) before starting anything
    tmp_path = tmp_path_factory.mktemp("scraped")
    names = Topology()
    instances = [
        {"name": "default", "bucket": "uploads"},
        {"name": "stuck", "bucket": "stuck-bucket"},
    ]
    # The output topic exists beforehand with a low limit: a large event is refused.
    asyncio.run(
        create_topic(kafka_bootstrap, names.output("default"), {"max.message.bytes": "4096"})
    )
    worker = Worker(
        kafka_bootstrap,
        names.config(instances),
        tmp_path / "worker",
        {"STREAMS_UNWRITABLE_TOPIC": names.output("stuck")},
    )
    config_env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "STREAMS_CONFIG": str(worker.config_path),
    }
    webhook_port, sqs_port = free_port(), free_port()
    sqs = aws_client(moto_server, "sqs")
    queue_url = sqs.create_queue(QueueName=unique_name("q"))["QueueUrl"]
    started: list[Any] = []
    prometheus = Prometheus(
        tmp_path / "prometheus",
        {
            "storage-events-worker": (worker.web_port, True),
            "storage-events-webhook": (webhook_port, False),
            "storage-events-sqs-bridge": (sqs_port, False),
            # As kube-prometheus-stack's Pushgateway ServiceMonitor: honor_labels, so that
            # `job` and `instance` are the pushed ones.
            "pushgateway": (pushgateway.port, True),
        },
    )
    pushgateway.delete(JOB, "default")
    for _ in range(2):  # two runs in a row that found drift (exit 0: published it all)
        run = RunMetrics(pushgateway.url, "default", expected_interval_s=3600)
        run.found = Compared(listed=3, known=2, created=1, deleted=0, published=1)
        assert run.push(0) is None
    prometheus.directory.mkdir()
    try:
        worker.start()
        started.append(worker)
        webhook = Bridge(
            [sys.executable, "-m", "connectors", "webhook"],
            {
                **config_env,
                "WEBHOOK_PORT": str(webhook_port),
                "WEBHOOK_RAW_TOPIC": names.raw,
                "WEBHOOK_INSECURE_SOURCES": "s3",
            },
            tmp_path / "webhook.log",
        )
        started.append(webhook)
        bridge = Bridge(
            [
                *(sys.executable, "-m", "connectors", "sqs", "--queue-url", queue_url),
                *("--source", "s3", "--endpoint-url", moto_server, "--wait-time", "1"),
                *("--metrics-port", str(sqs_port)),
            ],
            config_env,  # publishes to the config's first raw topic
            tmp_path / "sqs.log",
        )
        started.append(bridge)
        consumer = Consumer(kafka_bootstrap, names.output("default"))
        started.append(consumer)
        prometheus.targets["fileevents"] = (consumer.port, False)
        for process, port in ((webhook, webhook_port), (bridge, sqs_port)):
            wait_for(
                lambda p=process, n=port: metrics_text(n) or p.process.poll() is not None,  # type: ignore[misc]
                60,
                f"{process.process.args} metrics",
            )
            assert process.process.poll() is None, process.log()
        prometheus.start()
        # As in production, Prometheus scrapes before anything happens: a series it first sees
        # after the increment would not show the increment in `increase()`.
        before = time.time()
        wait_for(lambda: prometheus.scraped_since(before, 2), 60, "the first scrapes")

        # The worker: emitted, duplicate, stale, filtered, a dead letter, a refusal.
        key = f"photos/{uuid.uuid4().hex[:6]}.jpg"
        newer, older = s3_record(key, "00B0"), s3_record(key, "00A0")
        big = s3_record(f"big/{uuid.uuid4().hex[:6]}", "00C0")
        big["responseElements"]["x-amz-id-2"] = "A" * 6000
        deliveries = [
            raw(s3_body(newer), "s3"),
            raw(s3_body(newer), "s3"),  # a duplicate
            raw(s3_body(older), "s3"),  # stale
            raw(s3_body(s3_record("elsewhere/x", "00D0", bucket="other")), "s3"),  # filtered
            raw(b"{not json", "s3"),  # dead-lettered by normalize
            raw(s3_body(big), "s3"),  # refused by the output topic: dead-lettered by emit
            raw(s3_body(s3_record("consumer/fails-1", "00E0")), "s3"),
            raw(s3_body(s3_record("consumer/hangs-1", "00E1")), "s3"),
        ]
        asyncio.run(produce(kafka_bootstrap, names.raw, deliveries, key=b"one-partition"))
        # The webhook: accepted, and refused (a route without credentials: 404 no-route).
        hook = f"http://127.0.0.1:{webhook_port}/hooks"
        assert post(f"{hook}/s3", s3_body(s3_record("via/webhook", "00F0"))) in (200, 202)
        assert post(f"{hook}/b2", b"{}") == 404
        # The SQS bridge: one message published.
        sqs.send_message(
            QueueUrl=queue_url, MessageBody=s3_body(s3_record("via/sqs", "00F1")).decode()
        )

        worker.wait_metric("storage_events_refused_records_total", 1)
        worker.wait_metric("storage_events_emitted_total", 5)  # 3 + webhook + sqs
        wait_for(
            lambda: consumer.events.outcomes.get("dead_lettered", 0) >= 2 or consumer.error,
            60,
            "the consumer to dead-letter its two",
        )
        assert consumer.error is None, consumer.error
        # Last: an event of `stuck`, whose output topic takes no write: the emit stage stops.
        asyncio.run(
            produce(
                kafka_bootstrap,
                names.raw,
                [raw(s3_body(s3_record("stuck/x", "0100", bucket="stuck-bucket")), "s3")],
                key=b"one-partition",
            )
        )
        worker.wait_metric("storage_events_stage_stuck", 1, stage="emit")
        wait_for(
            lambda: any(name.startswith("storage_events_stage_lag{") for name in worker.metrics()),
            30,
            "the stage lag gauges",
        )
        moment = time.time()
        wait_for(lambda: prometheus.scraped_since(moment), 60, "prometheus to scrape it all")
        yield prometheus, worker
    finally:
        prometheus.stop()
        for process in reversed(started):
            if isinstance(process, Worker):
                process.kill()  # its emit stage is stuck on purpose: no graceful stop
            else:
                process.stop()


def test_every_alert_and_panel_query_runs_on_scraped_metrics(
    scraped: tuple[Prometheus, Worker],
) -> None:
    prometheus, worker = scraped
    scraped_names = prometheus.names()
    problems: list[str] = []
    queries = [*alert_queries(), *dashboard_queries()]
    assert len(queries) > 40
    for query in queries:
        answer = prometheus.query(query.expr)
        if answer.get("status") != "success":
            problems.append(f"{query.where}: refused: {answer.get('error')}\n  {query.expr}")
            continue
        missing = product_names(query.expr) - scraped_names
        if missing:
            problems.append(f"{query.where}: not in the scrape: {sorted(missing)}")
        foreign = foreign_names(query.expr) - set(EXTERNAL)
        if foreign:
            problems.append(f"{query.where}: names neither the product's nor known: {foreign}")
        if query.must_return and not answer["data"]["result"]:
            problems.append(f"{query.where}: returned nothing\n  {query.expr}")
    assert not problems, "\n".join(problems) + f"\nworker log:\n{worker.tail()}"


def test_the_storage_instance_survives_the_scrape_as_instance(
    scraped: tuple[Prometheus, Worker],
) -> None:
    """With honor_labels (the ServiceMonitor's honorLabels), `instance` is the storage
    instance, so `by (instance)` in the rules and the dashboard means what it says."""
    prometheus, _ = scraped
    result = prometheus.query("sum by (instance) (storage_events_emitted_total)")["data"]["result"]
    emitted = {series["metric"].get("instance"): float(series["value"][1]) for series in result}
    assert emitted.keys() == {"default", "stuck"}  # both exist from the start
    assert emitted["default"] >= 5 and emitted["stuck"] == 0
    stale = prometheus.query(
        next(q.expr for q in alert_queries() if q.where == "alert StorageEventsStaleRateHigh")
    )["data"]["result"]
    assert [series["metric"] for series in stale] == [{"instance": "default"}]
    # The target's own address stays on series without an `instance` of their own.
    up = prometheus.query('up{job="storage-events-worker"}')["data"]["result"]
    assert up[0]["metric"]["instance"].startswith("127.0.0.1:")


def test_a_misspelt_metric_would_be_caught(scraped: tuple[Prometheus, Worker]) -> None:
    prometheus, _ = scraped
    assert "storage_events_emited_total" not in prometheus.names()
    expression = 'sum(rate(storage_events_emited_total{a="b"}[5m])) / deriv(up[5m:1m])'
    assert product_names(expression) == {"storage_events_emited_total"}
    assert foreign_names(expression) == {"up"}
    assert prometheus.query("sum(rate(storage_events_emitted_total[5m])")["status"] == "error"
