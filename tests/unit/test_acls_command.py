"""`python -m streams acls`: each component's ACLs, derived from the topology, and the shipped
Strimzi KafkaUsers (k8s/kafka-users), which must be exactly what the command prints."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from streams.acls import Acl, AclError, bridge_acls, consumer_acls, reconcile_acls, worker_acls
from streams.cli import main
from streams.config import ConfigError, Settings, load_settings
from streams.engine.topics import topology

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_CONFIG = ROOT / "k8s" / "base" / "streams.toml"
KAFKA_USERS = ROOT / "k8s" / "kafka-users"
WORKLOAD_FILES = sorted((ROOT / "k8s" / "base").glob("*.yaml")) + sorted(
    (ROOT / "k8s" / "components").glob("*/*.yaml")
)
ACLS = ("acls", "--config", str(SHIPPED_CONFIG))


@pytest.fixture
def settings() -> Settings:
    return load_settings(SHIPPED_CONFIG, environ={})


def by_name(acls: list[Acl]) -> dict[tuple[str, str], Acl]:
    return {(acl.resource, acl.name): acl for acl in acls}


def test_the_worker_gets_every_topic_it_uses_with_the_least_it_needs(settings: Settings) -> None:
    acls = by_name(worker_acls(settings))
    app_id = settings.stream.app_id
    for spec in topology(settings):
        if spec.name.startswith(f"{app_id}-"):
            internal = acls[("topic", f"{app_id}-")]
            assert internal.prefixed and "Create" in internal.operations
            continue
        operations = set(acls[("topic", spec.name)].operations)
        assert ("Read" in operations) == (spec.role in ("raw", "repartition")), spec.name
        assert ("Write" in operations) == (spec.role != "raw"), spec.name
        assert "Create" not in operations and "Delete" not in operations, spec.name
    assert acls[("group", app_id)].operations == ("Read", "Describe")  # Faust's consumer
    for group in (f"{app_id}-normalize", f"{app_id}-emit"):  # + their KIP-848 timing
        assert acls[("group", group)].operations == (
            "Read",
            "Describe",
            "DescribeConfigs",
            "AlterConfigs",
        )
    transactions = acls[("transactionalId", f"{app_id}-emit-")]
    assert transactions.prefixed and "Write" in transactions.operations
    assert not any(acl.resource == "cluster" for acl in acls.values())  # KIP-679


def test_a_bridge_gets_write_on_its_raw_topic_only(settings: Settings) -> None:
    assert bridge_acls(settings, None) == [Acl("topic", "files.raw", ("Write", "Describe"))]
    with pytest.raises(AclError, match=r"'files.events.tenant-a' is not one of \[stream\]"):
        bridge_acls(settings, "files.events.tenant-a")


def test_reconcile_reads_its_instances_output_and_writes_a_raw_topic(settings: Settings) -> None:
    """It publishes like a bridge and reads the keys changelog and the output topic with
    assigned partitions (no group): connectors/reconcile/stream.py read_topic."""
    assert reconcile_acls(settings, "tenant-b", None) == [
        Acl("topic", f"{settings.stream.app_id}-keys-changelog", ("Read", "Describe")),
        Acl("topic", "files.events.tenant-b", ("Read", "Describe")),
        Acl("topic", "files.raw", ("Write", "Describe")),
    ]
    assert not any(acl.resource == "group" for acl in reconcile_acls(settings, "tenant-a", None))
    with pytest.raises(AclError, match="--instance"):
        reconcile_acls(settings, None, None)
    with pytest.raises(AclError, match="is not one of"):
        reconcile_acls(settings, "tenant-a", "files.events.tenant-a")


def test_reconcile_of_one_instance_writes_the_raw_topic_that_reaches_it_only() -> None:
    """Issue 23 #1: with a reconcile topic per instance, each reconcile credential's Write
    is on its own instance's topic, which the worker lets reach that instance only; the
    command (connectors.reconcile.reconcile_topic) publishes there by default."""
    from connectors.reconcile import reconcile_topic

    scoped = Settings.model_validate(
        {
            "stream": {
                "raw_topics": [
                    {"name": "files.raw", "sources": ["s3"]},
                    {"name": "files.reconcile.a", "sources": ["reconcile"], "instances": ["a"]},
                ]
            },
            "instances": [{"name": "a"}, {"name": "b"}],
        }
    )
    assert reconcile_acls(scoped, "a", None)[-1] == Acl(
        "topic", "files.reconcile.a", ("Write", "Describe")
    )
    with pytest.raises(AclError, match=r"no .* carries reconcile deliveries to instance 'b'"):
        reconcile_acls(scoped, "b", None)
    assert reconcile_topic(scoped, "a", None) == "files.reconcile.a"
    with pytest.raises(ConfigError, match=r"no \[stream\] raw_topics entry carries"):
        reconcile_topic(scoped, "b", None)
    with pytest.raises(ConfigError, match=r"--topic files\.reconcile\.a: the worker dead-letters"):
        reconcile_topic(scoped, "b", "files.reconcile.a")
    with pytest.raises(ConfigError, match=r"--topic files\.raw"):
        reconcile_topic(scoped, "a", "files.raw")


def test_a_consumer_reads_one_instance_as_its_group(settings: Settings) -> None:
    acls = consumer_acls(settings, "tenant-b", "billing", None)
    assert acls == [
        Acl("topic", "files.events.tenant-b", ("Read", "Describe")),
        Acl("group", "billing", ("Read", "Describe")),
        Acl("topic", "files.events.tenant-b.dead-letter", ("Write", "Describe")),
    ]
    assert consumer_acls(settings, "tenant-b", "billing", "dlq")[-1].name == "dlq"
    with pytest.raises(AclError, match="--instance"):
        consumer_acls(settings, None, "billing", None)
    with pytest.raises(AclError, match="--group"):
        consumer_acls(settings, "tenant-b", None, None)


@pytest.mark.parametrize(
    ("dead_letter_topic", "why"),
    [
        ("files.events.tenant-b", "the stream's output topic"),  # forged events for tenant-b
        ("files.stale.tenant-a", "the stream's stale topic"),
        ("files.dead-letter", "the stream's dead-letter topic"),  # what replay republishes
        ("files.raw", "the stream's raw topic"),  # write into every instance
        ("storage-events.by-key", "the stream's repartition topic"),
        ("storage-events-seen-changelog", "the stream.s changelog topic"),
        ("storage-events-__assignor-__leader", "the worker.s own prefix"),
        ("files.events.tenant-b.dead-letter", "instance tenant-b's dead-letter topic"),
    ],
)
def test_a_consumer_may_write_only_its_own_dead_letter_topic(
    settings: Settings, dead_letter_topic: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 23 #4: `--dead-letter-topic X` granted Write on X whatever X was."""
    with pytest.raises(AclError, match=why):
        consumer_acls(settings, "tenant-a", "billing", dead_letter_topic)
    consumer = ("--component", "consumer", "--instance", "tenant-a", "--group", "billing")
    code = main(
        [*ACLS, "--principal", "User:c", *consumer, "--dead-letter-topic", dead_letter_topic]
    )
    captured = capsys.readouterr()
    assert (code, captured.out) == (2, "")
    assert captured.err.startswith(f"error: --dead-letter-topic {dead_letter_topic}: ")
    # Its own, default or named, is granted as before.
    assert consumer_acls(settings, "tenant-a", "billing", None)[-1].name == (
        "files.events.tenant-a.dead-letter"
    )


