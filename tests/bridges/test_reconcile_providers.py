"""`python -m connectors reconcile` against every listing provider, through a real worker.

Per provider: the stream is told about some objects (the provider's own notification, written
to the raw topic as its bridge would), then an object is deleted and another added with the
notification withheld; reconcile must emit exactly that drift once on the instance's output,
and a second run must publish nothing. GCS runs against a real emulator (gcp-storage-emulator),
Azure Blob against Azurite's blob service. Box, Cloudinary and Appwrite have no emulator: they
run against contract servers answering as those providers' documentation says their list APIs
do (tests/support/list_apis.py names the pages). The S3 API is tested in
test_reconcile_command.py (moto). Also here: the safety bound (an empty listing refused,
`--dry-run` saying so, `--force` passing it), a listing failing part-way publishes nothing,
and progress lines on stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from support.azurite import AzuriteBlob, azurite_blob  # noqa: F401
from support.gcs_emulator import GcsEmulator, gcs_emulator  # noqa: F401
from support.kafka_io import Header, produce, raw, read_topic
from support.list_apis import (
    APPWRITE_KEY,
    APPWRITE_PROJECT,
    BOX_TOKEN,
    CLOUDINARY_CLOUD,
    CLOUDINARY_KEY,
    CLOUDINARY_SECRET,
    ListApis,
    appwrite_file,
    box_file,
    box_folder,
    cloudinary_resource,
    serve,
)
from support.moto_server import unique_name
from support.payloads import appwrite_body, azure_event, box_body, gcs_pull
from support.worker import ROOT, Topology, Worker, wait_for

GCS_BUCKET = unique_name("gcs-reconciled")
AZURE_CONTAINER = unique_name("azure-reconciled")
BOX_SHA1 = "2c61623e86bee78e6ab444af456bccc7a1164095"  # what support.payloads.box_body carries
APPWRITE_SIGNATURE = "5d529fd02b544198ae075bd57c1762bb"  # support.payloads.appwrite_body's

Record = tuple[bytes, list[Header]]


class Stack:
    """One worker, its topics, and reconcile runs against it."""

    def __init__(self, bootstrap: str, names: Topology, worker: Worker, env: dict[str, str]):
        self.bootstrap, self.names, self.worker, self.env = bootstrap, names, worker, env

    def reconcile(self, instance: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                *(sys.executable, "-m", "connectors", "--config", str(self.worker.config_path)),
                *("reconcile", "--instance", instance, *extra),
            ],
            cwd=ROOT,
            env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap, **self.env},
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )

    def notify(self, records: Sequence[Record]) -> None:
        asyncio.run(produce(self.bootstrap, self.names.raw, records))

    def raw_count(self) -> int:
        return len(asyncio.run(read_topic(self.bootstrap, self.names.raw)))

    def events(self, instance: str) -> list[dict[str, Any]]:
        reads = asyncio.run(read_topic(self.bootstrap, self.names.output(instance)))
        return [read.json() for read in reads]

    def wait_for(self, instance: str, *wanted: tuple[str, str, str]) -> list[dict[str, Any]]:
        def ready() -> list[dict[str, Any]] | None:
            events = self.events(instance)
            seen = {(e["type"], e["key"], e["provider"]) for e in events}
            return events if set(wanted) <= seen else None

        try:
            found: list[dict[str, Any]] = wait_for(ready, 45, f"{wanted} on {instance}", 0.3)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; worker log:\n{self.worker.tail()}") from None
        return found


def summary(result: subprocess.CompletedProcess[str], code: int = 0) -> dict[str, str]:
    assert result.returncode == code, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("reconcile "), result.stdout
    return dict(part.split("=", 1) for part in last.split()[1:] if "=" in part)


def triples(events: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return sorted((e["type"], e["key"], e["provider"]) for e in events)


def drift_once(
    stack: Stack,
    instance: str,
    provider: str,
    notified: dict[str, Record],
    behind_the_back: Callable[[], None],
    gone: str,
    new: str,
    *options: str,
) -> subprocess.CompletedProcess[str]:
    """Notify `notified` (key -> record), delete `gone` and add `new` unannounced, reconcile
    twice: exactly the drift once, then nothing. The first run's result is returned."""
    stack.notify(list(notified.values()))
    stack.wait_for(instance, *(("created", key, provider) for key in notified))
    behind_the_back()

    # One delete of a few known keys is above the default 10% bound: allowed by name.
    first = stack.reconcile(instance, "--max-deletes", "1", *options)
    figures = summary(first)
    assert (figures["created"], figures["deleted"], figures["published"]) == ("1", "1", "2")
    events = stack.wait_for(instance, ("deleted", gone, "reconcile"), ("created", new, "reconcile"))
    expected = sorted(
        [("created", key, provider) for key in notified]
        + [("deleted", gone, "reconcile"), ("created", new, "reconcile")]
    )
    assert triples(events) == expected

    raw_before = stack.raw_count()
    second = summary(stack.reconcile(instance, *options))
    assert (second["created"], second["deleted"], second["published"]) == ("0", "0", "0")
    assert second["known"] == second["in_sync"] == str(len(notified))
    assert stack.raw_count() == raw_before
    assert triples(stack.events(instance)) == expected
    return first


