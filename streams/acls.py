"""The Kafka ACLs each component needs, and nothing more, derived from the configuration.

    python -m streams acls --principal User:worker --component worker
    python -m streams acls --principal User:webhook --component bridge [--topic files.raw]
    python -m streams acls --principal User:reconcile --component reconcile --instance tenant-a
    python -m streams acls --principal User:tenant-a-app --component consumer \\
        --instance tenant-a --group tenant-a-app [--dead-letter-topic NAME]
    ... --format strimzi [--cluster my-cluster] [--authentication tls]   # a KafkaUser

The topic names come from `streams.engine.topics.topology` (one list for the worker, create-topics
and the KafkaTopic manifests), so the ACLs cannot name other topics than the stream uses:

* worker: Read the raw topics; Read and Write the repartition topic; Read, Write and Create
  its own topics (`<app_id>-` prefixed: the changelogs, Faust's assignor topic); Write the
  outputs, stale outputs and the dead-letter topic; DescribeConfigs of them all (the start-up
  check of `max.message.bytes`); its groups `<app_id>`, `<app_id>-normalize`, `<app_id>-emit`
  (the stage groups' configs too: their KIP-848 session timeout and heartbeat);
  its transactional ids (`<app_id>-emit-<partition>`, prefixed).
* bridge: Write its raw topic, nothing else.
* reconcile (`python -m connectors reconcile --instance NAME`): what a bridge has (it
  publishes to a raw topic), and Read of the worker's keys changelog (`<app_id>-keys-changelog`:
  what the stream knows per key; it holds every instance's keys, which Kafka ACLs cannot
  split) and of that one instance's output topic, both read from the beginning with assigned
  partitions (no consumer group, so no group ACL).
* consumer (`fileevents`): Read one instance's output topic as its group, Write its
  dead-letter topic. Refused: a dead-letter topic of the stream's topology (raw, repartition,
  outputs, stale, the stream's dead-letter topic, changelogs), under the worker's `<app_id>-`
  prefix, or another instance's `<topic>.dead-letter`; a group of the worker's own.

No cluster ACL: since Kafka 2.8 (KIP-679) an idempotent producer needs Write on a topic, not
IdempotentWrite on the cluster, and Kafka 4 brokers only work that way. Read, Write and
Create imply Describe on the same resource; it is listed anyway, as kafka-acls.sh's
`--producer` / `--consumer` shortcuts do, so that the lists read as what each client does.
"""

from __future__ import annotations

import argparse
import json
import shlex
from dataclasses import dataclass
from typing import Any, Literal

from streams.config import ConfigError, Settings, load_settings
from streams.engine.topics import topology

ResourceType = Literal["topic", "group", "transactionalId", "cluster"]
COMPONENTS = ("worker", "bridge", "reconcile", "consumer")
KAFKA_ACLS_OPTION = {
    "topic": "--topic",
    "group": "--group",
    "transactionalId": "--transactional-id",
}


class AclError(ConfigError):
    """The command names something the configuration does not have; one line, exit 2."""


@dataclass(frozen=True, slots=True)
class Acl:
    """Allow `operations` on one resource (a name, or every name with that prefix)."""

    resource: ResourceType
    name: str
    operations: tuple[str, ...]
    prefixed: bool = False


def worker_acls(settings: Settings) -> list[Acl]:
    """What `faust -A streams worker` does on Kafka, per resource."""
    app_id = settings.stream.app_id
    specs = topology(settings)
    internal = f"{app_id}-"
    acls: list[Acl] = []
    for spec in specs:
        if spec.name.startswith(internal):
            continue  # covered by the prefixed ACL below
        if spec.role == "raw":
            operations: tuple[str, ...] = ("Read", "Describe", "DescribeConfigs")
        elif spec.role == "repartition":
            operations = ("Read", "Write", "Describe", "DescribeConfigs")
        else:  # output, stale, dead-letter
            operations = ("Write", "Describe", "DescribeConfigs")
        acls.append(Acl("topic", spec.name, operations))
    acls.append(
        Acl("topic", internal, ("Read", "Write", "Create", "Describe", "DescribeConfigs"), True)
    )
    acls.append(Acl("group", app_id, ("Read", "Describe")))  # Faust's own consumer
    # AlterConfigs: the stage groups' KIP-848 timing (streams.engine.librdkafka.group_config).
    acls += [
        Acl("group", group, ("Read", "Describe", "DescribeConfigs", "AlterConfigs"))
        for group in (f"{app_id}-normalize", f"{app_id}-emit")
    ]
    acls.append(Acl("transactionalId", f"{app_id}-emit-", ("Write", "Describe"), True))
    return acls


