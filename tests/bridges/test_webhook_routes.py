"""Every push route end to end: the bridge in-process, a real Kafka broker, a fresh raw topic.

For each source, deliveries signed as the provider documents are answered 202 and read back
from the topic byte for byte with their headers; forged, unsigned, truncated-signature,
wrong-algorithm, replayed (where the provider signs a timestamp) and oversized deliveries get
their status and leave nothing on the topic; handshakes are answered as the provider expects
and are not published either.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.kafka_io import Read, read_topic
from support.webhook_signing import (
    AWS_CERT_PEM,
    AWS_CERT_URL,
    AWS_INTERMEDIATE_PEM,
    AWS_MESSAGE_SHA1,
    AWS_MESSAGE_SHA256,
    AWS_TOPIC_V1,
    AWS_TOPIC_V2,
    AWS_VECTOR_TIME,
    Answer,
    FakeHttp,
    Request,
    amazon_root_pem,
    appwrite_signature,
    b2_signature,
    box_signature,
    box_timestamp,
    cloudinary_signature,
    exchange,
    google_token,
    jwks,
    new_rsa_key,
    pem,
    push_claims,
    settings_for,
    sns_message,
    sns_pki,
    unique_topic,
    write,
)

from connectors.webhook_auth.base import Services

pytestmark = pytest.mark.kafka

MAX_BODY = 4096
NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC).timestamp()


def deliver(
    bootstrap: str,
    source: str,
    route: Mapping[str, Any],
    requests: Sequence[Request],
    environ: Mapping[str, str] | None = None,
    services: Services | None = None,
    max_body: int = MAX_BODY,
) -> tuple[list[Answer], list[Read]]:
    """Run the bridge on a fresh raw topic, send `requests`, read the whole topic back."""
    topic = unique_topic(source)
    settings = settings_for(
        bootstrap, topic, {"max_body_bytes": max_body, "routes": {source: dict(route)}}
    )

    async def go() -> tuple[list[Answer], list[Read]]:
        answers = await exchange(settings, source, requests, environ, services)
        return answers, await read_topic(bootstrap, topic)

    return asyncio.run(go())


def assert_published(
    records: Sequence[Read],
    sent: Iterable[Request],
    source: str,
    hidden: Iterable[str] = (),
    secrets: Iterable[str] = (),
) -> None:
    """The topic holds exactly `sent`, byte for byte, with the raw-topic contract headers."""
    sent = sorted(sent, key=lambda request: request.body)
    got = sorted(records, key=lambda record: record.value or b"")
    assert [record.value for record in got] == [request.body for request in sent]
    hidden = {name.lower() for name in hidden} | {"authorization"}
    for request, record in zip(sent, got, strict=True):
        headers = record.headers
        assert headers["source"] == source.encode()
        assert headers["transport"] == b"webhook"
        assert headers["delivery-id"]
        assert float(headers["received-at"]) > 0
        for name, value in request.headers.items():
            if name.lower() in hidden:
                assert f"header.{name.lower()}" not in headers
            else:
                assert headers[f"header.{name.lower()}"] == value.encode()
        for secret in secrets:
            assert all(secret.encode() not in value for value in headers.values())


def statuses(answers: Sequence[Answer]) -> list[int]:
    return [answer.status for answer in answers]


def padded(body: dict[str, Any]) -> bytes:
    """A body over the bridge's limit."""
    return json.dumps({**body, "padding": "x" * (MAX_BODY + 100)}).encode()


# ----------------------------------------------------------------------------------- s3


