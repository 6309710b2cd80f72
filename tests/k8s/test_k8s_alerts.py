"""The alerting rules of k8s/monitoring/prometheusrule.yaml: valid Prometheus rules, on
metrics that exist.

Each `expr` is parsed with `promql-parser` (PyPI); each storage-events or bridge metric it
names must be one the code registers (with the `_total` / `_bucket` suffixes Prometheus
exposes), so a renamed metric breaks this test instead of an alert going silent.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import promql_parser
import yaml
from prometheus_client import REGISTRY

from connectors.reconcile.report import Compared, RunMetrics
from fileevents import FileEventsMetrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "k8s" / "monitoring" / "prometheusrule.yaml"
OURS = re.compile(r"\b((?:storage_events|bridge|fileevents)_[a-z_]+)\b")
EXTERNAL = {
    "kafka_consumergroup_lag",  # Strimzi Kafka Exporter
    "kube_statefulset_status_replicas_ready",  # kube-state-metrics
    "kube_statefulset_replicas",
}


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["spec"]["groups"]
    assert groups, f"{RULES} has no Prometheus rule groups"
    return groups


SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
}


def exposed_metric_names() -> set[str]:
    """Every sample name the worker's and the bridges' registries expose (labelled metrics
    have no samples before their first use, so the names come from the families)."""
    for module in ("streams.metrics", "connectors.webhook", "connectors.pull"):
        importlib.import_module(module)
    # What a reconcile run pushes (a registry of its own per run, every series of one that
    # compared and succeeded: connectors/reconcile/report.py).
    pushed = RunMetrics("127.0.0.1:1", "example", expected_interval_s=3600)
    pushed.found = Compared(listed=1, known=1, created=0, deleted=0, published=0)
    return {
        metric.name + suffix
        for metric in [
            *REGISTRY.collect(),
            *FileEventsMetrics().collect(),
            *pushed.registry(0, 0.0).collect(),
        ]
        for suffix in SUFFIXES.get(metric.type, ("",))
    }


def test_every_alert_expression_parses_and_names_existing_metrics() -> None:
    exposed = exposed_metric_names()
    names: set[str] = set()
    for group in rule_groups():
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            assert rule["alert"].startswith(("StorageEvents", "FileEvents")), rule["alert"]
            expression = rule["expr"]
            try:
                promql_parser.parse(expression)
            except ValueError as exc:
                raise AssertionError(f"{rule['alert']}: {exc}\n{expression}") from None
            for name in OURS.findall(expression):
                assert name in exposed, f"{rule['alert']}: no metric {name} in the code"
            names.add(rule["alert"])
    assert {
        "StorageEventsDeadLetters",
        "StorageEventsStaleRateHigh",
        "StorageEventsConsumerLag",
    } <= names
    assert {"StorageEventsSendRetries"} <= names
    assert {"StorageEventsReconcileDriftAgain", "StorageEventsReconcileOverdue"} <= names


def test_a_broken_expression_is_caught() -> None:
    try:
        promql_parser.parse("sum by (instance (rate(storage_events_stale_total[5m]))")
    except ValueError:
        return
    raise AssertionError("promql-parser accepted an unbalanced expression")


def test_external_metrics_are_the_only_foreign_names() -> None:
    for group in rule_groups():
        for rule in group["rules"]:
            for name in re.findall(r"\b([a-z_]+)\{", rule["expr"]):
                assert OURS.match(name) or name in EXTERNAL, f"{rule['alert']}: {name}"
