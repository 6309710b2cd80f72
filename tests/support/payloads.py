"""Provider payload builders for stream tests, shaped like the fixtures in tests/normalizers.

The normalizer tests prove each shape against documented payloads; these only vary keys,
sequencers and generations so that stream tests can describe scenarios.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from support.kafka_io import Header


def s3_record(
    key: str,
    sequencer: str,
    event: str = "ObjectCreated:Put",
    bucket: str = "uploads",
    version_id: str | None = None,
    time: str = "2026-11-30T00:08:07.000Z",
) -> dict[str, Any]:
    """One S3 notification record; `key` is given already form-encoded, as S3 sends it."""
    obj: dict[str, Any] = {"key": key, "sequencer": sequencer}
    if event.startswith("ObjectCreated"):
        obj.update(size=1024, eTag="d41d8cd98f00b204e9800998ecf8427e")
    if version_id is not None:
        obj["versionId"] = version_id
    return {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "awsRegion": "us-east-1",
        "eventTime": time,
        "eventName": event,
        "userIdentity": {"principalId": "AWS:AIDAEXAMPLE"},
        "requestParameters": {"sourceIPAddress": "203.0.113.10"},
        "responseElements": {
            "x-amz-request-id": "C3D13FE58DE4C810",
            "x-amz-id-2": "FMyUVURIY8/IgAtTv8xRjskZQpcIZ9KG4V5Wp6S7S",
        },
        "s3": {
            "s3SchemaVersion": "1.0",
            "configurationId": "notify",
            "bucket": {"name": bucket, "arn": f"arn:aws:s3:::{bucket}"},
            "object": obj,
        },
    }


def s3_body(*records: dict[str, Any]) -> bytes:
    return json.dumps({"Records": list(records)}).encode()


def sns_envelope(message: bytes, message_id: str) -> bytes:
    """S3 -> SNS -> SQS without raw delivery: the S3 JSON as a string inside."""
    return json.dumps(
        {
            "Type": "Notification",
            "MessageId": message_id,
            "TopicArn": "arn:aws:sns:us-east-1:123456789012:uploads",
            "Subject": "Amazon S3 Notification",
            "Message": message.decode(),
            "Timestamp": "2026-11-30T00:08:08.000Z",
            "SignatureVersion": "1",
            "Signature": "EXAMPLE",
            "SigningCertURL": "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-0000.pem",
            "UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe",
        }
    ).encode()


def gcs_resource(
    name: str, generation: str, bucket: str = "media", metageneration: str = "1"
) -> dict[str, Any]:
    return {
        "kind": "storage#object",
        "id": f"{bucket}/{name}/{generation}",
        "selfLink": f"https://www.googleapis.com/storage/v1/b/{bucket}/o/{name}",
        "name": name,
        "bucket": bucket,
        "generation": generation,
        "metageneration": metageneration,
        "contentType": "image/png",
        "timeCreated": "2026-11-30T00:08:07.010Z",
        "updated": "2026-11-30T00:08:07.010Z",
        "storageClass": "STANDARD",
        "size": "2048",
        "md5Hash": "1B2M2Y8AsgTpgAmY7PhCfg==",
        "crc32c": "AAAAAA==",
        "etag": "CKXgtZvZ5ooDEAE=",
    }


def gcs_attributes(resource: dict[str, Any], event_type: str) -> dict[str, str]:
    return {
        "notificationConfig": f"projects/_/buckets/{resource['bucket']}/notificationConfigs/3",
        "eventType": event_type,
        "payloadFormat": "JSON_API_V1",
        "bucketId": resource["bucket"],
        "objectId": resource["name"],
        "objectGeneration": resource["generation"],
        "eventTime": "2026-11-30T00:08:07.010Z",
    }


def gcs_pull(resource: dict[str, Any], event_type: str) -> tuple[bytes, list[Header]]:
    """What the Pub/Sub pull bridge publishes: the data bytes plus `attribute.*` headers."""
    headers: list[Header] = [("source", b"gcs"), ("transport", b"pubsub-pull")]
    headers += [
        (f"attribute.{name}", value.encode())
        for name, value in gcs_attributes(resource, event_type).items()
    ]
    return json.dumps(resource).encode(), headers


def gcs_push(
    resource: dict[str, Any], event_type: str, message_id: str
) -> tuple[bytes, list[Header]]:
    """What the webhook bridge publishes for a Pub/Sub push: the envelope as posted."""
    envelope = {
        "message": {
            "data": base64.b64encode(json.dumps(resource).encode()).decode(),
            "attributes": gcs_attributes(resource, event_type),
            "messageId": message_id,
            "publishTime": "2026-11-30T00:08:08.123Z",
        },
        "subscription": "projects/example/subscriptions/media-push",
    }
    return json.dumps(envelope).encode(), [("source", b"gcs"), ("transport", b"webhook")]


def azure_event(
    event_id: str, key: str, sequencer: str, created: bool = True, container: str = "photos"
) -> dict[str, Any]:
    """One Event Grid (Event Grid schema) blob event."""
    account = "examplestorage"
    data: dict[str, Any] = {
        "api": "PutBlob" if created else "DeleteBlob",
        "clientRequestId": "6d79dbfb-0e37-4fc4-981f-442c9ca65760",
        "requestId": "831e1650-001e-001b-66ab-eeb76e000000",
        "contentType": "image/jpeg",
        "blobType": "BlockBlob",
        "url": f"https://{account}.blob.core.windows.net/{container}/{key}",
        "sequencer": sequencer,
        "storageDiagnostics": {"batchId": "b68529f3-68cd-4744-baa4-3c0498ec19f0"},
    }
    if created:
        data.update(eTag="0x8D4BCC2E4835CD0", contentLength=524288)
    return {
        "topic": f"/subscriptions/0000/resourceGroups/rg/providers/Microsoft.Storage/"
        f"storageAccounts/{account}",
        "subject": f"/blobServices/default/containers/{container}/blobs/{key}",
        "eventType": "Microsoft.Storage.BlobCreated"
        if created
        else "Microsoft.Storage.BlobDeleted",
        "eventTime": "2026-11-30T00:08:07.0123456Z",
        "id": event_id,
        "data": data,
        "dataVersion": "",
        "metadataVersion": "1",
    }


# --- other providers' deliveries, for the cross-provider attacks (tests/integration/
# test_attack_state.py); shaped like the fixtures in tests/normalizers/fixtures/<provider>/.


def minio_body(key: str, sequencer: str, bucket: str = "uploads") -> bytes:
    """A MinIO webhook body (`nnsay-webhook-put.json`); `key` form-encoded as MinIO sends it."""
    record = s3_record(key, sequencer, "s3:ObjectCreated:Put", bucket)
    record.update(eventSource="minio:s3", awsRegion="")
    return json.dumps(
        {"EventName": "s3:ObjectCreated:Put", "Key": f"{bucket}/{key}", "Records": [record]}
    ).encode()


def supabase_insert(
    name: str,
    updated_at: str,
    bucket: str = "uploads",
    version: str = "6d1d2a1e-5f1c-4e0b-9d0a-3a0f6c1b2e11",
) -> bytes:
    """A Database Webhook INSERT on storage.objects."""
    row = {
        "id": "8a1a5a4e-0b8f-4c47-9a56-2f1f0e3c9d77",
        "bucket_id": bucket,
        "name": name,
        "owner": None,
        "created_at": updated_at,
        "updated_at": updated_at,
        "last_accessed_at": updated_at,
        "metadata": {"eTag": '"c4ca4238a0b923820dcc509a6f75849b"', "size": 1, "mimetype": "x/y"},
        "version": version,
        "path_tokens": name.split("/"),
    }
    body = {
        "type": "INSERT",
        "table": "objects",
        "schema": "storage",
        "record": row,
        "old_record": None,
    }
    return json.dumps(body).encode()


def b2_body(object_name: str, event_id: str, bucket: str = "uploads") -> bytes:
    """B2 Event Notifications (`b2listen_upload_2024-07-22.json`)."""
    event = {
        "accountId": "15f935cf4dcb",
        "bucketId": "21a5bf29a395fc7f84dd0c1b",
        "bucketName": bucket,
        "eventId": event_id,
        "eventTimestamp": 1921691964421,
        "eventType": "b2:ObjectCreated:Upload",
        "eventVersion": 1,
        "matchedRuleName": "notify",
        "objectName": object_name,
        "objectSize": 1,
        "objectVersionId": "4_z21a5bf29a395fc7f84dd0c1b_f106fce3586b4ff73_d20240722_m2346",
    }
    return json.dumps({"events": [event]}).encode()


def box_body(file_id: str, event_id: str) -> bytes:
    """A Box FILE.UPLOADED webhook (`docs_file_uploaded.json`, trimmed): names no bucket."""
    body = {
        "type": "webhook_event",
        "id": event_id,
        "created_at": "2026-11-30T00:08:07-00:00",
        "trigger": "FILE.UPLOADED",
        "webhook": {"id": "53", "type": "webhook"},
        "source": {
            "id": file_id,
            "type": "file",
            "file_version": {"type": "file_version", "id": "78096737033", "sha1": "2c61"},
            "sha1": "2c61623e86bee78e6ab444af456bccc7a1164095",
            "name": "x.png",
            "size": 1,
        },
    }
    return json.dumps(body).encode()


def appwrite_body(file_id: str, bucket: str) -> tuple[bytes, list[Header]]:
    """An Appwrite file create (`docs_file_model.json`) with its unsigned event header."""
    document = {
        "$id": file_id,
        "bucketId": bucket,
        "$createdAt": "2026-11-30T00:08:07.000+00:00",
        "$updatedAt": "2026-11-30T00:08:07.000+00:00",
        "name": "Pink.png",
        "signature": "5d529fd02b544198ae075bd57c1762bb",
        "mimeType": "image/png",
        "sizeOriginal": 1,
    }
    events = f"buckets.*.files.*.create,buckets.{bucket}.files.{file_id}.create"
    return json.dumps(document).encode(), [
        ("source", b"appwrite"),
        ("header.x-appwrite-webhook-events", events.encode()),
    ]