def test_s3_via_sns(kafka_bootstrap: str, tmp_path: Path) -> None:
    pki = sns_pki()
    own_url = "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-test.pem"
    topic = "arn:aws:sns:eu-west-1:123456789012:uploads"
    route = {
        "topic_arns": [AWS_TOPIC_V1, AWS_TOPIC_V2, topic],
        # Trusted: the test CA, and Amazon's root for the vectors signed by SNS itself.
        "trusted_ca_file": str(write(tmp_path / "ca.pem", pem(pki.ca) + amazon_root_pem())),
        "certificate_files": {
            AWS_CERT_URL: str(
                write(tmp_path / "aws.pem", AWS_CERT_PEM + b"\n" + AWS_INTERMEDIATE_PEM)
            ),
            own_url: str(write(tmp_path / "own.pem", pem(pki.certificate))),
        },
    }
    http = FakeHttp()
    services = Services(clock=lambda: AWS_VECTOR_TIME, http_get=http)
    records = json.dumps({"Records": [{"eventName": "ObjectCreated:Put"}]})
    notification = sns_message(pki.key, own_url, topic, message=records, version="2")
    confirmation = sns_message(pki.key, own_url, topic, kind="SubscriptionConfirmation")
    unsubscribe = sns_message(pki.key, own_url, topic, kind="UnsubscribeConfirmation")
    stranger_topic = "arn:aws:sns:eu-west-1:123456789012:someone-else"
    sns_headers = {"x-amz-sns-message-type": "Notification", "x-amz-sns-topic-arn": topic}

    def post(message: Mapping[str, Any] | bytes, **headers: str) -> Request:
        body = message if isinstance(message, bytes) else json.dumps(message).encode()
        return Request(body, headers)

    accepted = [
        post(AWS_MESSAGE_SHA1, **{"x-amz-sns-message-type": "Notification"}),
        post(AWS_MESSAGE_SHA256),
        post(notification, **sns_headers),
    ]
    answers, published = deliver(
        kafka_bootstrap,
        "s3",
        route,
        [
            *accepted,
            post(confirmation),
            post(unsubscribe),
            post({**notification, "Message": '{"Records":[{"eventName":"ObjectRemoved:Delete"}]}'}),
            post({k: v for k, v in notification.items() if k != "Signature"}),
            post({**notification, "Signature": notification["Signature"][:-20]}),
            post({**notification, "SignatureVersion": "3"}),
            post(sns_message(pki.key, own_url, stranger_topic)),
            post(sns_message(pki.key, own_url, stranger_topic, kind="SubscriptionConfirmation")),
            post({**notification, "SigningCertURL": "https://evil.example.com/cert.pem"}),
            post(sns_message(pki.key, own_url, topic, message="x" * MAX_BODY)),
            post(records.encode()),  # raw message delivery: no signature
        ],
        services=services,
    )
    assert statuses(answers) == [202, 202, 202, 200, 200] + [401] * 7 + [413, 401]
    assert answers[3].json() == {"confirmed": True}
    assert http.asked == [confirmation["SubscribeURL"]]
    assert_published(published, accepted, "s3")


# ---------------------------------------------------------------------------- eventbridge


def test_eventbridge_api_destination_api_key(kafka_bootstrap: str) -> None:
    secret = "eb-key-0123456789"
    event = json.dumps(
        {"version": "0", "id": "17793124-05d4-b198-2fde-7ededc63b103", "source": "aws.s3"}
    ).encode()
    ok = Request(event, {"X-EB-Api-Key": secret, "Content-Type": "application/json"})
    answers, published = deliver(
        kafka_bootstrap,
        "eventbridge",
        {"secret_env": "EB_KEY", "secret_header": "X-EB-Api-Key"},
        [
            ok,
            Request(event),
            Request(event, {"X-EB-Api-Key": "eb-key-0123456788"}),
            Request(event, {"X-EB-Api-Key": secret[:-4]}),
            Request(event, {"Authorization": f"Bearer {secret}"}),
            Request(padded({"id": "x"}), {"X-EB-Api-Key": secret}),
        ],
        environ={"EB_KEY": secret},
    )
    assert statuses(answers) == [202, 401, 401, 401, 401, 413]
    assert_published(published, [ok], "eventbridge", hidden=["x-eb-api-key"], secrets=[secret])


