"""k8s/monitoring/, offline: the PrometheusRule passes `promtool check rules`, the Grafana
dashboard follows Grafana's dashboard model, and the ServiceMonitor / PodMonitor select the
Services and pods the manifests define, by port names they have.

promtool comes from Debian's `prometheus` package (`make promtool`, part of `make test`).
Outside CI a machine without it skips those tests, saying so; in CI (`CI` set) they fail.
What the queries return from real scrapes: test_monitoring_scrape.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from k8s_objects import Resource, kustomize_build, of_kind, pod_template
from test_k8s_manifests import strict

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
MONITORING = K8S / "monitoring"
RULES = MONITORING / "prometheusrule.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
MONITORS = MONITORING / "servicemonitor.yaml"
HERE = Path(__file__).resolve().parent
OPERATOR_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")


def promtool() -> str:
    found = shutil.which("promtool")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("promtool is missing in CI: `make promtool` installs Debian's prometheus")
    pytest.skip(
        "promtool is not installed (Debian: `make promtool`, or apt-get install prometheus)"
    )


def rule_file(tmp_path: Path, spec: dict[str, Any]) -> Path:
    """The PrometheusRule's `spec` is a Prometheus rule file (what the Operator mounts)."""
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def check_rules(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_prometheusrule_passes_promtool_check_rules(tmp_path: Path) -> None:
    rule = yaml.safe_load(RULES.read_text())
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert set(rule["spec"]) == {"groups"}, "spec must be a rule file and nothing else"
    checked = check_rules(rule_file(tmp_path, rule["spec"]))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    count = sum(len(group["rules"]) for group in rule["spec"]["groups"])
    assert f"SUCCESS: {count} rules found" in checked.stdout, checked.stdout
    for group in rule["spec"]["groups"]:
        for alert in group["rules"]:
            assert alert["labels"]["severity"] in {"warning", "critical"}, alert["alert"]
            assert alert["annotations"]["summary"], alert["alert"]


@pytest.mark.parametrize(
    ("rule", "error"),
    [
        ({"alert": "A", "expr": "sum by (stage (rate(x_total[5m]))"}, "parse error"),
        ({"alert": "B", "expr": "up == 0", "for": "5 minutes"}, "not a valid duration"),
        ({"alert": "C", "expr": "up == 0", "labels": {"0bad": "x"}}, "invalid label name"),
    ],
)
def test_promtool_is_really_applied(tmp_path: Path, rule: dict[str, Any], error: str) -> None:
    """A broken expression, a bad `for`, a bad label name: each fails the same check."""
    checked = check_rules(rule_file(tmp_path, {"groups": [{"name": "g", "rules": [rule]}]}))
    assert checked.returncode != 0
    assert error in checked.stdout + checked.stderr, checked.stdout + checked.stderr


RULE_TESTS = HERE / "prometheusrule.test.yaml"


def run_rule_tests(tmp_path: Path, tests: str) -> subprocess.CompletedProcess[str]:
    """`promtool test rules` on `tests`, with the PrometheusRule's spec as its rules.yaml."""
    rule_file(tmp_path, yaml.safe_load(RULES.read_text())["spec"])
    (tmp_path / "rules.test.yaml").write_text(tests)
    return subprocess.run(
        [promtool(), "test", "rules", "rules.test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_reconcile_alerts_pass_their_promtool_unit_tests(tmp_path: Path) -> None:
    """Drift in two runs in a row, a refused run, no success within twice the schedule's
    gap: tests/k8s/prometheusrule.test.yaml, on the rules as shipped."""
    tests = RULE_TESTS.read_text()
    for alert in ("DriftAgain", "Refused", "Overdue"):
        assert f"alertname: StorageEventsReconcile{alert}" in tests
    tested = run_rule_tests(tmp_path, tests)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_promtool_test_rules_is_really_applied(tmp_path: Path) -> None:
    """The same unit tests fail when an alert would not fire as they expect."""
    tests = RULE_TESTS.read_text().replace("found drift in 2 runs", "found drift in 3 runs")
    tested = run_rule_tests(tmp_path, tests)
    assert tested.returncode != 0
    assert "StorageEventsReconcileDriftAgain" in tested.stdout + tested.stderr


def test_k8s_readme_points_to_the_rule_file_and_holds_no_copy() -> None:
    readme = (K8S / "README.md").read_text()
    assert "k8s/monitoring/" in readme and "prometheusrule.yaml" in readme
    assert "alert: StorageEvents" not in readme, "the rules live in k8s/monitoring only"


# Grafana's dashboard model (grafana/grafana kinds/dashboard/dashboard_kind.cue, the classic
# JSON model): what a dashboard must hold, and the constraints on panels and their grid.
GRID_POS = {
    "type": "object",
    "required": ["h", "w", "x", "y"],
    "properties": {
        "h": {"type": "integer", "minimum": 1},
        "w": {"type": "integer", "minimum": 1, "maximum": 24},
        "x": {"type": "integer", "minimum": 0, "maximum": 23},
        "y": {"type": "integer", "minimum": 0},
        "static": {"type": "boolean"},
    },
}
DATASOURCE_REF = {
    "type": "object",
    "required": ["type", "uid"],
    "properties": {"type": {"const": "prometheus"}, "uid": {"type": "string", "minLength": 1}},
}
TARGET = {
    "type": "object",
    "required": ["refId", "expr", "datasource"],
    "properties": {
        "refId": {"type": "string", "minLength": 1},
        "expr": {"type": "string", "minLength": 1},
        "legendFormat": {"type": "string"},
        "datasource": DATASOURCE_REF,
    },
}
PANEL = {
    "type": "object",
    "required": ["type", "id", "title", "gridPos"],
    "properties": {
        "type": {"type": "string", "minLength": 1},
        "id": {"type": "integer", "minimum": 0},
        "title": {"type": "string", "minLength": 1},
        "gridPos": GRID_POS,
        "datasource": DATASOURCE_REF,
        "targets": {"type": "array", "items": TARGET},
        "fieldConfig": {"type": "object", "required": ["defaults", "overrides"]},
        "options": {"type": "object"},
    },
    "if": {"properties": {"type": {"const": "row"}}},
    "then": {"required": ["collapsed", "panels"]},
    "else": {"required": ["datasource", "targets", "fieldConfig"]},
}
DASHBOARD_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["title", "uid", "schemaVersion", "panels", "templating", "time"],
    "properties": {
        "title": {"type": "string", "minLength": 1},
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "id": {"type": "null"},  # set by the Grafana that stores it, not by a file
        "schemaVersion": {"type": "integer", "minimum": 36, "maximum": 65535},
        "editable": {"type": "boolean"},
        "graphTooltip": {"enum": [0, 1, 2]},
        "timezone": {"type": "string"},
        "time": {
            "type": "object",
            "required": ["from", "to"],
            "properties": {"from": {"type": "string"}, "to": {"type": "string"}},
        },
        "tags": {"type": "array", "items": {"type": "string"}},
        "panels": {"type": "array", "minItems": 1, "items": PANEL},
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {
                "list": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["type", "name"],
                        "properties": {
                            "type": {
                                "enum": ["query", "datasource", "custom", "constant", "interval"]
                            },
                            "name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                        },
                    },
                }
            },
        },
    },
}


