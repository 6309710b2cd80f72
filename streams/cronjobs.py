"""`python -m streams cronjobs`: one reconcile CronJob per instance that is reconciled on a
schedule, as Kubernetes YAML (k8s/components/reconcile/cronjobs.yaml is its output).

An instance is scheduled when its `reconcile_schedule` says so, or, unset, when its `sources`
name Supabase (streams.config.RECONCILED_BY_DEFAULT: Supabase sends each webhook once).
Each CronJob runs `python -m connectors reconcile --instance NAME` with the instance's
`reconcile_endpoint_url`, and `--expected-interval`, the longest gap between two runs of the
schedule (streams.schedule), which the run pushes with its metrics so that an alert can tell
a missing run (RECONCILE_PUSHGATEWAY_URL, connectors.reconcile.report). Per instance, with
`<slug>` its name as a Kubernetes name allows:

* CronJob `storage-events-reconcile-<slug>`, label `storage-events/instance: <slug>`;
* the listing's credentials from the Secret `storage-events-listing-<slug>` (S3 API:
  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION; the other listings' variables:
  connectors.reconcile.listings), required;
* its Kafka principal: KafkaUser `storage-events-reconcile-<slug>` (its Secret mounted at
  /etc/kafka-user) and `storage-events-kafka-reconcile-<slug>` (KAFKA_* settings), both
  optional, as every component (k8s/README.md "Secured Kafka").

The safety bound of reconcile stays at its default (no --force, no --max-deletes): a run that
would delete too much publishes nothing, exits 3 and says so in its metrics.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import zlib
from typing import Any

from streams.config import ConfigError, InstanceConfig, Settings, load_settings
from streams.schedule import longest_gap_s

PREFIX = "storage-events-reconcile-"
NAME_ROOM = 52 - len(PREFIX)  # a CronJob's name has at most 52 characters
ACTIVE_DEADLINE_S = 1800
STARTING_DEADLINE_S = 600


def slug(name: str) -> str:
    """The instance's name as a part of Kubernetes names: itself when it is one (lower case,
    letters, digits, `-`, short enough), else a readable part and a hash of the name."""
    readable = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if readable == name and len(name) <= NAME_ROOM:
        return name
    digest = f"{zlib.crc32(name.encode()):08x}"[:6]
    return f"{readable[: NAME_ROOM - 7].strip('-') or 'instance'}-{digest}"


def _field(settings: Settings, instance: InstanceConfig, field: str) -> str:
    return f"instances.{settings.instances.index(instance)}.{field} ({instance.name})"


def check(settings: Settings, instance: InstanceConfig) -> None:
    """A scheduled reconcile of `instance` can run; else ConfigError naming the field."""
    from connectors.reconcile import reconcile_topic  # the connectors' own rules
    from connectors.reconcile.listings import SOURCE_LISTINGS, listing

    source = instance.reconciled_source or "s3"
    if source not in SOURCE_LISTINGS:
        raise ConfigError(
            f"{_field(settings, instance, 'reconcile_schedule')}: no listing for source "
            f"{source!r}; set reconcile_schedule = false"
        )
    if instance.bucket is None and not listing(SOURCE_LISTINGS[source]).bucketless:
        raise ConfigError(
            f"{_field(settings, instance, 'bucket')}: a scheduled reconcile lists one bucket; "
            "name it, or set reconcile_schedule = false"
        )
    if "supabase" in (instance.sources or ()) and instance.reconcile_endpoint_url is None:
        raise ConfigError(
            f"{_field(settings, instance, 'reconcile_endpoint_url')}: required to list "
            "Supabase Storage (https://<project>.supabase.co/storage/v1/s3), or set "
            "reconcile_schedule = false"
        )
    reconcile_topic(settings, instance.name, None)


def cronjob(instance: InstanceConfig) -> dict[str, Any]:
    schedule = instance.reconcile_cron
    assert schedule is not None
    part = slug(instance.name)
    gap = longest_gap_s(schedule)
    command = ["python", "-m", "connectors", "reconcile", "--instance", instance.name]
    if instance.reconcile_endpoint_url:
        command += ["--endpoint-url", instance.reconcile_endpoint_url]
    command += ["--expected-interval", str(gap)]
    kafka_user = f"{PREFIX}{part}"
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {
            "name": f"{PREFIX}{part}",
            "labels": {"app.kubernetes.io/component": "reconcile", "storage-events/instance": part},
        },
        "spec": {
            "schedule": schedule,
            "timeZone": "Etc/UTC",
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": max(10, min(STARTING_DEADLINE_S, gap // 2)),
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "spec": {
                    "backoffLimit": 2,
                    "activeDeadlineSeconds": max(300, min(ACTIVE_DEADLINE_S, gap)),
                    "template": {
                        "metadata": {
                            "labels": {
                                "app.kubernetes.io/name": "storage-events",
                                "app.kubernetes.io/component": "reconcile",
                                "storage-events/instance": part,
                            }
                        },
                        "spec": _pod(command, part, kafka_user),
                    },
                }
            },
        },
    }


def _pod(command: list[str], part: str, kafka_user: str) -> dict[str, Any]:
    return {
        "restartPolicy": "Never",
        "serviceAccountName": "storage-events",
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "reconcile",
                "image": "storage-events",
                "imagePullPolicy": "IfNotPresent",
                "command": command,
                "envFrom": [
                    {"configMapRef": {"name": "storage-events-env"}},
                    {"secretRef": {"name": f"storage-events-listing-{part}"}},
                    {
                        "secretRef": {
                            "name": f"storage-events-kafka-reconcile-{part}",
                            "optional": True,
                        }
                    },
                ],
                "env": [{"name": "STREAMS_CONFIG", "value": "/etc/storage-events/streams.toml"}],
                "resources": {
                    "requests": {"cpu": "100m", "memory": "256Mi"},
                    "limits": {"cpu": "1", "memory": "1Gi"},
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "runAsNonRoot": True,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [
                    {"name": "config", "mountPath": "/etc/storage-events", "readOnly": True},
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "kafka-user", "mountPath": "/etc/kafka-user", "readOnly": True},
                    {"name": "kafka-ca", "mountPath": "/etc/kafka-ca", "readOnly": True},
                ],
            }
        ],
        "volumes": [
            {"name": "config", "configMap": {"name": "storage-events-config"}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
            {"name": "kafka-user", "secret": {"secretName": kafka_user, "optional": True}},
            {
                "name": "kafka-ca",
                "secret": {"secretName": "storage-events-kafka-ca", "optional": True},
            },
        ],
    }


def scheduled(settings: Settings) -> list[InstanceConfig]:
    """The instances with a reconcile CronJob, each checked; ConfigError naming the field."""
    chosen = [instance for instance in settings.instances if instance.reconcile_cron]
    for instance in chosen:
        check(settings, instance)
    names = [slug(instance.name) for instance in chosen]
    clashing = sorted({name for name in names if names.count(name) > 1})
    if clashing:
        raise ConfigError(f"instances: reconcile CronJob names clash: {', '.join(clashing)}")
    return chosen


def yaml_lines(value: Any, indent: int = 0) -> list[str]:
    """Block-style YAML of dicts, lists and scalars (scalars as JSON, which YAML reads)."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                lines.append(f"{pad}{key}:")
                lines += yaml_lines(item, indent + 2)
            else:
                lines.append(f"{pad}{key}: {json.dumps(item)}")
        return lines
    for item in value:
        if isinstance(item, dict | list) and item:
            nested = yaml_lines(item, indent + 2)
            lines.append(f"{pad}- {nested[0].lstrip()}")
            lines += nested[1:]
        else:
            lines.append(f"{pad}- {json.dumps(item)}")
    return lines


HEADER = """\
# One reconcile CronJob per instance that is reconciled on a schedule (reconcile_schedule in
# streams.toml; by default every instance whose sources name supabase): docs/reconcile.md.
# Each needs the Secret storage-events-listing-<instance> (the listing's credentials) and,
# on a secured Kafka, its KafkaUser storage-events-reconcile-<instance> (k8s/kafka-users).
# Regenerate with the command above after changing an instance; tests/k8s checks it is current."""


def render(settings: Settings, command: str) -> str:
    documents = [yaml_lines(cronjob(instance)) for instance in scheduled(settings)]
    text = f"# Generated by: {command}\n{HEADER}\n"
    if not documents:
        return text + "# (no instance is reconciled on a schedule)\n"
    return text + "".join("---\n" + "\n".join(lines) + "\n" for lines in documents)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="config file (default: $STREAMS_CONFIG)")


def command_cronjobs(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    words = ["python", "-m", "streams", "cronjobs"]
    if args.config:
        words += ["--config", args.config]
    print(render(settings, " ".join(shlex.quote(word) for word in words)), end="")
    return 0