# ----------------------------------------------------------------------------------- gcs


def test_gcs_pubsub_push_oidc(kafka_bootstrap: str, tmp_path: Path) -> None:
    key, other = new_rsa_key(), new_rsa_key()
    audience, account = "https://bridge.example.com/hooks/gcs", "push@proj.iam.gserviceaccount.com"
    route = {
        "audience": audience,
        "service_account": account,
        "jwks_file": str(write(tmp_path / "jwks.json", json.dumps(jwks(key.public_key(), "k1")))),
    }
    claims = push_claims(audience, account, NOW)
    token = google_token(key, "k1", claims)
    envelope = json.dumps(
        {
            "message": {
                "attributes": {"eventType": "OBJECT_FINALIZE", "bucketId": "uploads"},
                "data": base64.b64encode(b'{"name":"a.txt"}').decode(),
                "messageId": "136969346945",
            },
            "subscription": "projects/p/subscriptions/s",
        }
    ).encode()
    accepted = [
        Request(envelope, {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}),
        Request(b"not json at all", {"Authorization": f"Bearer {token}"}),
    ]
    expired = push_claims(audience, account, NOW - 7200)
    answers, published = deliver(
        kafka_bootstrap,
        "gcs",
        route,
        [
            *accepted,
            Request(envelope),
            Request(envelope, {"Authorization": f"Bearer {google_token(other, 'k1', claims)}"}),
            Request(envelope, {"Authorization": f"Bearer {token[:-12]}"}),
            Request(envelope, {"Authorization": f"Bearer {google_token(key, 'k1', expired)}"}),
            Request(
                envelope,
                {
                    "Authorization": "Bearer "
                    + google_token(key, "k1", {**claims, "aud": "https://other.example.com"})
                },
            ),
            Request(envelope, {"Authorization": f"Bearer {token.split('.')[0]}.e30."}),
            Request(padded({"message": {}}), {"Authorization": f"Bearer {token}"}),
        ],
        services=Services(clock=lambda: NOW),
    )
    assert statuses(answers) == [202, 202, 401, 401, 401, 401, 401, 401, 413]
    assert_published(published, accepted, "gcs", secrets=[token])


# --------------------------------------------------------------------------------- azure


def test_azure_event_grid(kafka_bootstrap: str) -> None:
    secret = "grid-secret-42"
    code = {"code": secret}
    validation = json.dumps(
        [
            {
                "id": "2d1781af-3a4c-4d7c-bd0c-e34b19da4e66",
                "topic": "/subscriptions/xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
                "subject": "",
                "data": {
                    "validationCode": "512d38b6-c7b8-40c8-89fe-f46f9e9622b6",
                    "validationUrl": "https://rp-eastus2.eventgrid.azure.net:553/validate?id=1",
                },
                "eventType": "Microsoft.EventGrid.SubscriptionValidationEvent",
                "eventTime": "2018-01-25T22:12:19.4556811Z",
                "metadataVersion": "1",
                "dataVersion": "1",
            }
        ]
    ).encode()
    blob_created = json.dumps(
        [
            {
                "id": "831e1650-001e-001b-66ab-eeb76e069631",
                "subject": "/blobServices/default/containers/c/blobs/a.txt",
                "eventType": "Microsoft.Storage.BlobCreated",
                "data": {"api": "PutBlockList", "sequencer": "00000000000004420000000000028963"},
            }
        ]
    ).encode()
    cloud_event = json.dumps(
        {"specversion": "1.0", "id": "9aeb0fdf", "type": "Microsoft.Storage.BlobCreated"}
    ).encode()
    accepted = [
        Request(blob_created, {"aeg-event-type": "Notification"}, code),
        Request(cloud_event, {"Content-Type": "application/cloudevents+json"}, code),
    ]
    origin = {"WebHook-Request-Origin": "eventgrid.azure.net"}
    answers, published = deliver(
        kafka_bootstrap,
        "azure",
        {"secret_env": "GRID_SECRET"},
        [
            Request(b"", {**origin, "WebHook-Request-Rate": "120"}, code, method="OPTIONS"),
            Request(b"", origin, method="OPTIONS"),
            Request(b"", {"WebHook-Request-Origin": "evil.example.com"}, code, method="OPTIONS"),
            Request(validation, {"aeg-event-type": "SubscriptionValidation"}, code),
            *accepted,
            Request(validation, {"aeg-event-type": "SubscriptionValidation"}),
            Request(blob_created, {"aeg-event-type": "Notification"}),
            Request(blob_created, {}, {"code": "grid-secret-43"}),
            Request(blob_created, {}, {"code": secret[:-2]}),
            Request(padded({"id": "x"}), {}, code),
        ],
        environ={"GRID_SECRET": secret},
    )
    assert statuses(answers) == [200, 401, 403, 200, 202, 202, 401, 401, 401, 401, 413]
    handshake = answers[0].headers
    assert handshake["WebHook-Allowed-Origin"] == "eventgrid.azure.net"
    assert handshake["WebHook-Allowed-Rate"] == "*"
    assert "POST" in handshake["Allow"]
    assert "WebHook-Allowed-Origin" not in answers[2].headers
    assert answers[3].json() == {"validationResponse": "512d38b6-c7b8-40c8-89fe-f46f9e9622b6"}
    assert_published(published, accepted, "azure", secrets=[secret])