# --- the stacks ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def apis() -> Iterator[ListApis]:
    yield from serve()


def _env(apis: ListApis, azurite: AzuriteBlob) -> dict[str, str]:
    return {
        "BOX_ACCESS_TOKEN": BOX_TOKEN,
        "CLOUDINARY_URL": f"cloudinary://{CLOUDINARY_KEY}:{CLOUDINARY_SECRET}@{CLOUDINARY_CLOUD}",
        "APPWRITE_API_KEY": APPWRITE_KEY,
        "TEST_AZURE_BLOB": azurite.connection_string(),
    }


@pytest.fixture(scope="module")
def stack(
    kafka_bootstrap: str,
    apis: ListApis,
    azurite_blob: AzuriteBlob,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    """GCS, Azure, Box and Appwrite instances on one worker (Cloudinary has its own: its
    bucketless reconcile events would pass the Box instance's filters, see `cloudinary`)."""
    names = Topology()
    config = names.config(
        [
            {"name": "gcs", "bucket": GCS_BUCKET, "prefix": "t", "sources": ["gcs"]},
            {"name": "azure", "bucket": AZURE_CONTAINER, "prefix": "t", "sources": ["azure"]},
            {"name": "box", "bucket": "box-only", "sources": ["box"]},
            {"name": "appwrite", "bucket": "aw-files", "sources": ["appwrite"]},
            {"name": "emptied", "bucket": "aw-emptied", "sources": ["appwrite"]},
        ]
    )
    worker = Worker(kafka_bootstrap, config, tmp_path_factory.mktemp("reconcile-providers"))
    worker.start()
    try:
        yield Stack(kafka_bootstrap, names, worker, _env(apis, azurite_blob))
    finally:
        assert worker.stop() == 0, worker.tail()


# --- per provider ----------------------------------------------------------------------------


@pytest.mark.kafka
def test_gcs(stack: Stack, gcs_emulator: GcsEmulator) -> None:  # noqa: F811
    client = gcs_emulator.client()
    bucket = client.create_bucket(GCS_BUCKET)

    def upload(name: str) -> dict[str, Any]:
        bucket.blob(name).upload_from_string(name.encode())
        resource: dict[str, Any] = bucket.get_blob(name)._properties
        return resource

    notified = {
        key: gcs_pull(upload(f"t/{key}"), "OBJECT_FINALIZE")
        for key in ("keep.txt", "gone.txt", "also kept.txt")
    }
    upload("other/not-ours.txt")

    def behind_the_back() -> None:
        bucket.blob("t/gone.txt").delete()
        upload("t/new.txt")

    first = drift_once(
        stack,
        "gcs",
        "gcs",
        notified,
        behind_the_back,
        "gone.txt",
        "new.txt",
        *("--endpoint-url", gcs_emulator.endpoint, "--progress-interval", "0"),
    )
    assert "deleted t/gone.txt (not-listed)" in first.stdout
    # Progress on stderr (every step with --progress-interval 0): listed, compared, published.
    progress = [line for line in first.stderr.splitlines() if "reconcile progress:" in line]
    assert any("listed=3 " in line for line in progress), first.stderr  # other/ not listed
    assert any("compared=3 " in line for line in progress), first.stderr
    assert "published=2 " in progress[-1], first.stderr
    new = next(e for e in stack.events("gcs") if e["key"] == "new.txt")
    assert (new["etag"], new["size"], new["bucket"]) == (
        bucket.get_blob("t/new.txt").etag,
        len(b"t/new.txt"),
        GCS_BUCKET,
    )


@pytest.mark.kafka
def test_azure_blob(stack: Stack, azurite_blob: AzuriteBlob) -> None:  # noqa: F811
    from azure.storage.blob import BlobServiceClient

    container = BlobServiceClient.from_connection_string(
        azurite_blob.connection_string()
    ).create_container(AZURE_CONTAINER)

    def upload(name: str) -> str:
        etag: str = container.get_blob_client(name).upload_blob(name.encode())["etag"]
        return etag

    notified: dict[str, Record] = {}
    for n, key in enumerate(("keep.txt", "gone.txt", "dir/also kept.txt"), start=1):
        event = azure_event(f"evt-{n}", f"t/{key}", f"{n:064d}", container=AZURE_CONTAINER)
        event["data"]["eTag"] = upload(f"t/{key}")
        notified[key] = raw(json.dumps(event), "azure", transport="webhook")

    def behind_the_back() -> None:
        container.delete_blob("t/gone.txt")
        upload("t/new.txt")

    drift_once(
        stack,
        "azure",
        "azure",
        notified,
        behind_the_back,
        "gone.txt",
        "new.txt",
        *("--azure-connection-string-env", "TEST_AZURE_BLOB"),
    )


@pytest.mark.kafka
def test_box(stack: Stack, apis: ListApis) -> None:
    apis.box_folders.update(
        {
            "0": [
                box_file("1001", "a.png", BOX_SHA1),
                box_folder("77", "sub"),
                box_file("1003", "c.png", BOX_SHA1),
            ],
            "77": [box_file("1002", "b.png", BOX_SHA1), box_folder("78", "deeper")],
            "78": [],
        }
    )
    notified = {
        file_id: raw(box_body(file_id, f"box-evt-{file_id}"), "box", transport="webhook")
        for file_id in ("1001", "1002", "1003")
    }

    def behind_the_back() -> None:
        apis.box_folders["77"] = [apis.box_folders["77"][1]]  # 1002 gone
        apis.box_folders["78"] = [box_file("1005", "new.png", "9" * 40)]

    before = len(apis.requests)
    drift_once(
        stack,
        "box",
        "box",
        notified,
        behind_the_back,
        "1002",
        "1005",
        "--endpoint-url",
        f"{apis.base}/box",
    )
    walked = apis.requests[before:]
    assert any("marker=m2" in url for url in walked), walked  # the root folder's second page
    assert any("/folders/78/items" in url for url in walked), walked  # two levels down

    # A listing that fails part-way publishes nothing, not even for the keys it reached.
    apis.box_folders["0"].append(box_file("1006", "unseen.png", "8" * 40))
    apis.fail_after = len(apis.requests) + 1
    raw_before = stack.raw_count()
    try:
        failed = stack.reconcile("box", "--endpoint-url", f"{apis.base}/box", "--force")
    finally:
        apis.fail_after = None
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "listing Box folder 0 failed: HTTP 400: Invalid marker" in failed.stderr
    assert "nothing published" in failed.stderr
    assert "published=" not in failed.stdout
    assert stack.raw_count() == raw_before


@pytest.mark.kafka
def test_appwrite(stack: Stack, apis: ListApis) -> None:
    apis.appwrite["aw-files"] = [
        appwrite_file(file_id, "aw-files", APPWRITE_SIGNATURE) for file_id in ("f1", "f2", "f3")
    ]
    notified = {file_id: appwrite_body(file_id, "aw-files") for file_id in ("f1", "f2", "f3")}

    def behind_the_back() -> None:
        apis.appwrite["aw-files"] = [f for f in apis.appwrite["aw-files"] if f["$id"] != "f2"] + [
            appwrite_file("f9", "aw-files", "0" * 32)
        ]

    before = len(apis.requests)
    drift_once(
        stack,
        "appwrite",
        "appwrite",
        notified,
        behind_the_back,
        "f2",
        "f9",
        *("--endpoint-url", f"{apis.base}/appwrite", "--appwrite-project", APPWRITE_PROJECT),
        *("--appwrite-page-size", "2"),
    )
    assert any("cursorAfter" in url for url in apis.requests[before:])


@pytest.mark.kafka
def test_an_empty_listing_is_refused_unless_forced(stack: Stack, apis: ListApis) -> None:
    apis.appwrite["aw-emptied"] = []  # the bucket answers, and lists nothing
    stack.notify([appwrite_body(file_id, "aw-emptied") for file_id in ("e1", "e2")])
    stack.wait_for("emptied", ("created", "e1", "appwrite"), ("created", "e2", "appwrite"))
    options = ("--endpoint-url", f"{apis.base}/appwrite", "--appwrite-project", APPWRITE_PROJECT)
    raw_before = stack.raw_count()

    refused = stack.reconcile("emptied", *options)
    figures = summary(refused, code=3)
    assert (figures["listed"], figures["known"], figures["deleted"]) == ("0", "2", "2")
    assert refused.stdout.strip().endswith("published=0 (refused)")
    # Issue 35, item 4: each drift line says it was not published; no Kafka client chatter.
    drift_lines = [line for line in refused.stdout.splitlines() if line.startswith("deleted ")]
    assert len(drift_lines) == 2
    assert all(line.endswith(": not published (refused)") for line in drift_lines)
    assert "aiokafka" not in refused.stderr, refused.stderr
    assert "published nothing: the listing holds no key the instance keeps" in refused.stderr
    assert "--force" in refused.stderr
    # A share above the bound, however many: --max-deletes below the count still refuses.
    assert summary(stack.reconcile("emptied", *options, "--max-deletes", "1"), code=3)
    dry = stack.reconcile("emptied", *options, "--dry-run")
    assert summary(dry)["deleted"] == "2"
    assert dry.stdout.strip().endswith("published=0 (dry run)")
    assert "deleted e1 (not-listed): not published (dry run)" in dry.stdout
    assert "a real run would publish nothing: the listing holds no key" in dry.stderr
    assert stack.raw_count() == raw_before

    forced = summary(stack.reconcile("emptied", *options, "--force"))
    assert (forced["deleted"], forced["published"]) == ("2", "2")
    stack.wait_for("emptied", ("deleted", "e1", "reconcile"), ("deleted", "e2", "reconcile"))


# --- Cloudinary, on a worker of its own -------------------------------------------------------


@pytest.fixture(scope="module")
def cloudinary_stack(
    kafka_bootstrap: str,
    apis: ListApis,
    azurite_blob: AzuriteBlob,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    names = Topology()
    config = names.config(
        [{"name": "cloudinary", "prefix": "image/upload", "sources": ["cloudinary"]}]
    )
    worker = Worker(kafka_bootstrap, config, tmp_path_factory.mktemp("reconcile-cloudinary"))
    worker.start()
    try:
        yield Stack(kafka_bootstrap, names, worker, _env(apis, azurite_blob))
    finally:
        assert worker.stop() == 0, worker.tail()


def cloudinary_upload(public_id: str, request_id: str) -> Record:
    """An upload notification (tests/normalizers/fixtures/cloudinary/comment_2021_upload.json)."""
    fixture = ROOT / "tests" / "normalizers" / "fixtures" / "cloudinary"
    body = json.loads((fixture / "comment_2021_upload.json").read_text())
    body.update(public_id=public_id, request_id=request_id)
    return raw(json.dumps(body), "cloudinary", transport="webhook")


@pytest.mark.kafka
def test_cloudinary(cloudinary_stack: Stack, apis: ListApis) -> None:
    apis.cloudinary[:] = [cloudinary_resource(p) for p in ("PM/keep", "PM/gone", "PM/kept too")]
    apis.cloudinary.append({**cloudinary_resource("PM/a-video"), "resource_type": "video"})
    notified = {
        public_id: cloudinary_upload(public_id, f"req-{n}")
        for n, public_id in enumerate(("PM/keep", "PM/gone", "PM/kept too"))
    }

    def behind_the_back() -> None:
        apis.cloudinary[:] = [r for r in apis.cloudinary if r["public_id"] != "PM/gone"]
        apis.cloudinary.append(cloudinary_resource("PM/new", size=5))

    before = len(apis.requests)
    drift_once(
        cloudinary_stack,
        "cloudinary",
        "cloudinary",
        notified,
        behind_the_back,
        "PM/gone",
        "PM/new",
        "--endpoint-url",
        f"{apis.base}/cloudinary",
    )
    walked = apis.requests[before:]
    # The instance's prefix picks image/upload only; pages follow next_cursor.
    assert all("/resources/image/upload" in url for url in walked), walked
    assert any("next_cursor=c2" in url for url in walked), walked
    new = next(e for e in cloudinary_stack.events("cloudinary") if e["key"] == "PM/new")
    assert (new["size"], new["bucket"]) == (5, None)


def test_the_listing_registry_covers_every_source_that_can_list() -> None:
    from connectors.reconcile.listings import LISTINGS, SOURCE_LISTINGS, listing

    assert set(SOURCE_LISTINGS.values()) == set(LISTINGS)
    assert {name: listing(name).bucketless for name in LISTINGS} == {
        "s3": False,
        "gcs": False,
        "azure": False,
        "box": True,
        "cloudinary": True,
        "appwrite": False,
    }
