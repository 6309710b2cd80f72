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