# --------------------------------------------------------------------------------- minio


def test_minio_bearer_token(kafka_bootstrap: str) -> None:
    token = "minio-auth-token-1234"
    event = json.dumps({"EventName": "s3:ObjectCreated:Put", "Key": "b/a.txt"}).encode()
    accepted = [
        Request(event, {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}),
        Request(b"\x00\x01 not json", {"Authorization": f"Bearer {token}"}),
    ]
    answers, published = deliver(
        kafka_bootstrap,
        "minio",
        {"secret_env": "MINIO_TOKEN"},
        [
            *accepted,
            Request(event),
            Request(event, {"Authorization": "Bearer minio-auth-token-1235"}),
            Request(event, {"Authorization": f"Bearer {token[:-3]}"}),
            Request(event, {"Authorization": f"Basic {token}"}),
            Request(padded({"Key": "x"}), {"Authorization": f"Bearer {token}"}),
        ],
        environ={"MINIO_TOKEN": token},
    )
    assert statuses(answers) == [202, 202, 401, 401, 401, 401, 413]
    assert_published(published, accepted, "minio", secrets=[token])


# ------------------------------------------------------------------------------ supabase


def test_supabase_secret_header(kafka_bootstrap: str) -> None:
    secret = "sb-webhook-secret"
    row = json.dumps({"type": "INSERT", "table": "objects", "record": {"name": "a b.txt"}})
    ok = Request(row.encode(), {"X-Webhook-Secret": secret, "Content-Type": "application/json"})
    answers, published = deliver(
        kafka_bootstrap,
        "supabase",
        {"secret_env": "SB_SECRET", "secret_header": "X-Webhook-Secret"},
        [
            ok,
            Request(row.encode()),
            Request(row.encode(), {"X-Webhook-Secret": "sb-webhook-secreT"}),
            Request(row.encode(), {"X-Webhook-Secret": secret[:-1]}),
            Request(padded({"type": "INSERT"}), {"X-Webhook-Secret": secret}),
        ],
        environ={"SB_SECRET": secret},
    )
    assert statuses(answers) == [202, 401, 401, 401, 413]
    assert_published(published, [ok], "supabase", hidden=["x-webhook-secret"], secrets=[secret])


# ------------------------------------------------------------------------------------ b2