def dashboard_problems(dashboard: dict[str, Any]) -> list[str]:
    """Schema errors, then what a schema cannot say: unique ids and refIds, panels inside
    the 24-column grid without overlapping, variables used only if defined."""
    validator = jsonschema.Draft202012Validator(DASHBOARD_SCHEMA)
    problems = [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in validator.iter_errors(dashboard)
    ]
    if problems:
        return problems
    panels = dashboard["panels"]
    ids = [panel["id"] for panel in panels]
    if len(ids) != len(set(ids)):
        problems.append(f"panel ids repeat: {ids}")
    cells: dict[tuple[int, int], str] = {}
    variables = {variable["name"] for variable in dashboard["templating"]["list"]}
    builtin = {"__rate_interval", "__interval", "__range"}
    for panel in panels:
        pos, title = panel["gridPos"], panel["title"]
        if pos["x"] + pos["w"] > 24:
            problems.append(f"{title}: wider than the grid ({pos})")
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                if (x, y) in cells:
                    problems.append(f"{title} overlaps {cells[(x, y)]}")
                cells[(x, y)] = title
        refs = [target["refId"] for target in panel.get("targets", [])]
        if len(refs) != len(set(refs)):
            problems.append(f"{title}: refIds repeat")
        used = set(re.findall(r"\$\{?(\w+)", json.dumps(panel)))
        if used - variables - builtin:
            problems.append(f"{title}: undefined variables {used - variables - builtin}")
    return sorted(set(problems))


