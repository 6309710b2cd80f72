"""k8s/: every rendered resource is valid Kubernetes, and the workloads follow the policy.

Schemas, offline: Kubernetes' own from the PyPI package `kubernetes-validate` (strict mode:
an unknown field is an error), for the oldest and the newest Kubernetes versions it is
checked against; Strimzi's KafkaTopic CRD schema vendored in this directory (no package
ships it; its source is in the file). Renderings: both overlays, and the base with every
component (conftest.py).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from k8s_objects import (
    Resource,
    config_map,
    container_environment,
    containers,
    of_kind,
    one,
    pod_spec,
    pod_template,
    shipped_settings,
    worker,
)

from streams.config import load_settings

HERE = Path(__file__).resolve().parent
KUBERNETES_VERSIONS = ("1.28", "1.37")
STRIMZI_SCHEMA = HERE / "strimzi-kafkatopic-v1beta2.schema.json"
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
RENDERS = ("dev", "prod", "base+all-components")


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with unknown fields forbidden wherever it lists the known ones (like
    kubectl's strict field validation), except where it keeps unknown fields on purpose."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if (
                node.get("type") == "object"
                and "properties" in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node.setdefault("additionalProperties", False)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@pytest.fixture(scope="module")
def kafkatopic_validator() -> jsonschema.protocols.Validator:
    schema = strict(json.loads(STRIMZI_SCHEMA.read_text()))
    validator_class = jsonschema.validators.validator_for(
        schema, default=jsonschema.Draft7Validator
    )
    validator_class.check_schema(schema)
    return validator_class(schema)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("render", RENDERS)
def test_every_resource_is_valid_against_the_kubernetes_schemas(
    renders: dict[str, list[Resource]], render: str, version: str
) -> None:
    resources = renders[render]
    checked = 0
    for resource in resources:
        if resource["kind"] == "KafkaTopic":
            continue  # a custom resource: validated against Strimzi's CRD schema below
        where = f"{render}: {resource['kind']}/{resource['metadata']['name']}"
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(part) for part in exc.path)
            pytest.fail(f"{where} is not valid Kubernetes {version}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            pytest.fail(f"{where}: {exc.message}")
        checked += 1
    assert checked >= 15, f"{render}: only {checked} resources rendered"


@pytest.mark.parametrize("render", ("dev", "prod"))
def test_every_kafkatopic_is_valid_against_strimzis_crd_schema(
    renders: dict[str, list[Resource]],
    render: str,
    kafkatopic_validator: jsonschema.protocols.Validator,
) -> None:
    topics = of_kind(renders[render], "KafkaTopic")
    assert topics
    for topic in topics:
        name = topic["metadata"]["name"]
        assert topic["apiVersion"] == "kafka.strimzi.io/v1beta2"
        errors = sorted(kafkatopic_validator.iter_errors(topic), key=lambda e: list(e.path))
        assert not errors, f"{render}: KafkaTopic/{name}: " + "; ".join(
            f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors
        )
        # What the API server checks on every custom resource's name.
        assert DNS_SUBDOMAIN.match(name) and len(name) <= 253, f"{name}: not a DNS subdomain"
        assert topic["metadata"]["labels"].get("strimzi.io/cluster"), f"{name}: no cluster label"


def test_the_strict_strimzi_schema_catches_a_misspelt_field(
    kafkatopic_validator: jsonschema.protocols.Validator,
) -> None:
    """The vendored schema is really applied: a typo and a bad type are both errors."""
    topic = {
        "apiVersion": "kafka.strimzi.io/v1beta2",
        "kind": "KafkaTopic",
        "metadata": {"name": "t"},
        "spec": {"partition": 3, "replicas": "3", "config": {"anything.goes": "x"}},
    }
    messages = [error.message for error in kafkatopic_validator.iter_errors(topic)]
    assert any("'partition' was unexpected" in message for message in messages), messages
    assert any("is not of type 'integer'" in message for message in messages), messages


@pytest.mark.parametrize("render", RENDERS)
def test_every_container_has_requests_limits_and_runs_locked_down(
    renders: dict[str, list[Resource]], render: str
) -> None:
    found = list(containers(renders[render]))
    assert found
    for container in found:
        spec, pod, where = container.spec, container.pod, f"{render}: {container.where}"
        resources = spec.get("resources", {})
        for kind in ("requests", "limits"):
            for name in ("cpu", "memory"):
                assert name in resources.get(kind, {}), f"{where}: no {kind}.{name}"
        security = spec.get("securityContext", {})
        pod_security = pod.get("securityContext", {})
        assert security.get("runAsNonRoot", pod_security.get("runAsNonRoot")) is True, where
        assert security.get("runAsUser", pod_security.get("runAsUser", 0)) != 0, where
        assert security.get("readOnlyRootFilesystem") is True, where
        assert security.get("allowPrivilegeEscalation") is False, where
        assert security.get("capabilities", {}).get("drop") == ["ALL"], where
        assert pod_security.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
        assert spec.get("privileged") is None, where
        # A read-only root needs somewhere to write: /tmp at least, on a volume.
        mounts = {mount["mountPath"]: mount for mount in spec.get("volumeMounts", [])}
        assert "/tmp" in mounts, f"{where}: no writable /tmp volume"


@pytest.mark.parametrize("render", RENDERS)
def test_every_long_running_container_has_probes_on_its_own_ports(
    renders: dict[str, list[Resource]], render: str
) -> None:
    long_running = [c for c in containers(renders[render]) if c.long_running]
    assert long_running
    for container in long_running:
        where = f"{render}: {container.where}"
        ports = {port["name"]: port["containerPort"] for port in container.spec.get("ports", [])}
        for probe_name in ("readinessProbe", "livenessProbe"):
            probe = container.spec.get(probe_name)
            assert probe, f"{where}: no {probe_name}"
            action = probe.get("httpGet") or probe.get("tcpSocket")
            assert action, f"{where}: {probe_name} is neither httpGet nor tcpSocket"
            port = action["port"]
            assert port in ports or port in ports.values(), f"{where}: {probe_name} port {port}"


@pytest.mark.parametrize("render", RENDERS)
def test_images_are_pinned_and_every_reference_resolves(
    renders: dict[str, list[Resource]], render: str
) -> None:
    resources = renders[render]
    config_maps = {r["metadata"]["name"] for r in of_kind(resources, "ConfigMap")}
    service_accounts = {r["metadata"]["name"] for r in of_kind(resources, "ServiceAccount")}
    for container in containers(resources):
        where = f"{render}: {container.where}"
        image = container.spec["image"]
        name, _, tag = image.rpartition(":")
        assert "@sha256:" in image or (name and tag and "/" not in tag), f"{where}: {image}"
        assert tag != "latest", f"{where}: {image}"
        assert container.spec.get("imagePullPolicy") == "IfNotPresent", where
        for source in container.spec.get("envFrom", []):
            if "configMapRef" in source:
                assert source["configMapRef"]["name"] in config_maps, where
        assert container.pod.get("serviceAccountName") in service_accounts, where
    for resource in resources:
        pod = pod_spec(resource)
        for volume in (pod or {}).get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps, resource["metadata"]["name"]


@pytest.mark.parametrize("render", RENDERS)
def test_secrets_are_referenced_and_never_committed(
    renders: dict[str, list[Resource]], render: str, tmp_path: Path
) -> None:
    resources = renders[render]
    assert not of_kind(resources, "Secret"), "a Secret with values is in the manifests"
    for config in of_kind(resources, "ConfigMap"):
        for key, value in config.get("data", {}).items():
            assert not re.search(r"(?i)(password|secret|token)\s*=\s*\"[^\"]+\"", value), key
    settings = shipped_settings(resources, tmp_path)
    webhook = next(
        c for c in containers(resources) if c.workload["metadata"]["name"].endswith("-webhook")
    )
    provided = {
        variable["name"]: variable["valueFrom"]["secretKeyRef"]
        for variable in webhook.spec.get("env", [])
        if "secretKeyRef" in variable.get("valueFrom", {})
    }
    wanted = {
        name
        for route in settings.webhook.routes.values()
        for name in (route.secret_env, route.token_env, route.secondary_secret_env)
        if name
    }
    assert wanted, "the shipped config turns no secret-protected webhook route on"
    for name in wanted:
        assert name in provided, f"{render}: webhook route secret {name} has no secretKeyRef"
        assert provided[name].get("optional") is not True, f"{name}: a missing secret must fail"


@pytest.mark.parametrize("render", ("dev", "prod"))
def test_the_worker_is_a_statefulset_with_state_readiness_and_static_membership(
    renders: dict[str, list[Resource]], render: str, tmp_path: Path
) -> None:
    resources = renders[render]
    statefulset = one(resources, "StatefulSet", "storage-events-worker")
    container = worker(resources)
    spec, pod = statefulset["spec"], container.pod
    settings = shipped_settings(resources, tmp_path)
    assert 1 <= spec["replicas"] <= settings.stream.partitions, "replicas above the partitions"
    assert spec["podManagementPolicy"] == "Parallel"
    assert container.spec["command"][:4] == ["faust", "-A", "streams", "worker"]
    assert container.spec["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert pod["terminationGracePeriodSeconds"] >= 60

    environ = {variable["name"]: variable for variable in container.spec["env"]}
    member = environ["STREAMS_GROUP_INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert member == "metadata.name"
    assert settings.stream.processing_guarantee == "exactly_once"
    web_port = int(environ["STREAMS_WEB_PORT"]["value"])
    assert container.spec["ports"][0]["containerPort"] == web_port

    claims = {claim["metadata"]["name"] for claim in spec["volumeClaimTemplates"]}
    mounts = {m["mountPath"]: m["name"] for m in container.spec["volumeMounts"]}
    data_dir = environ["STREAMS_DATA_DIR"]["value"]
    assert mounts[data_dir] in claims, "the RocksDB state is not on the pod's own volume"
    assert statefulset["spec"]["serviceName"] in {
        s["metadata"]["name"] for s in of_kind(resources, "Service")
    }
    budget = one(resources, "PodDisruptionBudget", "storage-events-worker")
    assert budget["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("render", ("dev", "prod"))
def test_the_webhook_has_a_service_an_autoscaler_a_budget_and_a_tls_ingress(
    renders: dict[str, list[Resource]], render: str
) -> None:
    resources = renders[render]
    deployment = one(resources, "Deployment", "storage-events-webhook")
    labels = pod_template(deployment)["metadata"]["labels"]
    port = deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]

    def selects(selector: dict[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in selector.items())

    service = one(resources, "Service", "storage-events-webhook")
    assert selects(service["spec"]["selector"])
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]
    autoscaler = one(resources, "HorizontalPodAutoscaler", "storage-events-webhook")
    assert autoscaler["spec"]["scaleTargetRef"]["name"] == "storage-events-webhook"
    assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
    budget = one(resources, "PodDisruptionBudget", "storage-events-webhook")
    assert selects(budget["spec"]["selector"]["matchLabels"])
    ingress = one(resources, "Ingress", "storage-events-webhook")
    assert ingress["spec"]["tls"][0]["secretName"]
    hosts = set(ingress["spec"]["tls"][0]["hosts"])
    for rule in ingress["spec"]["rules"]:
        assert rule["host"] in hosts, "a host of the ingress is not covered by its TLS"
        for path in rule["http"]["paths"]:
            assert path["path"].startswith("/hooks"), "only /hooks/ may be exposed"
            assert path["backend"]["service"]["name"] == service["metadata"]["name"]


@pytest.mark.parametrize("render", RENDERS)
def test_every_pod_is_under_network_policy_and_scraped_by_prometheus(
    renders: dict[str, list[Resource]], render: str
) -> None:
    resources = renders[render]
    policies = of_kind(resources, "NetworkPolicy")
    deny = [p for p in policies if "ingress" not in p["spec"] and "egress" not in p["spec"]]
    assert deny, "no default-deny NetworkPolicy"
    for resource in resources:
        if pod_spec(resource) is None:
            continue
        template = pod_template(resource)
        labels = template["metadata"]["labels"]
        where = f"{render}: {resource['kind']}/{resource['metadata']['name']}"
        for policy in deny:
            selector = policy["spec"]["podSelector"]["matchLabels"]
            assert all(labels.get(k) == v for k, v in selector.items()), f"{where}: not denied"
        if resource["kind"] == "CronJob":
            continue  # a batch job: nothing to scrape
        annotations = template["metadata"].get("annotations", {})
        assert annotations.get("prometheus.io/scrape") == "true", where
        ports = {p["containerPort"] for c in pod_spec(resource)["containers"] for p in c["ports"]}  # type: ignore[index]
        assert int(annotations["prometheus.io/port"]) in ports, where


@pytest.mark.parametrize("render", RENDERS)
def test_every_process_listens_where_its_pod_expects_it(
    renders: dict[str, list[Resource]], render: str, tmp_path: Path
) -> None:
    """The config each container gets (file + environment) makes it serve on the port its
    probes and Service use, on every interface, and reach Kafka at a cluster address."""
    resources = renders[render]
    config = config_map(resources, "storage-events-config")["data"]["streams.toml"]
    (tmp_path / "streams.toml").write_text(config)
    for container in containers(resources):
        where = f"{render}: {container.where}"
        environ = container_environment(container, resources)
        mounted = environ.pop("STREAMS_CONFIG")
        assert mounted == "/etc/storage-events/streams.toml", where
        settings = load_settings(tmp_path / "streams.toml", environ=environ)
        assert settings.kafka.bootstrap_servers.endswith(".svc:9092"), where
        ports = [port["containerPort"] for port in container.spec.get("ports", [])]
        command = container.spec["command"]
        if command[:3] == ["python", "-m", "connectors"] and command[3] == "webhook":
            assert settings.webhook.host == "0.0.0.0", where
            assert ports == [settings.webhook.port], where
        elif command[:3] == ["python", "-m", "connectors"] and "--metrics-port" in command:
            assert command[command.index("--metrics-host") + 1] == "0.0.0.0", where
            assert ports == [int(command[command.index("--metrics-port") + 1])], where
        elif command[:2] == ["faust", "-A"]:
            assert ports == [settings.stream.web_port], where


def test_a_container_without_limits_fails_the_policy(
    renders: dict[str, list[Resource]],
) -> None:
    """The policy checks look at what they claim to: break one container, see it caught."""
    broken = copy.deepcopy(renders["prod"])
    target = next(c for c in containers(broken) if c.long_running)
    del target.spec["resources"]["limits"]
    del target.spec["livenessProbe"]
    with pytest.raises(AssertionError, match="no limits"):
        test_every_container_has_requests_limits_and_runs_locked_down({"x": broken}, "x")
    with pytest.raises(AssertionError, match="no livenessProbe"):
        test_every_long_running_container_has_probes_on_its_own_ports({"x": broken}, "x")