def test_b2_hmac_signature(kafka_bootstrap: str) -> None:
    secret = "B2SigningSecret0123456789abcdefX"  # 32 characters, used as text
    header = "X-Bz-Event-Notification-Signature"
    body = json.dumps(
        {"events": [{"eventId": "a" * 64, "eventType": "b2:ObjectCreated:Upload"}]}
    ).encode()
    signature = b2_signature(secret, body)
    ok = Request(body, {header: signature, "User-Agent": "B2/EventNotifications"})
    big = padded({"events": []})
    sha1 = "v1=" + hmac.new(secret.encode(), body, hashlib.sha1).hexdigest()
    answers, published = deliver(
        kafka_bootstrap,
        "b2",
        {"secret_env": "B2_SECRET"},
        [
            ok,
            Request(body),
            Request(body.replace(b"Upload", b"Copy"), {header: signature}),
            Request(body, {header: signature[:-8]}),
            Request(body, {header: "v2=" + signature[3:]}),
            Request(body, {header: sha1}),
            Request(big, {header: b2_signature(secret, big)}),
        ],
        environ={"B2_SECRET": secret},
    )
    assert statuses(answers) == [202, 401, 401, 401, 401, 401, 413]
    assert_published(published, [ok], "b2", secrets=[secret])


# ----------------------------------------------------------------------------------- box


def test_box_signatures_and_replay_window(kafka_bootstrap: str) -> None:
    primary, secondary = "box-primary-key", "box-secondary-key"
    body = json.dumps(
        {"type": "webhook_event", "id": "e-1", "trigger": "FILE.UPLOADED", "source": {"id": "9"}}
    ).encode()

    def signed(
        when: float,
        content: bytes = body,
        primary_key: str = primary,
        secondary_key: str = secondary,
        **overrides: str,
    ) -> Request:
        stamp = box_timestamp(when)
        headers = {
            "BOX-DELIVERY-ID": "f96bb54b-ee16-4fc5-aa65-8c2d9e5b546f",
            "BOX-DELIVERY-TIMESTAMP": stamp,
            "BOX-SIGNATURE-PRIMARY": box_signature(primary_key, content, stamp),
            "BOX-SIGNATURE-SECONDARY": box_signature(secondary_key, content, stamp),
            "BOX-SIGNATURE-VERSION": "1",
            "BOX-SIGNATURE-ALGORITHM": "HmacSHA256",
        }
        headers.update(overrides)
        return Request(content, headers)

    rotated = signed(NOW - 5, body.replace(b"e-1", b"e-2"), primary_key="old-primary")
    accepted = [signed(NOW - 30), rotated]
    good = accepted[0]
    answers, published = deliver(
        kafka_bootstrap,
        "box",
        {"secret_env": "BOX_PRIMARY", "secondary_secret_env": "BOX_SECONDARY"},
        [
            *accepted,
            signed(NOW - 11 * 60),  # replayed: older than Box's ten minutes
            signed(NOW + 11 * 60),
            Request(body.replace(b"e-1", b"e-3"), good.headers),
            Request(body, {"BOX-DELIVERY-TIMESTAMP": box_timestamp(NOW)}),
            signed(NOW, primary_key="x", secondary_key="y"),
            signed(
                NOW,
                **{
                    "BOX-SIGNATURE-PRIMARY": good.headers["BOX-SIGNATURE-PRIMARY"][:-6],
                    "BOX-SIGNATURE-SECONDARY": good.headers["BOX-SIGNATURE-SECONDARY"][:-6],
                },
            ),
            signed(NOW, **{"BOX-SIGNATURE-ALGORITHM": "HmacSHA1"}),
            signed(NOW, padded({"id": "big"})),
        ],
        environ={"BOX_PRIMARY": primary, "BOX_SECONDARY": secondary},
        services=Services(clock=lambda: NOW),
    )
    assert statuses(answers) == [202, 202, 401, 401, 401, 401, 401, 401, 401, 413]
    assert_published(published, accepted, "box", secrets=[primary, secondary])


# ---------------------------------------------------------------------------- cloudinary


