"""The documented commands, settings and metric names are the code's (issue 16, item 7).

Nothing is listed here by hand: the code's side is read from the code itself (the CLI
parsers, the Makefile's targets, the environment variables its sources name, the metrics its
modules register), so a command, variable or metric added to either side without the other
fails this test, naming it.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import re
from collections.abc import Iterator
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE_DOCS = sorted((ROOT / "docs").glob("*.md"))
"""The reference material the README links to (settings, security model, commands, ...)."""
COMMAND_DOCS = [ROOT / "README.md", ROOT / "k8s" / "README.md", *REFERENCE_DOCS]
"""Where commands and environment variables are documented for users."""
METRIC_DOCS = [*COMMAND_DOCS, ROOT / "fileevents" / "README.md"]
PRODUCT_PACKAGES = ("streams", "connectors", "fileevents")
ENV_PREFIXES = ("STREAMS_", "WEBHOOK_", "KAFKA_")
ENV_NAME = re.compile(r"^(?:STREAMS|WEBHOOK|KAFKA)_[A-Z0-9_]*[A-Z0-9]$")
NOT_IMPORTED = {"streams.worker", "streams.__main__", "connectors.__main__"}
"""Modules with side effects at import (the Faust app loads its settings); they register no
metric of their own (streams.metrics does)."""
TEST_HOOKS = {"streams/engine/failpoints.py"}
"""Failure injection for the tests (its docstring documents it), not a user setting."""
METRIC_PREFIXES = ("storage_events_", "bridge_", "fileevents_")
SAMPLE_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def code_spans(text: str) -> Iterator[str]:
    """Fenced code blocks and inline code spans of a Markdown text."""
    fences = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
    yield from (match.group(1) for match in fences.finditer(text))
    rest = fences.sub("", text)
    yield from re.findall(r"``?([^`\n]+?)``?", rest)


def doc_text(paths: list[Path]) -> str:
    return "\n".join(path.read_text(encoding="utf-8") for path in paths)


def documented(pattern: str, paths: list[Path]) -> set[str]:
    """Every match of `pattern`'s first group inside the code of the documents."""
    found: set[str] = set()
    for path in paths:
        for span in code_spans(path.read_text(encoding="utf-8")):
            found.update(re.findall(pattern, span))
    return found


# Commands


def streams_commands() -> set[str]:
    from streams.cli import build_parser

    parser = build_parser()
    (subparsers,) = [
        action for action in parser._actions if action.__class__.__name__ == "_SubParsersAction"
    ]
    return set(subparsers.choices)


def connectors_commands() -> set[str]:
    from connectors.__main__ import BRIDGES

    return set(BRIDGES)


def make_targets() -> set[str]:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*)\s*:(?!=)", makefile, re.M))
    for phony in re.findall(r"^\.PHONY:(.*)$", makefile, re.M):
        targets.update(phony.split())
    return targets


def test_every_documented_streams_command_exists() -> None:
    missing = documented(r"python -m streams ([a-z][\w-]*)", COMMAND_DOCS) - streams_commands()
    assert not missing, f"documented but not in streams.cli: {sorted(missing)}"


def test_every_streams_command_is_documented() -> None:
    undocumented = streams_commands() - documented(r"python -m streams ([a-z][\w-]*)", COMMAND_DOCS)
    assert not undocumented, f"python -m streams commands missing from the README: {undocumented}"


def test_every_documented_connectors_command_exists() -> None:
    missing = (
        documented(r"python -m connectors ([a-z][\w-]*)", COMMAND_DOCS) - connectors_commands()
    )
    assert not missing, f"documented but not in connectors.__main__.BRIDGES: {sorted(missing)}"


def test_every_documented_make_target_exists() -> None:
    missing = documented(r"(?<![\w-])make ([a-z][\w-]*)", COMMAND_DOCS) - make_targets()
    assert not missing, f"documented but not in the Makefile: {sorted(missing)}"


def test_every_documented_python_module_exists() -> None:
    modules = documented(r"python -m ((?:benchmarks|examples|dev)[\w.]*)", COMMAND_DOCS)
    missing = {module for module in modules if importlib.util.find_spec(module) is None}
    assert not missing, f"documented modules that do not exist: {sorted(missing)}"