@pytest.mark.parametrize("suffix", ["", "-normalize", "-emit"])
def test_a_consumer_may_not_join_the_worker_s_groups(settings: Settings, suffix: str) -> None:
    """Issue 23 #4: Read on `<app_id>-emit` lets a consumer take the worker's partitions."""
    group = settings.stream.app_id + suffix
    with pytest.raises(AclError, match=f"--group {group}: one of the worker's own groups"):
        consumer_acls(settings, "tenant-a", group, None)


def test_the_kafka_acls_format_is_one_add_command_per_resource(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        ["acls", "--config", str(SHIPPED_CONFIG), "--principal", "User:w", "--component", "worker"]
    )
    assert code == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    assert len(lines) == len(worker_acls(load_settings(SHIPPED_CONFIG, environ={})))
    for line in lines:
        words = shlex.split(line)
        assert words[:2] == ["kafka-acls.sh", "--bootstrap-server"]
        assert "--add" in words and words[words.index("--allow-principal") + 1] == "User:w"
        assert '"$KAFKA_BOOTSTRAP_SERVERS"' in line  # expanded by the shell that runs it


def test_a_mistake_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    consumer = ("--component", "consumer", "--group", "g")
    code = main([*ACLS, "--principal", "User:c", *consumer, "--instance", "nope"])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: no instance named 'nope' (configured: tenant-a, tenant-b)"
    ]


