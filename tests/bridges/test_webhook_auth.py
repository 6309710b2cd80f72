"""Webhook authenticators as pure functions: request facts in, verdict out (no HTTP, no Kafka).

Published vectors used: SNS messages signed by SNS (aws-sdk-ruby message_verifier_spec), the
Box SDK signature vector (box-python-sdk test/box_sdk_gen/test/webhooks.py), Cloudinary's
documented example and its npm SDK's SHA-256 vector. The other schemes are signed here with
the independent signers of support.webhook_signing, written from each provider's docs.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import hmac
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from support.webhook_signing import (
    AWS_CERT_PEM,
    AWS_CERT_URL,
    AWS_INTERMEDIATE_PEM,
    AWS_INTERMEDIATE_URL,
    AWS_MESSAGE_SHA1,
    AWS_MESSAGE_SHA256,
    AWS_TOPIC_V1,
    AWS_TOPIC_V2,
    AWS_VECTOR_TIME,
    FakeHttp,
    appwrite_signature,
    aws_intermediate_der,
    b2_signature,
    box_signature,
    cloudinary_signature,
    google_token,
    issue,
    jwks,
    new_rsa_key,
    pem,
    push_claims,
    sns_message,
    sns_pki,
    write,
)

from connectors.webhook_auth import build_authenticator
from connectors.webhook_auth.base import (
    PUBLISH,
    REJECT,
    RESPOND,
    Authenticator,
    HttpResult,
    RequestFacts,
    Services,
    Verdict,
)
from connectors.webhook_auth.s3 import string_to_sign
from streams.config import WebhookRouteConfig

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC).timestamp()


def build(
    source: str,
    route: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
    services: Services | None = None,
) -> Authenticator:
    config = WebhookRouteConfig.model_validate(route)
    config.check_for(source)
    built = build_authenticator(source, config, environ or {}, services or Services())
    assert built is not None, "route unexpectedly off"
    authenticator, authenticated = built
    assert authenticated
    return authenticator


def check(
    authenticator: Authenticator,
    body: bytes = b"{}",
    headers: Mapping[str, str] | None = None,
    query: Mapping[str, str] | None = None,
    now: float = NOW,
    method: str = "POST",
) -> Verdict:
    facts = RequestFacts(
        method,
        "http://127.0.0.1/hooks/x",
        dict(query or {}),
        {name.lower(): value for name, value in (headers or {}).items()},
        body,
        now,
    )
    return asyncio.run(authenticator.authenticate(facts))


def refused(verdict: Verdict, reason: str, status: int = 401) -> bool:
    return verdict.outcome == REJECT and verdict.reason == reason and verdict.status == status


# ----------------------------------------------------------------------------------- SNS


def aws_vector_route(tmp_path: Path, topics: tuple[str, ...] = (AWS_TOPIC_V1, AWS_TOPIC_V2)) -> Any:
    return {
        "topic_arns": list(topics),
        # The leaf as SNS serves it, then its issuer: what an air-gapped host configures.
        "certificate_files": {
            AWS_CERT_URL: str(
                write(tmp_path / "aws.pem", AWS_CERT_PEM + b"\n" + AWS_INTERMEDIATE_PEM)
            )
        },
    }


def test_sns_messages_signed_by_sns_verify_with_signature_versions_1_and_2(tmp_path: Path) -> None:
    sns = build("s3", aws_vector_route(tmp_path))
    assert check(sns, AWS_MESSAGE_SHA1, now=AWS_VECTOR_TIME).outcome == PUBLISH
    assert check(sns, AWS_MESSAGE_SHA256, now=AWS_VECTOR_TIME).outcome == PUBLISH


def test_sns_vector_string_to_sign_matches_the_documented_layout() -> None:
    message = json.loads(AWS_MESSAGE_SHA1)
    assert string_to_sign(message) == (
        b"Message\nHello world\nMessageId\n792cda85-518f-5dd3-9163-81d851212f3a\n"
        b"Timestamp\n2022-07-28T21:23:58.317Z\nTopicArn\n" + AWS_TOPIC_V1.encode() + b"\n"
        b"Type\nNotification\n"
    )


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"Message": "Hello world!"}, "bad-signature"),
        ({"Signature": "bad"}, "bad-signature"),
        ({"SignatureVersion": "2"}, "bad-signature"),  # a SHA1 signature claimed as SHA256
        ({"SignatureVersion": "3"}, "wrong-algorithm"),
        ({"SigningCertURL": AWS_CERT_URL.replace("https", "http")}, "bad-certificate"),
        ({"SigningCertURL": "https://internetbadguys.com/cert.pem"}, "bad-certificate"),
        (
            {"SigningCertURL": "https://sns.us-east-2.amazonaws.com.evil.io/c.pem"},
            "bad-certificate",
        ),
        ({"SigningCertURL": AWS_CERT_URL.replace(".pem", ".key")}, "bad-certificate"),
        ({"TopicArn": "arn:aws:sns:us-east-2:295079676684:other"}, "unknown-topic"),
        ({"Type": "Surprise"}, "malformed"),
    ],
)
def test_sns_vector_tampered_is_refused(
    tmp_path: Path, change: dict[str, str], reason: str
) -> None:
    sns = build("s3", aws_vector_route(tmp_path))
    message = {**json.loads(AWS_MESSAGE_SHA1), **change}
    assert refused(check(sns, json.dumps(message).encode(), now=AWS_VECTOR_TIME), reason)


def test_sns_truncated_signature_and_unsigned_are_refused(tmp_path: Path) -> None:
    sns = build("s3", aws_vector_route(tmp_path))
    message = json.loads(AWS_MESSAGE_SHA256)
    truncated = {**message, "Signature": message["Signature"][:-24]}
    unsigned = {key: value for key, value in message.items() if key != "Signature"}
    assert refused(check(sns, json.dumps(truncated).encode(), now=AWS_VECTOR_TIME), "bad-signature")
    assert refused(
        check(sns, json.dumps(unsigned).encode(), now=AWS_VECTOR_TIME), "missing-signature"
    )
    assert refused(check(sns, b'{"Records": []}', now=AWS_VECTOR_TIME), "missing-signature")
    assert refused(check(sns, b"not json", now=AWS_VECTOR_TIME), "missing-signature")


def test_sns_vector_years_later_is_refused_before_its_expired_certificate(tmp_path: Path) -> None:
    # Its certificate expired in 2022, but the signed Timestamp already refuses it, unfetched
    # (an expired certificate: test_webhook_sns_certificates.py).
    sns = build("s3", aws_vector_route(tmp_path))
    assert refused(check(sns, AWS_MESSAGE_SHA1, now=NOW), "replayed")


def test_sns_certificate_is_fetched_over_https_once_and_cached() -> None:
    # The leaf from SNS, its issuer from the leaf's caIssuers URL, both once.
    http = FakeHttp(
        {
            AWS_CERT_URL: HttpResult(200, AWS_CERT_PEM),
            AWS_INTERMEDIATE_URL: HttpResult(200, aws_intermediate_der()),
        }
    )
    sns = build(
        "s3", {"topic_arns": [AWS_TOPIC_V1, AWS_TOPIC_V2]}, services=Services(http_get=http)
    )
    assert check(sns, AWS_MESSAGE_SHA1, now=AWS_VECTOR_TIME).outcome == PUBLISH
    assert check(sns, AWS_MESSAGE_SHA256, now=AWS_VECTOR_TIME).outcome == PUBLISH
    assert http.asked == [AWS_CERT_URL, AWS_INTERMEDIATE_URL]


def test_sns_certificate_that_cannot_be_fetched_asks_for_a_retry() -> None:
    http = FakeHttp({AWS_CERT_URL: HttpResult(500, b"")})
    sns = build("s3", {"topic_arns": [AWS_TOPIC_V1]}, services=Services(http_get=http))
    verdict = check(sns, AWS_MESSAGE_SHA1, now=AWS_VECTOR_TIME)
    assert refused(verdict, "certificate-unavailable", 503)


def test_sns_certificate_with_extra_content_is_refused() -> None:
    wrapped = b"<xml><value>\n" + AWS_CERT_PEM + b"\n<value></xml>"
    http = FakeHttp({AWS_CERT_URL: HttpResult(200, wrapped)})
    sns = build("s3", {"topic_arns": [AWS_TOPIC_V1]}, services=Services(http_get=http))
    assert refused(check(sns, AWS_MESSAGE_SHA1, now=AWS_VECTOR_TIME), "bad-certificate")


def test_sns_trusted_ca_override(tmp_path: Path) -> None:
    pki, stranger = sns_pki(), sns_pki()
    url = "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-test.pem"
    other = "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-other.pem"
    topic = "arn:aws:sns:eu-west-1:123456789012:uploads"
    sns = build(
        "s3",
        {
            "topic_arns": [topic],
            "trusted_ca_file": str(write(tmp_path / "ca.pem", pem(pki.ca))),
            "certificate_files": {
                url: str(write(tmp_path / "leaf.pem", pem(pki.certificate))),
                other: str(write(tmp_path / "stranger.pem", pem(stranger.certificate))),
            },
        },
    )
    good = sns_message(pki.key, url, topic, version="2", timestamp=NOW)
    assert check(sns, json.dumps(good).encode()).outcome == PUBLISH
    # Correctly signed, by a certificate the trusted CA did not issue.
    foreign = sns_message(stranger.key, other, topic, version="2", timestamp=NOW)
    assert refused(check(sns, json.dumps(foreign).encode()), "bad-certificate")


@pytest.mark.parametrize("common_name", ["evil.example.com", "sns.amazonaws.com.evil.io"])
def test_sns_certificate_not_issued_to_sns_is_refused(tmp_path: Path, common_name: str) -> None:
    key = new_rsa_key()
    certificate = issue(key, common_name, key)
    url = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-x.pem"
    topic = "arn:aws:sns:us-east-1:123456789012:uploads"
    sns = build(
        "s3",
        {
            "topic_arns": [topic],
            "certificate_files": {url: str(write(tmp_path / "c.pem", pem(certificate)))},
        },
    )
    message = sns_message(key, url, topic, timestamp=NOW)
    assert refused(check(sns, json.dumps(message).encode()), "bad-certificate")


def test_sns_subscription_confirmation_is_confirmed_only_when_verified(tmp_path: Path) -> None:
    pki = sns_pki()
    url = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-test.pem"
    topic = "arn:aws:sns:us-east-1:123456789012:uploads"
    route = {
        "topic_arns": [topic],
        "trusted_ca_file": str(write(tmp_path / "ca.pem", pem(pki.ca))),
        "certificate_files": {url: str(write(tmp_path / "leaf.pem", pem(pki.certificate)))},
    }
    http = FakeHttp()
    sns = build("s3", route, services=Services(http_get=http))
    confirmation = sns_message(pki.key, url, topic, kind="SubscriptionConfirmation", timestamp=NOW)
    forged = {**confirmation, "SubscribeURL": "https://sns.us-east-1.amazonaws.com/?evil"}
    assert refused(check(sns, json.dumps(forged).encode()), "bad-signature")
    assert http.asked == []
    verdict = check(sns, json.dumps(confirmation).encode())
    assert verdict.outcome == RESPOND and verdict.status == 200
    assert http.asked == [confirmation["SubscribeURL"]]

    failing = FakeHttp({confirmation["SubscribeURL"]: HttpResult(500, b"")})
    sns = build("s3", route, services=Services(http_get=failing))
    assert refused(check(sns, json.dumps(confirmation).encode()), "confirmation-failed", 503)

    manual = FakeHttp()
    sns = build("s3", {**route, "confirm_subscriptions": False}, services=Services(http_get=manual))
    assert check(sns, json.dumps(confirmation).encode()).outcome == RESPOND
    assert manual.asked == []


# ----------------------------------------------------------------------------------- GCS

AUDIENCE = "https://bridge.example.com/hooks/gcs"
ACCOUNT = "gcs-push@example-project.iam.gserviceaccount.com"


def gcs_route(tmp_path: Path, key: Any, kid: str = "k1") -> dict[str, Any]:
    path = write(tmp_path / "jwks.json", json.dumps(jwks(key.public_key(), kid)))
    return {"audience": AUDIENCE, "service_account": ACCOUNT, "jwks_file": str(path)}


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hand_made_hs256(claims: Mapping[str, Any], key: bytes, kid: str) -> str:
    header = b64url(json.dumps({"alg": "HS256", "kid": kid, "typ": "JWT"}).encode())
    payload = b64url(json.dumps(dict(claims)).encode())
    mac = hmac.new(key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{b64url(mac)}"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_gcs_oidc_token_signed_by_google_key_is_accepted(tmp_path: Path) -> None:
    key = new_rsa_key()
    push = build("gcs", gcs_route(tmp_path, key))
    for issuer in ("https://accounts.google.com", "accounts.google.com"):
        token = google_token(key, "k1", push_claims(AUDIENCE, ACCOUNT, NOW, iss=issuer))
        assert check(push, headers=bearer(token)).outcome == PUBLISH


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"aud": "https://elsewhere.example.com"}, "bad-token"),
        ({"email": "someone@example-project.iam.gserviceaccount.com"}, "bad-token"),
        ({"email_verified": False}, "bad-token"),
        ({"iss": "https://evil.example.com"}, "bad-token"),
        ({"exp": int(NOW) - 3600, "iat": int(NOW) - 7200}, "bad-token"),
        ({"iat": int(NOW) + 3600, "exp": int(NOW) + 7200}, "bad-token"),
    ],
)
def test_gcs_oidc_claims_are_checked(
    tmp_path: Path, overrides: dict[str, Any], reason: str
) -> None:
    key = new_rsa_key()
    push = build("gcs", gcs_route(tmp_path, key))
    token = google_token(key, "k1", push_claims(AUDIENCE, ACCOUNT, NOW, **overrides))
    assert refused(check(push, headers=bearer(token)), reason)


def test_gcs_oidc_forged_truncated_and_wrong_algorithm_tokens_are_refused(tmp_path: Path) -> None:
    key, other = new_rsa_key(), new_rsa_key()
    push = build("gcs", gcs_route(tmp_path, key))
    claims = push_claims(AUDIENCE, ACCOUNT, NOW)
    good = google_token(key, "k1", claims)
    assert refused(check(push, headers=bearer(google_token(other, "k1", claims))), "bad-token")
    assert refused(check(push, headers=bearer(good[:-10])), "bad-token")
    assert refused(check(push, headers=bearer(google_token(key, "k2", claims))), "bad-token")
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    # The classic confusion attack: HS256 keyed with the RSA public key (built by hand,
    # PyJWT refuses to make one).
    hs256 = hand_made_hs256(claims, public_pem, kid="k1")
    assert refused(check(push, headers=bearer(hs256)), "wrong-algorithm")
    assert refused(check(push), "missing-credentials")
    assert refused(check(push, headers={"Authorization": f"Basic {good}"}), "missing-credentials")


def test_gcs_keys_are_fetched_from_google_and_cached(tmp_path: Path) -> None:
    key = new_rsa_key()
    document = json.dumps(jwks(key.public_key(), "k1")).encode()
    url = "https://www.googleapis.com/oauth2/v3/certs"
    http = FakeHttp({url: HttpResult(200, document, {"cache-control": "public, max-age=600"})})
    push = build(
        "gcs", {"audience": AUDIENCE, "service_account": ACCOUNT}, services=Services(http_get=http)
    )
    token = google_token(key, "k1", push_claims(AUDIENCE, ACCOUNT, NOW))
    assert check(push, headers=bearer(token)).outcome == PUBLISH
    assert check(push, headers=bearer(token), now=NOW + 60).outcome == PUBLISH
    assert http.asked == [url]
    assert check(push, headers=bearer(token), now=NOW + 601).outcome == PUBLISH
    assert http.asked == [url, url]


def test_gcs_keys_unavailable_asks_for_a_retry() -> None:
    http = FakeHttp({"https://www.googleapis.com/oauth2/v3/certs": HttpResult(503, b"")})
    push = build(
        "gcs", {"audience": AUDIENCE, "service_account": ACCOUNT}, services=Services(http_get=http)
    )
    token = google_token(new_rsa_key(), "k1", push_claims(AUDIENCE, ACCOUNT, NOW))
    assert refused(check(push, headers=bearer(token)), "keys-unavailable", 503)


def test_gcs_shared_token_in_the_query_string() -> None:
    push = build("gcs", {"secret_env": "PUSH_TOKEN"}, {"PUSH_TOKEN": "s3cr3t-token"})
    assert check(push, query={"token": "s3cr3t-token"}).outcome == PUBLISH
    assert refused(check(push, query={"token": "s3cr3t-toke"}), "bad-credentials")
    assert refused(check(push), "missing-credentials")


# ------------------------------------------------------------------------------ Event Grid


def test_azure_secret_in_a_header_instead_of_the_query() -> None:
    grid = build("azure", {"secret_env": "EG", "secret_header": "X-Grid-Secret"}, {"EG": "abc123"})
    assert check(grid, headers={"X-Grid-Secret": "abc123"}).outcome == PUBLISH
    assert refused(check(grid, query={"code": "abc123"}), "missing-credentials")
    assert grid.secret_headers == frozenset({"x-grid-secret"})


def test_azure_validation_event_without_the_header_is_still_a_handshake() -> None:
    grid = build("azure", {"secret_env": "EG"}, {"EG": "abc123"})
    body = json.dumps(
        [
            {
                "id": "2d1781af-3a4c-4d7c-bd0c-e34b19da4e66",
                "topic": "/subscriptions/x",
                "subject": "",
                "data": {"validationCode": "512d38b6-c7b8-40c8-89fe-f46f9e9622b6"},
                "eventType": "Microsoft.EventGrid.SubscriptionValidationEvent",
                "eventTime": "2018-01-25T22:12:19.4556811Z",
                "metadataVersion": "1",
                "dataVersion": "1",
            }
        ]
    ).encode()
    verdict = check(grid, body, query={"code": "abc123"})
    assert verdict.outcome == RESPOND and verdict.status == 200
    assert json.loads(verdict.body) == {
        "validationResponse": "512d38b6-c7b8-40c8-89fe-f46f9e9622b6"
    }


# ---------------------------------------------------------------------------- token schemes


def test_minio_token_with_its_own_scheme_is_sent_as_is() -> None:
    minio = build("minio", {"secret_env": "T"}, {"T": "Token abc.def"})
    assert check(minio, headers={"Authorization": "Token abc.def"}).outcome == PUBLISH
    assert refused(check(minio, headers={"Authorization": "Bearer abc.def"}), "bad-credentials")
    plain = build("minio", {"token_env": "T"}, {"T": "abc.def"})
    assert check(plain, headers={"Authorization": "Bearer abc.def"}).outcome == PUBLISH
    assert check(plain, headers={"Authorization": "bearer abc.def"}).outcome == PUBLISH


def test_eventbridge_basic_auth() -> None:
    basic = build(
        "eventbridge", {"auth": "basic", "basic_username": "events", "secret_env": "P"}, {"P": "pw"}
    )
    good = base64.b64encode(b"events:pw").decode()
    assert check(basic, headers={"Authorization": f"Basic {good}"}).outcome == PUBLISH
    for wrong in (b"events:pX", b"other:pw", b"events", b"events:pw:"):
        value = base64.b64encode(wrong).decode()
        assert refused(check(basic, headers={"Authorization": f"Basic {value}"}), "bad-credentials")
    assert refused(check(basic, headers={"Authorization": "Basic ***"}), "bad-credentials")
    assert refused(check(basic), "missing-credentials")


# ----------------------------------------------------------------------------- HMAC schemes


def test_b2_signature_list_and_case() -> None:
    b2 = build("b2", {"secret_env": "B2"}, {"B2": "MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0"})
    body = b'{"events":[]}'
    signature = b2_signature("MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0", body)
    header = "X-Bz-Event-Notification-Signature"
    assert check(b2, body, {header: signature}).outcome == PUBLISH
    assert check(b2, body, {header: f"v1={'0' * 64},{signature}"}).outcome == PUBLISH
    assert check(b2, body, {header: signature.upper().replace("V1=", "v1=")}).outcome == PUBLISH
    # The secret is used as text, never base64-decoded.
    decoded = base64.b64decode("MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0").decode()
    assert refused(check(b2, body, {header: b2_signature(decoded, body)}), "bad-signature")
    assert refused(check(b2, body, {header: "v2=" + signature[3:]}), "wrong-algorithm")


def test_box_sdk_vector() -> None:
    """box-python-sdk test/box_sdk_gen/test/webhooks.py: keys, body, timestamp, signatures."""
    body = (
        b'{"type":"webhook_event","webhook":{"id":"1234567890"},"trigger":"FILE.UPLOADED",'
        b'"source":{"id":"1234567890","type":"file","name":"Test.txt"}}'
    )
    headers = {
        "box-delivery-id": "f96bb54b-ee16-4fc5-aa65-8c2d9e5b546f",
        "box-delivery-timestamp": "2020-01-01T00:00:00-07:00",
        "box-signature-algorithm": "HmacSHA256",
        "box-signature-primary": "6TfeAW3A1PASkgboxxA5yqHNKOwFyMWuEXny/FPD5hI=",
        "box-signature-secondary": "v+1CD1Jdo3muIcbpv5lxxgPglOqMfsNHPV899xWYydo=",
        "box-signature-version": "1",
    }
    environ = {"P": "SamplePrimaryKey", "S": "SampleSecondaryKey", "X": "IncorrectKey"}
    sent_at = dt.datetime(2020, 1, 1, 7, 0, tzinfo=dt.UTC).timestamp()
    both = build("box", {"secret_env": "P", "secondary_secret_env": "S"}, environ)
    assert check(both, body, headers, now=sent_at + 60).outcome == PUBLISH
    primary_only = build("box", {"secret_env": "P", "secondary_secret_env": "X"}, environ)
    assert check(primary_only, body, headers, now=sent_at).outcome == PUBLISH
    secondary_only = build("box", {"secret_env": "X", "secondary_secret_env": "S"}, environ)
    assert check(secondary_only, body, headers, now=sent_at).outcome == PUBLISH
    neither = build("box", {"secret_env": "X", "secondary_secret_env": "X"}, environ)
    assert refused(check(neither, body, headers, now=sent_at), "bad-signature")
    assert refused(check(both, body, headers, now=sent_at + 601), "replayed")
    assert refused(check(both, body, headers, now=sent_at - 601), "replayed")
    assert refused(
        check(both, body, {**headers, "box-signature-version": "2"}, now=sent_at), "wrong-algorithm"
    )
    assert refused(
        check(both, body, {**headers, "box-signature-algorithm": "HmacSHA1"}, now=sent_at),
        "wrong-algorithm",
    )
    # Our independent signer reproduces the vector.
    assert (
        box_signature("SamplePrimaryKey", body, headers["box-delivery-timestamp"])
        == (headers["box-signature-primary"])
    )


def test_box_configurable_window() -> None:
    box = build("box", {"secret_env": "P", "replay_window_s": "30s"}, {"P": "k"})
    timestamp = "2026-03-01T05:00:00-07:00"  # NOW
    headers = {
        "box-delivery-timestamp": timestamp,
        "box-signature-primary": box_signature("k", b"{}", timestamp),
        "box-signature-version": "1",
        "box-signature-algorithm": "HmacSHA256",
    }
    assert check(box, b"{}", headers, now=NOW + 29).outcome == PUBLISH
    assert refused(check(box, b"{}", headers, now=NOW + 31), "replayed")


def test_cloudinary_documented_example_and_sdk_sha256_vector() -> None:
    """notification_signatures: body `{public_id: 'sample'}`, timestamp 1315060510, secret abcd.
    cloudinary_npm utils_spec: api_secret 'hardcoded', sha256, timestamp 7952342400000."""
    body = b"{public_id: 'sample'}"
    documented = "25f7e91709c858b97d688ce8da799dedb290d9ef"
    assert cloudinary_signature(body, "1315060510", "abcd") == documented
    cld = build("cloudinary", {"secret_env": "C"}, {"C": "abcd"})
    headers = {"X-Cld-Timestamp": "1315060510", "X-Cld-Signature": documented}
    assert check(cld, body, headers, now=1315060510 + 60).outcome == PUBLISH
    assert refused(check(cld, body, headers, now=1315060510 + 7201), "replayed")

    sdk_body = (
        b'{"public_id":"b8sjhoslj8cq8ovoa0ma","version":"1555337587","width":1000,"height":800}'
    )
    sdk_signature = "6c5a29fd8815772fbac2f10ae741e093d0859313947ef8fadeb29126ded6649c"
    sha256 = build(
        "cloudinary", {"secret_env": "C", "signature_algorithm": "sha256"}, {"C": "hardcoded"}
    )
    sdk_headers = {"X-Cld-Timestamp": "7952342400000", "X-Cld-Signature": sdk_signature}
    assert check(sha256, sdk_body, sdk_headers, now=7952342400000).outcome == PUBLISH
    # A SHA-1 signature on an account configured for SHA-256 is refused, and vice versa.
    assert refused(check(sha256, body, headers, now=1315060510), "wrong-algorithm")
    assert refused(check(cld, sdk_body, sdk_headers, now=7952342400000), "wrong-algorithm")


def test_appwrite_signature_over_url_and_body_both_url_forms() -> None:
    url = "https://hooks.example.com/hooks/appwrite?tenant=a%20b"
    appwrite = build("appwrite", {"secret_env": "K", "url": url}, {"K": "signature-key"})
    body = b'{"$id":"abc","bucketId":"photos"}'
    header = "X-Appwrite-Webhook-Signature"
    assert check(
        appwrite, body, {header: appwrite_signature("signature-key", url, body)}
    ).outcome == (PUBLISH)
    decoded = "https://hooks.example.com/hooks/appwrite?tenant=a b"
    assert check(
        appwrite, body, {header: appwrite_signature("signature-key", decoded, body)}
    ).outcome == (PUBLISH)
    other = "https://hooks.example.com/hooks/other"
    assert refused(
        check(appwrite, body, {header: appwrite_signature("signature-key", other, body)}),
        "bad-signature",
    )