# Environment variables


def _source_files(*folders: str) -> Iterator[Path]:
    for folder in folders:
        yield from sorted((ROOT / folder).rglob("*.py"))


def env_vars_in_code(*folders: str) -> dict[str, set[str]]:
    """`STREAMS_*`, `WEBHOOK_*`, `KAFKA_*` string constants in the code (the keys of
    streams.config.ENVIRONMENT, streams.kafka_settings' map, `os.environ.get("...")`), and
    the files naming each."""
    found: dict[str, set[str]] = {}
    for path in _source_files(*folders):
        relative = path.relative_to(ROOT).as_posix()
        if relative in TEST_HOOKS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and ENV_NAME.match(node.value)
            ):
                found.setdefault(node.value, set()).add(relative)
    return found


def test_the_config_registry_is_seen() -> None:
    """The scan finds the registries it stands for (else the tests below prove nothing)."""
    from streams.config import ENVIRONMENT

    found = env_vars_in_code(*PRODUCT_PACKAGES)
    assert set(ENVIRONMENT) <= set(found)


def test_every_environment_variable_the_code_reads_is_documented() -> None:
    text = doc_text(COMMAND_DOCS)
    readme_names = set(re.findall(r"\b((?:STREAMS|WEBHOOK|KAFKA)_[A-Z0-9_]*[A-Z0-9])\b", text))
    undocumented = {
        name: sorted(files)
        for name, files in env_vars_in_code(*PRODUCT_PACKAGES, "dev").items()
        if name not in readme_names
    }
    assert not undocumented, f"read by the code, not in README/k8s README/docs: {undocumented}"


def make_variables() -> set[str]:
    """The Makefile's variables: `make kafka KAFKA_BROKERS=3` sets one of those."""
    return set(re.findall(r"\$\(([A-Z][A-Z0-9_]*)\)", (ROOT / "Makefile").read_text()))


def test_every_documented_environment_variable_exists_in_the_code() -> None:
    text = doc_text(COMMAND_DOCS)
    named = set(re.findall(r"\b((?:STREAMS|WEBHOOK|KAFKA)_[A-Z0-9_]*[A-Z0-9])\b", text))
    code = set(env_vars_in_code(*PRODUCT_PACKAGES, "dev", "benchmarks")) | make_variables()
    missing = {name for name in named if name not in code}
    assert not missing, f"documented, but no code reads them: {sorted(missing)}"


# Metrics


def _import_product_modules() -> None:
    for package_name in PRODUCT_PACKAGES:
        package = importlib.import_module(package_name)
        for module in pkgutil.walk_packages(package.__path__, f"{package_name}."):
            if module.name not in NOT_IMPORTED:
                importlib.import_module(module.name)


def registered_metrics() -> dict[str, str]:
    """Every metric family the product registers, name -> type: the module-level ones in
    Prometheus' default registry once every product module is imported, the consumer
    library's collector (fileevents.metrics.FileEventsMetrics, a registry of its own), and
    what a reconcile run pushes (connectors.reconcile.report, a registry per run: every
    series of a run that compared and succeeded)."""
    from prometheus_client import REGISTRY

    from connectors.reconcile.report import Compared, RunMetrics
    from fileevents.metrics import FileEventsMetrics

    _import_product_modules()
    pushed = RunMetrics("127.0.0.1:1", "example", expected_interval_s=3600)
    pushed.found = Compared(listed=1, known=1, created=0, deleted=0, published=0)
    families = [
        *REGISTRY.collect(),
        *FileEventsMetrics().describe(),
        *pushed.registry(0, 0.0).collect(),
    ]
    return {
        family.name: family.type for family in families if family.name.startswith(METRIC_PREFIXES)
    }


def exposition_names(name: str, kind: str) -> set[str]:
    return {f"{name}_total"} if kind == "counter" else {name}


def documented_metrics() -> set[str]:
    pattern = r"\b((?:storage_events|bridge|fileevents)_[a-z0-9_*]*[a-z0-9*])"
    return set(re.findall(pattern, doc_text(METRIC_DOCS)))