def test_the_dashboard_loads_and_follows_grafanas_dashboard_model() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard_problems(dashboard) == []
    titles = " ".join(panel["title"].lower() for panel in dashboard["panels"])
    for wanted in ("instance", "lag", "latency", "dropped", "dead", "restore", "webhook"):
        assert wanted in titles, f"no panel about {wanted}"
    assert any(panel["type"] == "heatmap" for panel in dashboard["panels"]), "no histogram"
    for prefix in ("storage_events_", "bridge_webhook_", "bridge_pull_", "fileevents_"):
        assert prefix in DASHBOARD.read_text(), f"no panel on {prefix}*"


def test_the_dashboard_check_catches_a_broken_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panel = next(panel for panel in dashboard["panels"] if panel["type"] != "row")
    panel["gridPos"]["w"] = 30
    del panel["targets"][0]["refId"]
    dashboard["panels"].append({**dashboard["panels"][-1]})  # same id, same cells
    del dashboard["schemaVersion"]
    problems = dashboard_problems(dashboard)
    assert any("'schemaVersion' is a required property" in p for p in problems), problems
    assert any("30 is greater than the maximum of 24" in p for p in problems), problems
    assert any("'refId' is a required property" in p for p in problems), problems
    fixed = json.loads(DASHBOARD.read_text())
    fixed["panels"].append({**fixed["panels"][-1]})
    assert any("panel ids repeat" in p for p in dashboard_problems(fixed))
    assert any("overlaps" in p for p in dashboard_problems(fixed))


@pytest.fixture(scope="module")
def monitored(tmp_path_factory: pytest.TempPathFactory) -> list[Resource]:
    """The base with every bridge component and the monitoring component, rendered."""
    where = tmp_path_factory.mktemp("monitored")
    components = [
        *sorted(p for p in (K8S / "components").iterdir() if p.is_dir()),
        MONITORING,
    ]
    (where / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": "storage-events",
                "resources": [os.path.relpath(K8S / "base", where)],
                "components": [os.path.relpath(path, where) for path in components],
                "images": [{"name": "storage-events", "newName": "example/se", "newTag": "1"}],
            }
        )
    )
    return kustomize_build(where)