def bridge_acls(settings: Settings, topic: str | None) -> list[Acl]:
    """A bridge publishes to one raw topic (`--topic` of the bridge; default the first)."""
    raw_topics = [raw.name for raw in settings.stream.raw_topics]
    chosen = topic or raw_topics[0]
    if chosen not in raw_topics:
        raise AclError(
            f"--topic {chosen!r} is not one of [stream] raw_topics ({', '.join(raw_topics)}): "
            "the worker would not read it"
        )
    return [Acl("topic", chosen, ("Write", "Describe"))]


def reconcile_acls(settings: Settings, instance: str | None, topic: str | None) -> list[Acl]:
    """Reconcile of one instance: read the worker's keys changelog (what the stream knows, by
    default) and its output topic (`--known-from output`, and telling a worker older than
    per-key state) to the end (group_id=None, partitions assigned: no group), publish the
    drift to the raw topic (`--topic`, default the first)."""
    from streams.engine.topics import KEYS_TABLE, changelog_topic

    if not instance:
        raise AclError("--component reconcile needs --instance NAME (the one it reconciles)")
    output = settings.instance(instance).output_topic
    chosen = topic or settings.stream.raw_topic_for("reconcile", instance)
    if chosen is None:
        raise AclError(
            f"no [stream] raw_topics entry carries reconcile deliveries to instance {instance!r}"
        )
    return [
        Acl("topic", changelog_topic(settings, KEYS_TABLE), ("Read", "Describe")),
        Acl("topic", output, ("Read", "Describe")),
        *bridge_acls(settings, chosen),
    ]


def consumer_acls(
    settings: Settings, instance: str | None, group: str | None, dead_letter_topic: str | None
) -> list[Acl]:
    """A `fileevents` consumer of one instance, as `group`, dead-lettering to
    `dead_letter_topic` (FileEvents' default: `<topic>.dead-letter`)."""
    if not instance:
        raise AclError("--component consumer needs --instance NAME (whose events it reads)")
    if not group:
        raise AclError("--component consumer needs --group NAME (FileEvents' group_id)")
    topic = settings.instance(instance).output_topic
    dead_letters = dead_letter_topic or f"{topic}.dead-letter"
    refused = consumer_refusal(settings, instance, group, dead_letters)
    if refused is not None:
        raise AclError(refused)
    return [
        Acl("topic", topic, ("Read", "Describe")),
        Acl("group", group, ("Read", "Describe")),
        Acl("topic", dead_letters, ("Write", "Describe")),
    ]


def consumer_refusal(
    settings: Settings, instance: str, group: str, dead_letter_topic: str
) -> str | None:
    """Why a consumer of `instance` must not get these grants, or None.

    Write on a topic of the stream's topology is write into the stream (a raw topic: into
    every instance; an output topic: forged events for its tenant; the stream's dead-letter
    topic: what `replay-dead-letters` republishes), and so is write on another instance's
    consumer dead-letter topic or on a name under the worker's `<app_id>-` prefix. Read as
    one of the worker's groups joins it, and takes partitions from the worker."""
    app_id = settings.stream.app_id
    worker_groups = (app_id, f"{app_id}-normalize", f"{app_id}-emit")
    if group in worker_groups:
        return (
            f"--group {group}: one of the worker's own groups ({', '.join(worker_groups)}); a "
            "consumer joining it takes partitions from the worker: name the consumer's own"
        )
    roles = {spec.name: spec.role for spec in topology(settings)}
    others = {
        f"{other.output_topic}.dead-letter": other.name
        for other in settings.instances
        if other.name != instance
    }
    if dead_letter_topic in roles:
        what = f"the stream's {roles[dead_letter_topic]} topic"
    elif dead_letter_topic.startswith(f"{app_id}-"):
        what = f"under the worker's own prefix {app_id}-"
    elif dead_letter_topic in others:
        what = f"instance {others[dead_letter_topic]}'s dead-letter topic"
    else:
        return None
    return (
        f"--dead-letter-topic {dead_letter_topic}: {what}; a consumer of {instance} may write "
        "its own dead-letter topic only (default <topic>.dead-letter)"
    )


def component_acls(settings: Settings, args: argparse.Namespace) -> list[Acl]:
    if args.component == "worker":
        return worker_acls(settings)
    if args.component == "bridge":
        return bridge_acls(settings, args.topic)
    if args.component == "reconcile":
        return reconcile_acls(settings, args.instance, args.topic)
    return consumer_acls(settings, args.instance, args.group, args.dead_letter_topic)