def test_the_metric_registries_are_seen() -> None:
    registered = registered_metrics()
    assert {"storage_events_emitted", "bridge_webhook_accepted", "fileevents_handled"} <= set(
        registered
    )


def test_every_registered_metric_is_documented() -> None:
    names = documented_metrics()
    undocumented = sorted(
        name
        for name, kind in registered_metrics().items()
        if not any(
            exposed == doc or fnmatchcase(exposed, doc)
            for exposed in exposition_names(name, kind)
            for doc in names
        )
    )
    assert not undocumented, (
        f"registered, not in README/k8s README/fileevents README: {undocumented}"
    )


def test_every_documented_metric_is_registered() -> None:
    registered = registered_metrics()
    exposed = {
        sample
        for name, kind in registered.items()
        for sample in {name, *exposition_names(name, kind)}
        | {name + suffix for suffix in SAMPLE_SUFFIXES}
    }
    unknown = sorted(
        doc
        for doc in documented_metrics()
        if doc not in exposed and not any(fnmatchcase(sample, doc) for sample in exposed)
    )
    assert not unknown, f"documented metrics no code registers: {unknown}"


@pytest.mark.parametrize(
    "path",
    [
        ROOT / "README.md",
        *REFERENCE_DOCS,
        ROOT / "streams" / "core" / "event.py",
        *sorted((ROOT / "streams").rglob("*.py")),
    ],
    ids=lambda path: path.relative_to(ROOT).as_posix(),
)
def test_no_reference_leaves_the_repository(path: Path) -> None:
    """A clone has no `../shared/`: PROVIDERS.md and DESIGN.md references point into docs/."""
    text = path.read_text(encoding="utf-8")
    assert "../shared" not in text
    assert "DESIGN.md" not in text or (ROOT / "docs" / "DESIGN.md").exists()


def test_every_provider_section_the_code_cites_is_in_docs() -> None:
    """`PROVIDERS §4`, `§11 #17`, `§12.6` in the code name sections of docs/PROVIDERS.md."""
    providers = (ROOT / "docs" / "PROVIDERS.md").read_text(encoding="utf-8")
    sections = set(re.findall(r"^## (\d+)\. ", providers, re.M))
    decisions = set(re.findall(r"^\| (\d+) \|", providers, re.M))
    cited_sections: set[str] = set()
    cited_decisions: set[str] = set()
    for path in _source_files(*PRODUCT_PACKAGES, "tests"):
        text = path.read_text(encoding="utf-8")
        cited_sections.update(re.findall(r"§(\d+)", text))
        cited_decisions.update(re.findall(r"§11 #(\d+)", text))
    assert cited_sections, "no citation found: the pattern is wrong"
    assert cited_sections <= sections, sorted(cited_sections - sections)
    assert cited_decisions <= decisions, sorted(cited_decisions - decisions)


# The README and the reference material it links to (issue 24, item 9)


def test_every_document_the_readme_links_to_exists() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = set(re.findall(r"\]\(((?!https?:)[^)#]+)\)", readme))
    assert {f"docs/{path.name}" for path in REFERENCE_DOCS} <= links, "a docs/ file not linked"
    missing = sorted(link for link in links if not (ROOT / link).exists())
    assert not missing, f"the README links to files that do not exist: {missing}"


@pytest.mark.parametrize("path", REFERENCE_DOCS, ids=lambda path: path.name)
def test_every_relative_link_of_a_reference_document_resolves(path: Path) -> None:
    links = re.findall(r"\]\(((?!https?:)[^)#]+)\)", path.read_text(encoding="utf-8"))
    missing = sorted(link for link in links if not (path.parent / link).exists())
    assert not missing, f"{path.name} links to files that do not exist: {missing}"


def test_the_readme_keeps_to_the_newcomers_path() -> None:
    """Reference material lives in docs/: the README stays short enough to read first."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    sections = re.findall(r"^## (.+)$", readme, re.M)
    for reference in ("Security model", "Configuration", "Bridges", "Commands"):
        assert reference not in sections, f"{reference!r} belongs in docs/"
    assert len(readme.splitlines()) < 400