def test_cloudinary_signature_and_replay_window(kafka_bootstrap: str) -> None:
    secret = "cloudinary-api-secret"
    body = json.dumps(
        {"notification_type": "upload", "request_id": "r-1", "public_id": "sample"}
    ).encode()

    def signed(when: float, content: bytes = body, algorithm: str = "sha1") -> Request:
        stamp = str(int(when))
        signature = cloudinary_signature(content, stamp, secret, algorithm)
        return Request(content, {"X-Cld-Timestamp": stamp, "X-Cld-Signature": signature})

    ok = signed(NOW - 60)
    answers, published = deliver(
        kafka_bootstrap,
        "cloudinary",
        {"secret_env": "CLD_SECRET"},
        [
            ok,
            signed(NOW - 3 * 3600),  # replayed: beyond the 2 h window
            Request(body.replace(b"r-1", b"r-2"), ok.headers),
            Request(body),
            Request(body, {**ok.headers, "X-Cld-Signature": ok.headers["X-Cld-Signature"][:-4]}),
            signed(NOW, algorithm="sha256"),  # the account is configured for SHA-1
            signed(NOW, padded({"public_id": "big"})),
        ],
        environ={"CLD_SECRET": secret},
        services=Services(clock=lambda: NOW),
    )
    assert statuses(answers) == [202, 401, 401, 401, 401, 401, 413]
    assert_published(published, [ok], "cloudinary", secrets=[secret])


# ------------------------------------------------------------------------------ appwrite


def test_appwrite_signature_over_registered_url(kafka_bootstrap: str) -> None:
    key, url = "appwrite-signature-key", "https://hooks.example.com/hooks/appwrite"
    header = "X-Appwrite-Webhook-Signature"
    body = b'{"$id":"6560f3d1","bucketId":"photos","name":"a.png"}'
    ok = Request(
        body,
        {
            header: appwrite_signature(key, url, body),
            "X-Appwrite-Webhook-Events": "buckets.photos.files.6560f3d1.create",
        },
    )
    sha256 = base64.b64encode(hmac.new(key.encode(), url.encode() + body, "sha256").digest())
    big = padded({"$id": "big"})
    answers, published = deliver(
        kafka_bootstrap,
        "appwrite",
        {"secret_env": "APPWRITE_KEY", "url": url},
        [
            ok,
            Request(body, {header: appwrite_signature(key, "https://other.example.com/", body)}),
            Request(body.replace(b"a.png", b"b.png"), {header: ok.headers[header]}),
            Request(body),
            Request(body, {header: ok.headers[header][:-5]}),
            Request(body, {header: sha256.decode()}),
            Request(big, {header: appwrite_signature(key, url, big)}),
        ],
        environ={"APPWRITE_KEY": key},
    )
    assert statuses(answers) == [202, 401, 401, 401, 401, 401, 413]
    assert_published(published, [ok], "appwrite", secrets=[key])


def test_large_bodies_are_published_whole_up_to_the_limit(kafka_bootstrap: str) -> None:
    """Bodies arrive in several TCP reads; each must be published complete, or refused."""
    limit = 1024 * 1024
    auth = {"Authorization": "Bearer big-token"}
    accepted = [Request(b"a" * 600_000, auth), Request(b"b" * 1_040_000, auth)]
    answers, published = deliver(
        kafka_bootstrap,
        "minio",
        {"secret_env": "MINIO_TOKEN"},
        [
            *accepted,
            # Within max_body_bytes, but with its headers over the producer's 1 MiB request
            # limit: Kafka can never take it, so 413 (not 503, which means "retry").
            Request(b"c" * limit, auth),
            Request(b"d" * (limit + 1), auth),
        ],
        environ={"MINIO_TOKEN": "big-token"},
        max_body=limit,
    )
    assert statuses(answers) == [202, 202, 413, 413]
    assert_published(published, accepted, "minio", secrets=["big-token"])