def kafka_acls_lines(principal: str, acls: list[Acl], bootstrap: str, command_config: str) -> str:
    """One `kafka-acls.sh --add` command per resource (a shell script)."""
    lines = []
    for acl in acls:
        words = [
            "kafka-acls.sh",
            "--bootstrap-server",
            bootstrap,
            "--command-config",
            command_config,
            "--add",
            "--allow-principal",
            principal,
        ]
        for operation in acl.operations:
            words += ["--operation", operation]
        if acl.resource == "cluster":
            words.append("--cluster")
        else:
            words += [KAFKA_ACLS_OPTION[acl.resource], acl.name]
        if acl.prefixed:
            words += ["--resource-pattern-type", "prefixed"]
        # The bootstrap stays a variable reference the shell expands, unquoted by us.
        lines.append(" ".join(shlex.quote(word) if word != bootstrap else word for word in words))
    return "\n".join(lines)


def strimzi_user(
    principal: str, acls: list[Acl], cluster: str, authentication: str, description: str
) -> str:
    """A Strimzi `KafkaUser` (kafka.strimzi.io/v1beta2) with these ACLs, as YAML.

    Written as JSON-compatible YAML flow values where quoting matters, so that no YAML
    library is needed and every name stays a string."""
    kind, _, name = principal.partition(":")
    if kind != "User" or not name:
        raise AclError(f"--principal must be User:<name> for a KafkaUser, got {principal!r}")
    lines = [
        f"# {description}",
        "apiVersion: kafka.strimzi.io/v1beta2",
        "kind: KafkaUser",
        "metadata:",
        f"  name: {json.dumps(name)}",
        "  labels:",
        f"    strimzi.io/cluster: {json.dumps(cluster)}",
        "spec:",
        "  authentication:",
        f"    type: {authentication}",
        "  authorization:",
        "    type: simple",
        "    acls:",
    ]
    for acl in acls:
        resource: dict[str, Any] = {"type": acl.resource}
        if acl.resource != "cluster":
            resource |= {"name": acl.name, "patternType": "prefix" if acl.prefixed else "literal"}
        lines += ["      - resource:"]
        lines += [f"          {key}: {json.dumps(value)}" for key, value in resource.items()]
        lines += [f"        operations: {json.dumps(list(acl.operations))}", '        host: "*"']
    return "\n".join(lines)


def command_line(args: argparse.Namespace) -> str:
    """The command that prints this output again (for the header of a shipped file)."""
    words = ["python", "-m", "streams", "acls"]
    options: tuple[str, ...] = ("config", "principal", "component", "topic", "instance", "group")
    options += ("dead_letter_topic", "format", "cluster", "authentication")
    for option in options:
        value = getattr(args, option)
        if value is not None:
            words += [f"--{option.replace('_', '-')}", value]
    return " ".join(shlex.quote(word) for word in words)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="config file (default: $STREAMS_CONFIG)")
    parser.add_argument(
        "--principal", required=True, help="the component's principal, e.g. User:worker"
    )
    parser.add_argument("--component", required=True, choices=COMPONENTS)
    parser.add_argument(
        "--topic", help="bridge, reconcile: the raw topic it publishes to (default: first)"
    )
    parser.add_argument(
        "--instance", help="consumer, reconcile: the instance whose events it reads"
    )
    parser.add_argument("--group", help="consumer: its consumer group (FileEvents group_id)")
    parser.add_argument(
        "--dead-letter-topic", help="consumer: its dead-letter topic (default <topic>.dead-letter)"
    )
    parser.add_argument("--format", choices=("kafka-acls", "strimzi"), default="kafka-acls")
    parser.add_argument(
        "--bootstrap-server",
        default='"$KAFKA_BOOTSTRAP_SERVERS"',
        help="kafka-acls: the value of --bootstrap-server (default: the shell variable)",
    )
    parser.add_argument(
        "--command-config",
        default="admin.properties",
        help="kafka-acls: the admin's client properties file",
    )
    parser.add_argument("--cluster", default="my-cluster", help="strimzi: strimzi.io/cluster")
    parser.add_argument(
        "--authentication",
        choices=("scram-sha-512", "tls", "tls-external"),
        default="scram-sha-512",
        help="strimzi: the KafkaUser's authentication (tls: mutual TLS, principal CN=<name>)",
    )


def command_acls(args: argparse.Namespace) -> int:
    """Print the ACLs of `--component` for `--principal`."""
    settings = load_settings(args.config)
    acls = component_acls(settings, args)
    if args.format == "strimzi":
        description = f"Generated by: {command_line(args)}"
        print(strimzi_user(args.principal, acls, args.cluster, args.authentication, description))
    else:
        print(f"# ACLs of the {args.component} for {args.principal} (python -m streams acls)")
        print(kafka_acls_lines(args.principal, acls, args.bootstrap_server, args.command_config))
    return 0
