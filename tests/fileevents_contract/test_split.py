"""The package split: the stream imports the event contract from the fileevents distribution,
and fileevents imports nothing of the stream.

Where a module of the stream still holds its own copy of something fileevents ships (until its
owner re-exports fileevents' one: /root/scratch/helpers/requests.md of this session), the two
must agree, so that a consumer and the stream never decide differently."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import fileevents
import fileevents.event
import fileevents.kafka_settings
import streams.core.event
import streams.core.ordering
import streams.kafka_settings
import streams.logs

PACKAGE = Path(fileevents.__file__).resolve().parent


def test_the_stream_imports_the_contract() -> None:
    """streams.core.event is the contract's names, not a second model."""
    assert streams.core.event.FileEvent is fileevents.event.FileEvent
    assert streams.core.event.EventType is fileevents.event.EventType
    assert streams.core.event.format_time is fileevents.event.format_time
    assert streams.logs.printable is fileevents.event.printable
    assert fileevents.FileEvent is fileevents.event.FileEvent


def test_fileevents_imports_nothing_of_the_stream() -> None:
    """Every import statement of the package names fileevents or a third party."""
    offenders = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [
                f"{path.name}: {name}"
                for name in names
                if name.split(".")[0] in ("streams", "connectors", "dev", "benchmarks")
            ]
    assert offenders == []


def test_scope_agrees_with_the_streams_ordering() -> None:
    """fileevents.event.scope (what consumers scope dedupe ids by) is the stream's."""
    if streams.core.ordering.scope is fileevents.event.scope:
        return
    for provider, raw in [
        ("s3", {"awsRegion": "us-east-1"}),
        ("s3", {"awsRegion": "cn-north-1"}),
        ("eventbridge", {"region": "us-gov-west-1"}),
        ("eventbridge", {"region": "eusc-de-east-1"}),
        ("azure", {"topic": "/subscriptions/x/providers/Microsoft.Storage/storageAccounts/AcCt1"}),
        ("azure", {"source": "/providers/microsoft.storage/storageaccounts/other/x"}),
        ("azure", {"topic": 3}),
        ("gcs", None),
        ("reconcile", {}),
    ]:
        event = fileevents.event.FileEvent(
            id="i", type="created", key="k", provider=provider, raw=raw
        )
        assert fileevents.event.scope(event) == streams.core.ordering.scope(event), raw
    for name in ("AWS_PARTITIONS", "AWS_REGION_FIELD", "STORAGE_ACCOUNT"):
        assert getattr(fileevents.event, name) == getattr(streams.core.ordering, name), name


def test_kafka_settings_is_one_module() -> None:
    """fileevents' connection settings are the stream's (one `[kafka]` configuration)."""
    if streams.kafka_settings.KafkaSettings is fileevents.kafka_settings.KafkaSettings:
        return
    assert inspect.getsource(streams.kafka_settings) == inspect.getsource(
        fileevents.kafka_settings
    ), "streams/kafka_settings.py and fileevents' copy differ: re-export fileevents' one"


def test_the_stack_record_is_read_as_streams_writes_it() -> None:
    """streams.localstack re-exports fileevents.localstack (the `make run` stack's record,
    which the consumer follows with no address given): the stream writes the record and the
    consumer reads it with the same functions, not copies."""
    import fileevents.localstack
    import streams.localstack

    ours, theirs = fileevents.localstack, streams.localstack
    for name in ("Stack", "run_dir", "stack_file", "write", "remove", "recorded", "running"):
        assert getattr(theirs, name) is getattr(ours, name), name
    for name in ("belongs_to", "command_environ", "_alive", "LOCATING", "STACK_FILE_NAME"):
        assert getattr(theirs, name) is getattr(ours, name), name