def selected(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def test_the_monitors_select_every_scraped_workload_by_its_port_names(
    monitored: list[Resource],
) -> None:
    """Every pod annotated for scraping is covered: the worker and the webhook through a
    Service port the ServiceMonitor names, each pull bridge through a container port the
    PodMonitor names; the worker with honorLabels (its `instance` is the storage instance)."""
    (service_monitor,) = of_kind(monitored, "ServiceMonitor")
    (pod_monitor,) = of_kind(monitored, "PodMonitor")
    endpoints = {e["port"]: e for e in service_monitor["spec"]["endpoints"]}
    pod_ports = {e["port"] for e in pod_monitor["spec"]["podMetricsEndpoints"]}
    services = of_kind(monitored, "Service")
    covered: set[str] = set()
    for workload in [*of_kind(monitored, "StatefulSet"), *of_kind(monitored, "Deployment")]:
        template = pod_template(workload)
        labels = template["metadata"]["labels"]
        if template["metadata"].get("annotations", {}).get("prometheus.io/scrape") != "true":
            continue
        name = workload["metadata"]["name"]
        container_ports = {
            port["name"]: port["containerPort"]
            for container in template["spec"]["containers"]
            for port in container.get("ports", [])
        }
        scraped_port = int(template["metadata"]["annotations"]["prometheus.io/port"])
        by_service = [
            port
            for service in services
            if selected(service_monitor["spec"]["selector"], service["metadata"]["labels"])
            and selected({"matchLabels": service["spec"]["selector"]}, labels)
            for port in service["spec"]["ports"]
            if port["name"] in endpoints and container_ports.get(port["targetPort"]) == scraped_port
        ]
        by_pod = selected(pod_monitor["spec"]["selector"], labels) and any(
            container_ports.get(port) == scraped_port for port in pod_ports
        )
        assert by_service or by_pod, f"{name}: no monitor scrapes port {scraped_port}"
        assert not (by_service and by_pod), f"{name}: scraped twice"
        covered.add(labels["app.kubernetes.io/component"])
        if labels["app.kubernetes.io/component"] == "worker":
            assert endpoints[by_service[0]["name"]].get("honorLabels") is True
    assert covered == {"worker", "webhook", "sqs-bridge", "azure-queue-bridge", "pubsub-bridge"}


def test_the_component_ships_the_rules_and_the_dashboard_as_they_are(
    monitored: list[Resource],
) -> None:
    (rule,) = of_kind(monitored, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())["spec"]
    assert rule["metadata"]["namespace"] == "storage-events"
    (dashboard,) = [
        r
        for r in of_kind(monitored, "ConfigMap")
        if r["metadata"]["name"] == "storage-events-dashboard"
    ]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["grafana-dashboard.json"]) == json.loads(
        DASHBOARD.read_text()
    )
    for monitor in (*of_kind(monitored, "ServiceMonitor"), *of_kind(monitored, "PodMonitor")):
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["namespace"] == "storage-events"
    assert MONITORS.is_file()


@pytest.fixture(scope="module")
def operator_validators() -> dict[str, jsonschema.protocols.Validator]:
    """The Prometheus Operator's CRD schemas (vendored, v0.93.0), strict like kubectl's
    field validation: an unknown field is an error."""
    validators = {}
    for kind in OPERATOR_KINDS:
        schema = strict(
            json.loads((HERE / f"prometheus-operator-{kind.lower()}-v1.schema.json").read_text())
        )
        validator_class = jsonschema.validators.validator_for(
            schema, default=jsonschema.Draft7Validator
        )
        # The schema's own shape, without checking its patterns as ECMA regexes: they are Go
        # regexes (RE2) for the API server, e.g. PrometheusRule's "^(?i)(abort|warn)?$".
        validator_class(validator_class.META_SCHEMA).validate(schema)
        validators[kind] = validator_class(schema)
    return validators


def operator_errors(
    validators: dict[str, jsonschema.protocols.Validator], resource: Resource
) -> list[str]:
    errors = sorted(validators[resource["kind"]].iter_errors(resource), key=lambda e: list(e.path))
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors]


def test_the_monitoring_resources_are_valid_against_the_operators_crd_schemas(
    monitored: list[Resource], operator_validators: dict[str, jsonschema.protocols.Validator]
) -> None:
    found = [r for r in monitored if r["kind"] in OPERATOR_KINDS]
    assert sorted(r["kind"] for r in found) == sorted(OPERATOR_KINDS)
    for resource in found:
        where = f"{resource['kind']}/{resource['metadata']['name']}"
        assert resource["apiVersion"] == "monitoring.coreos.com/v1", where
        assert operator_errors(operator_validators, resource) == [], where


def test_the_strict_operator_schema_catches_a_misspelt_field(
    monitored: list[Resource], operator_validators: dict[str, jsonschema.protocols.Validator]
) -> None:
    (monitor,) = json.loads(json.dumps(of_kind(monitored, "ServiceMonitor")))
    monitor["spec"]["endpoints"][0]["honourLabels"] = True
    monitor["spec"]["endpoints"][1]["interval"] = "30 seconds"
    errors = operator_errors(operator_validators, monitor)
    assert any("'honourLabels' was unexpected" in error for error in errors), errors
    assert any("does not match" in error and "interval" in error for error in errors), errors