@pytest.mark.parametrize("path", sorted(KAFKA_USERS.glob("*.yaml")), ids=lambda p: p.name)
def test_each_shipped_kafka_user_is_what_the_command_prints(
    path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if path.name == "kustomization.yaml":
        listed = yaml.safe_load(path.read_text())["resources"]
        assert sorted(listed) == sorted(
            p.name for p in KAFKA_USERS.glob("*.yaml") if p.name != path.name
        )
        return
    text = path.read_text()
    header = text.splitlines()[0]
    assert header.startswith("# Generated by: python -m streams acls ")
    monkeypatch.chdir(ROOT)
    for name in ("STREAMS_CONFIG", "STREAMS_APP_ID", "WEBHOOK_RAW_TOPIC"):
        monkeypatch.delenv(name, raising=False)
    assert main(shlex.split(header.removeprefix("# Generated by: python -m streams "))) == 0
    assert capsys.readouterr().out == text, f"regenerate {path.name} with its first line"
    user = yaml.safe_load(text)
    assert user["kind"] == "KafkaUser" and user["apiVersion"] == "kafka.strimzi.io/v1beta2"
    assert user["metadata"]["labels"]["strimzi.io/cluster"] == "my-cluster"
    assert user["spec"]["authorization"]["type"] == "simple"
    for rule in user["spec"]["authorization"]["acls"]:
        assert rule["resource"]["type"] in ("topic", "group", "transactionalId", "cluster")
        assert rule["resource"].get("patternType", "literal") in ("literal", "prefix")
        assert set(rule["operations"]) <= {"Read", "Write", "Create", "Describe"} | {
            "DescribeConfigs",
            "AlterConfigs",  # the stage groups' only (their KIP-848 timing)
        }


def test_a_kafka_user_needs_a_user_principal(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [*ACLS, "--principal", "CN=webhook", "--component", "bridge", "--format", "strimzi"]
    )
    assert code == 2
    assert "--principal must be User:<name>" in capsys.readouterr().err


def workloads() -> list[dict[str, Any]]:
    """Every Deployment, StatefulSet and CronJob under k8s/base and k8s/components."""
    kinds = ("Deployment", "StatefulSet", "CronJob")
    return [
        document
        for path in WORKLOAD_FILES
        for document in yaml.safe_load_all(path.read_text())
        if document and document.get("kind") in kinds
    ]


def shipped_user_commands() -> dict[str, list[str]]:
    """KafkaUser name -> the arguments of the command on its first line."""
    commands = {}
    for path in KAFKA_USERS.glob("*.yaml"):
        if path.name != "kustomization.yaml":
            text = path.read_text()
            commands[yaml.safe_load(text)["metadata"]["name"]] = shlex.split(
                text.splitlines()[0].removeprefix("# Generated by: ")
            )
    return commands


def option(words: list[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words else None


def test_every_component_gets_its_own_kafka_secrets_and_kafka_user(settings: Settings) -> None:
    """k8s/README.md "Secured Kafka": each workload takes its KAFKA_* settings from the optional
    Secret storage-events-kafka-<component>, and the Secret of its own KafkaUser and the CA
    at /etc/kafka-user and /etc/kafka-ca; the KafkaUser is shipped, for the same topics."""
    users = shipped_user_commands()
    seen = set()
    for workload in workloads():
        component = workload["metadata"]["labels"]["app.kubernetes.io/component"]
        seen.add(component)
        # A reconcile CronJob per instance (streams.cronjobs): a principal per instance.
        principal = workload["metadata"]["name"].removeprefix("storage-events-")
        if component != "reconcile":
            assert principal == component, workload["metadata"]["name"]
        spec = workload["spec"]
        template = (
            spec["jobTemplate"]["spec"]["template"] if "jobTemplate" in spec else spec["template"]
        )
        pod = template["spec"]
        [container] = pod["containers"]
        secret_refs = [s["secretRef"] for s in container["envFrom"] if "secretRef" in s]
        assert {"name": f"storage-events-kafka-{principal}", "optional": True} in secret_refs, (
            principal
        )
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        assert volumes["kafka-user"]["secret"] == {
            "secretName": f"storage-events-{principal}",
            "optional": True,
        }, principal
        assert volumes["kafka-ca"]["secret"] == {
            "secretName": "storage-events-kafka-ca",
            "optional": True,
        }, component
        mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
        assert mounts["kafka-user"] == {
            "name": "kafka-user",
            "mountPath": "/etc/kafka-user",
            "readOnly": True,
        }
        assert mounts["kafka-ca"] == {
            "name": "kafka-ca",
            "mountPath": "/etc/kafka-ca",
            "readOnly": True,
        }
        user = users.get(f"storage-events-{principal}")
        assert user, f"no KafkaUser storage-events-{principal} in k8s/kafka-users"
        command = container["command"]
        if option(user, "--component") != "worker":
            # The raw topic it may write is the one it publishes to (`--topic`, else the
            # webhook's [webhook] raw_topic, else the first raw topic); the instance whose
            # output it may read is the one it reconciles.
            first_raw = settings.stream.raw_topics[0].name
            default = settings.webhook.raw_topic if component == "webhook" else first_raw
            publishes = option(command, "--topic") or default
            assert (option(user, "--topic") or first_raw) == publishes, component
            assert option(user, "--instance") == option(command, "--instance"), component
    assert {"worker", "webhook", "sqs-bridge", "azure-queue-bridge", "pubsub-bridge"} | {
        "reconcile"
    } <= seen
