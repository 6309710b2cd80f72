"""Sign webhook deliveries the way each provider documents it, and run the bridge in-process.

The signers here are written from the providers' documentation (cited per function), not
from `connectors.webhook_auth`, so that a test signing with them checks the bridge against
the documented scheme rather than against itself. Published test vectors are kept verbatim.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import ssl
import uuid
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from aiohttp.test_utils import TestClient, TestServer
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import AuthorityInformationAccessOID, ExtendedKeyUsageOID, NameOID

from connectors.publisher import RawPublisher
from connectors.webhook import create_app
from connectors.webhook_auth.base import HttpResult, Services
from streams.config import Settings

# --------------------------------------------------------------------------- Amazon SNS

# aws/aws-sdk-ruby gems/aws-sdk-sns/spec/message_verifier_spec.rb: two notifications signed by
# SNS itself (SignatureVersion 1 and 2) and the certificate they were signed with (valid
# 2021-09-07 .. 2022-08-17). Kept byte for byte.
AWS_CERT_URL = "https://sns.us-east-2.amazonaws.com/SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.pem"
AWS_VECTOR_TIME = dt.datetime(2022, 7, 28, 21, 30, tzinfo=dt.UTC).timestamp()
AWS_TOPIC_V1 = (
    "arn:aws:sns:us-east-2:295079676684:publish-and-verify-892f85fe-4836-424d-8188-ab85bef0f362"
)
AWS_TOPIC_V2 = (
    "arn:aws:sns:us-east-2:295079676684:publish-and-verify-62674b1d-4295-426b-88e7-5fb75652a04e"
)
AWS_MESSAGE_SHA1 = """{
  "Type" : "Notification",
  "MessageId" : "792cda85-518f-5dd3-9163-81d851212f3a",
  "TopicArn" : "arn:aws:sns:us-east-2:295079676684:publish-and-verify-892f85fe-4836-424d-8188-ab85bef0f362",
  "Message" : "Hello world",
  "Timestamp" : "2022-07-28T21:23:58.317Z",
  "SignatureVersion" : "1",
  "Signature" : "ghtf+deOBAzHJJZ6s6CdRLfTQAlcGzq9naoFM1wi0CJiq//uVRuZnamrkWNF0fhouMFvuLVRwcz8PZLUMSfnmd5VpdTKpTyiKmy1qJAZXma0w+yi7G+I33hD1Jyk1Nbym2n0kqp3fVu2aoooiN2ZeLAT2bH0/BtjLSfN1yAOKNoprco4qV9gGUZinXJdj9a1YdNhDR2jKi33ldlsVtEXAtiaDklGEk7DgRKX38GerBPiLg3FdtgY6KC7cdeGpU/dGK+4hjc83Ive1HoFkAwqhpgInM2sMytBosoiXfCmOKmU4xeGD0gHDNZTlJUJQDlzw8Eag0H9f/5zXF9d3uy0YQ==",
  "SigningCertURL" : "@CERT_URL@",
  "UnsubscribeURL" : "https://sns.us-east-2.amazonaws.com/?Action=Unsubscribe&SubscriptionArn=arn:aws:sns:us-east-2:295079676684:publish-and-verify-892f85fe-4836-424d-8188-ab85bef0f362:2296bc94-7992-4be1-b15f-b97229b5c1d8"
}""".replace("@CERT_URL@", AWS_CERT_URL).encode()  # noqa: E501
AWS_MESSAGE_SHA256 = """{
  "Type" : "Notification",
  "MessageId" : "17dea24b-55c2-540b-8362-f916557af765",
  "TopicArn" : "arn:aws:sns:us-east-2:295079676684:publish-and-verify-62674b1d-4295-426b-88e7-5fb75652a04e",
  "Message" : "Hello world",
  "Timestamp" : "2022-07-28T21:24:08.324Z",
  "SignatureVersion" : "2",
  "Signature" : "CXVqp9PfZAL+4JHS3Zxo1PFbQsvnOjvmYhtIf17TWpwc+iIVas8kZ8GopuzVzVMdatE7rCl/O4P91Zp05Dwz8lk8dLhfp8gSu3Njlzxlyrmzo9x3va3Jb7zFnedgS2GKnZWHGBdwTXho+TosNUE+3e10OMSlwN5XGDwX7+R3WL+rn+AXmFAqp3alg27sYa55h1dLE9cGszGPjScPdtF3BmZsUDMx9wSdNKsCk+vSvE8yBjnCmUl7laSFj3LzPVrlSwgNYCF3kYnNAkah7NplK4SFhJYLwS0HCVCQJKa8rVbQLf9cBTu60U402mrgy0bN8xWoyimzbYbrOMJjalqkUg==",
  "SigningCertURL" : "@CERT_URL@",
  "UnsubscribeURL" : "https://sns.us-east-2.amazonaws.com/?Action=Unsubscribe&SubscriptionArn=arn:aws:sns:us-east-2:295079676684:publish-and-verify-62674b1d-4295-426b-88e7-5fb75652a04e:ad7d16e3-0a7c-46aa-b23e-ffaf02250cbe"
}""".replace("@CERT_URL@", AWS_CERT_URL).encode()  # noqa: E501
AWS_CERT_PEM = b"""-----BEGIN CERTIFICATE-----
MIIF1zCCBL+gAwIBAgIQB9pYWG3Mi7xej22g9pobJTANBgkqhkiG9w0BAQsFADBG
MQswCQYDVQQGEwJVUzEPMA0GA1UEChMGQW1hem9uMRUwEwYDVQQLEwxTZXJ2ZXIg
Q0EgMUIxDzANBgNVBAMTBkFtYXpvbjAeFw0yMTA5MDcwMDAwMDBaFw0yMjA4MTcy
MzU5NTlaMBwxGjAYBgNVBAMTEXNucy5hbWF6b25hd3MuY29tMIIBIjANBgkqhkiG
9w0BAQEFAAOCAQ8AMIIBCgKCAQEAutFqueT3XgP13udzxE6UpbdjOtVO5DwoMpSM
iDNMnGzF1TYH5/R2LPUOBeTB0SkKnR4kpNcUZhicpGD4aKciz/GEZ6wu65xncfT9
H/KBOQwoXYTuClHwp6fYpGzcGFaFoEYMnijL/o4qmTSd+ukglQUgKpsDw4ofw6rU
m2CttJo+GQSNQ9NfGR1h/0J+zsApkeSYrXRx5wNlu87z8os1C/6PBrUHwt3xXeaf
Xzfwut8aRRYsS8BySOA9DAgLfNHlfdQCjKPXKrG/ussgReyWD6n/HH+j7Uha3xos
TzQqJifcxlTq6MxWdPR6fDaJNvqw6DOE7UjUNxHguXHlVfxhlQIDAQABo4IC6TCC
AuUwHwYDVR0jBBgwFoAUWaRmBlKge5WSPKOUByeWdFv5PdAwHQYDVR0OBBYEFAqz
C+vyouneE7mWWLbi9i0UsWUbMBwGA1UdEQQVMBOCEXNucy5hbWF6b25hd3MuY29t
MA4GA1UdDwEB/wQEAwIFoDAdBgNVHSUEFjAUBggrBgEFBQcDAQYIKwYBBQUHAwIw
OwYDVR0fBDQwMjAwoC6gLIYqaHR0cDovL2NybC5zY2ExYi5hbWF6b250cnVzdC5j
b20vc2NhMWIuY3JsMBMGA1UdIAQMMAowCAYGZ4EMAQIBMHUGCCsGAQUFBwEBBGkw
ZzAtBggrBgEFBQcwAYYhaHR0cDovL29jc3Auc2NhMWIuYW1hem9udHJ1c3QuY29t
MDYGCCsGAQUFBzAChipodHRwOi8vY3J0LnNjYTFiLmFtYXpvbnRydXN0LmNvbS9z
Y2ExYi5jcnQwDAYDVR0TAQH/BAIwADCCAX0GCisGAQQB1nkCBAIEggFtBIIBaQFn
AHYAKXm+8J45OSHwVnOfY6V35b5XfZxgCvj5TV0mXCVdx4QAAAF7vfDVkQAABAMA
RzBFAiEA2XfHuy36aqRFiaL8c3md2mH451go8707+fRE0pEdSRACIE/g5FXTUXUZ
PFcmOhm9TZ+uMY1i4CIQ/CKVWln6C3t+AHYAUaOw9f0BeZxWbbg3eI8MpHrMGyfL
956IQpoN/tSLBeUAAAF7vfDVjAAABAMARzBFAiBF1MhhFP0+FQt3daDFfMYoWwnr
muTInrjNpwfzlvQBugIhAPYadFzr+LaxSJoiZEbEHBvTts7bT0M3eCQONA2O7w6n
AHUAQcjKsd8iRkoQxqE6CUKHXk4xixsD6+tLx2jwkGKWBvYAAAF7vfDVdAAABAMA
RjBEAiAtPapmFAuA71ih4NoSd5hJelzAltNQpxDMcDfDyHyU8gIgWxmaa6+2KbBu
9xdv379zvnJACFR7jc+4asl08Dn4aagwDQYJKoZIhvcNAQELBQADggEBAA54QX0u
oFWXfMmv02CGZv4NWo5TapyeeixQ2kKpZHRdVZjxZrw+hoF6HD7P3kGjH8ztyJll
tDxB0qgMltbPhQdScwhA6iTgoaBYqEUC/VHKd4PmmPT6yIsM36NBZVmkGlzl5uNo
/dBgBaG0SsVJnhr5zro3c2quC7n6fVGEZhf/UgQwRnnvThnvbNKguglDMq4uEqv8
njKyleht+glkcmXO0m9qLKt6BOS0amy6U2GlAwRn0Wx02ndJtnRCSC6kPuRWK/SQ
FEjB7gCK4hdKaAOuWdZpI55vF6ifOeM8toC3g7ofO8qLTnJupAG+ZitY5J3cvHWr
HqOUdKigPDHYLRo=
-----END CERTIFICATE-----"""

# The issuer of AWS_CERT_PEM, "Amazon Server CA 1B" (valid 2015-10-22 .. 2025-10-19), as its
# caIssuers URL serves it: it verifies against Amazon Root CA 1 of the system trust store,
# which is what makes it authentic here (test_sns_vector_chain_reaches_the_system_store).
AWS_INTERMEDIATE_URL = "http://crt.sca1b.amazontrust.com/sca1b.crt"
AWS_INTERMEDIATE_PEM = b"""-----BEGIN CERTIFICATE-----
MIIESTCCAzGgAwIBAgITBn+UV4WH6Kx33rJTMlu8mYtWDTANBgkqhkiG9w0BAQsF
ADA5MQswCQYDVQQGEwJVUzEPMA0GA1UEChMGQW1hem9uMRkwFwYDVQQDExBBbWF6
b24gUm9vdCBDQSAxMB4XDTE1MTAyMjAwMDAwMFoXDTI1MTAxOTAwMDAwMFowRjEL
MAkGA1UEBhMCVVMxDzANBgNVBAoTBkFtYXpvbjEVMBMGA1UECxMMU2VydmVyIENB
IDFCMQ8wDQYDVQQDEwZBbWF6b24wggEiMA0GCSqGSIb3DQEBAQUAA4IBDwAwggEK
AoIBAQDCThZn3c68asg3Wuw6MLAd5tES6BIoSMzoKcG5blPVo+sDORrMd4f2AbnZ
cMzPa43j4wNxhplty6aUKk4T1qe9BOwKFjwK6zmxxLVYo7bHViXsPlJ6qOMpFge5
blDP+18x+B26A0piiQOuPkfyDyeR4xQghfj66Yo19V+emU3nazfvpFA+ROz6WoVm
B5x+F2pV8xeKNR7u6azDdU5YVX1TawprmxRC1+WsAYmz6qP+z8ArDITC2FMVy2fw
0IjKOtEXc/VfmtTFch5+AfGYMGMqqvJ6LcXiAhqG5TI+Dr0RtM88k+8XUBCeQ8IG
KuANaL7TiItKZYxK1MMuTJtV9IblAgMBAAGjggE7MIIBNzASBgNVHRMBAf8ECDAG
AQH/AgEAMA4GA1UdDwEB/wQEAwIBhjAdBgNVHQ4EFgQUWaRmBlKge5WSPKOUByeW
dFv5PdAwHwYDVR0jBBgwFoAUhBjMhTTsvAyUlC4IWZzHshBOCggwewYIKwYBBQUH
AQEEbzBtMC8GCCsGAQUFBzABhiNodHRwOi8vb2NzcC5yb290Y2ExLmFtYXpvbnRy
dXN0LmNvbTA6BggrBgEFBQcwAoYuaHR0cDovL2NydC5yb290Y2ExLmFtYXpvbnRy
dXN0LmNvbS9yb290Y2ExLmNlcjA/BgNVHR8EODA2MDSgMqAwhi5odHRwOi8vY3Js
LnJvb3RjYTEuYW1hem9udHJ1c3QuY29tL3Jvb3RjYTEuY3JsMBMGA1UdIAQMMAow
CAYGZ4EMAQIBMA0GCSqGSIb3DQEBCwUAA4IBAQCFkr41u3nPo4FCHOTjY3NTOVI1
59Gt/a6ZiqyJEi+752+a1U5y6iAwYfmXss2lJwJFqMp2PphKg5625kXg8kP2CN5t
6G7bMQcT8C8xDZNtYTd7WPD8UZiRKAJPBXa30/AbwuZe0GaFEQ8ugcYQgSn+IGBI
8/LwhBNTZTUVEWuCUUBVV18YtbAiPq3yXqMB48Oz+ctBWuZSkbvkNodPLamkB2g1
upRyzQ7qDn1X8nn8N8V7YJ6y68AtkHcNSRAnpTitxBKjtKPISLMVCx7i4hncxHZS
yLyKQXhw2W2Xs0qLeC1etA+jTGDK4UfLeC0SF7FSi8o5LL21L8IzApar2pR/
-----END CERTIFICATE-----"""


def amazon_root_pem() -> bytes:
    """Amazon Root CA 1 as this host's trust store holds it (AWS_INTERMEDIATE_PEM's issuer)."""
    bundle = Path(ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # some roots have a non-positive serial number
        roots = x509.load_pem_x509_certificates(bundle.read_bytes())
    wanted = x509.load_pem_x509_certificate(AWS_INTERMEDIATE_PEM).issuer
    return next(pem(root) for root in roots if root.subject == wanted)


def aws_intermediate_der() -> bytes:
    certificate = x509.load_pem_x509_certificate(AWS_INTERMEDIATE_PEM)
    return certificate.public_bytes(serialization.Encoding.DER)


def new_rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class Pki:
    """A test CA and an SNS-like signing certificate it issued."""

    ca_key: rsa.RSAPrivateKey
    ca: x509.Certificate
    key: rsa.RSAPrivateKey
    certificate: x509.Certificate


@dataclass(frozen=True)
class SnsChain:
    """A test root CA, an intermediate it issued, and an SNS leaf the intermediate issued,
    whose caIssuers URL (`intermediate_url`) names the intermediate, as Amazon's do."""

    root: x509.Certificate
    intermediate_key: rsa.RSAPrivateKey
    intermediate: x509.Certificate
    intermediate_url: str
    key: rsa.RSAPrivateKey
    certificate: x509.Certificate


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def issue(
    subject_key: rsa.RSAPrivateKey,
    common_name: str,
    issuer_key: rsa.RSAPrivateKey,
    issuer: x509.Name | None = None,
    not_before: dt.datetime = dt.datetime(2020, 1, 1, tzinfo=dt.UTC),
    not_after: dt.datetime = dt.datetime(2099, 1, 1, tzinfo=dt.UTC),
    ca: bool = False,
    digital_signature: bool = True,
    ca_issuers: str | None = None,
) -> x509.Certificate:
    """A certificate as the Web PKI wants one (key identifiers; a leaf: SAN and serverAuth)."""
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(issuer or _name(common_name))
        .public_key(subject_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=digital_signature,
                content_commitment=False,
                key_encipherment=not ca,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    builder = builder.add_extension(
        x509.SubjectKeyIdentifier.from_public_key(subject_key.public_key()), critical=False
    )
    if issuer is not None:  # not self-signed
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
    if ca_issuers is not None:
        access = x509.AccessDescription(
            AuthorityInformationAccessOID.CA_ISSUERS, x509.UniformResourceIdentifier(ca_issuers)
        )
        builder = builder.add_extension(x509.AuthorityInformationAccess([access]), critical=False)
    if not ca:
        san = x509.SubjectAlternativeName([x509.DNSName(common_name)])
        builder = builder.add_extension(san, critical=False)
        eku = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH])
        builder = builder.add_extension(eku, critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def sns_pki(common_name: str = "sns.amazonaws.com") -> Pki:
    ca_key, key = new_rsa_key(), new_rsa_key()
    ca = issue(ca_key, "Test SNS CA", ca_key, ca=True)
    certificate = issue(key, common_name, ca_key, issuer=ca.subject)
    return Pki(ca_key, ca, key, certificate)


def sns_chain(
    common_name: str = "sns.amazonaws.com", ca_host: str = "crt.test-ca.example"
) -> SnsChain:
    """Root -> intermediate -> SNS leaf; the leaf names the intermediate's URL (caIssuers)."""
    root_key, intermediate_key, key = new_rsa_key(), new_rsa_key(), new_rsa_key()
    root = issue(root_key, f"Test Root CA {uuid.uuid4().hex[:8]}", root_key, ca=True)
    intermediate = issue(
        intermediate_key,
        f"Test Server CA {uuid.uuid4().hex[:8]}",
        root_key,
        issuer=root.subject,
        ca=True,
    )
    url = f"http://{ca_host}/{uuid.uuid4().hex[:8]}.crt"
    certificate = issue(
        key, common_name, intermediate_key, issuer=intermediate.subject, ca_issuers=url
    )
    return SnsChain(root, intermediate_key, intermediate, url, key, certificate)


def der(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.DER)


def sns_time(when: float) -> str:
    """An SNS `Timestamp`: ISO 8601 UTC with milliseconds and `Z`."""
    moment = dt.datetime.fromtimestamp(when, dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def sns_string_to_sign(message: Mapping[str, str]) -> bytes:
    """sns-verify-signature-of-message.html: `Name\\nValue\\n` pairs, in the documented order."""
    if message["Type"] == "Notification":
        names = ["Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"]
    else:
        names = ["Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"]
    return "".join(f"{n}\n{message[n]}\n" for n in names if n in message).encode()


def sns_message(
    key: rsa.RSAPrivateKey,
    cert_url: str,
    topic_arn: str,
    kind: str = "Notification",
    message: str = '{"Records":[]}',
    version: str = "1",
    subject: str | None = "Amazon S3 Notification",
    timestamp: float | None = None,
    **extra: str,
) -> dict[str, str]:
    """An SNS HTTP message signed with `key` (RSA PKCS#1 v1.5, SHA1 for 1, SHA256 for 2),
    published at `timestamp` (default 2022-07-28T21:25:00Z, 5 minutes before
    AWS_VECTOR_TIME)."""
    body: dict[str, str] = {
        "Type": kind,
        "MessageId": str(uuid.uuid4()),
        "TopicArn": topic_arn,
        "Message": message,
        "Timestamp": "2022-07-28T21:25:00.000Z" if timestamp is None else sns_time(timestamp),
        "SignatureVersion": version,
        "SigningCertURL": cert_url,
    }
    if kind == "Notification":
        if subject is not None:
            body["Subject"] = subject
        body["UnsubscribeURL"] = "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe"
    else:
        token = uuid.uuid4().hex * 4
        body["Token"] = token
        region = topic_arn.split(":")[3]
        body["SubscribeURL"] = (
            f"https://sns.{region}.amazonaws.com/?Action=ConfirmSubscription"
            f"&TopicArn={topic_arn}&Token={token}"
        )
    body.update(extra)
    algorithm = hashes.SHA1() if version == "1" else hashes.SHA256()
    signature = key.sign(sns_string_to_sign(body), padding.PKCS1v15(), algorithm)
    body["Signature"] = base64.b64encode(signature).decode()
    return body


# --------------------------------------------------------------------------- Google OIDC


def jwks(public_key: rsa.RSAPublicKey, kid: str) -> dict[str, Any]:
    entry = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(public_key))
    entry.update(kid=kid, alg="RS256", use="sig")
    return {"keys": [entry]}


def google_token(key: Any, kid: str, claims: Mapping[str, Any], algorithm: str = "RS256") -> str:
    """authenticate-push-subscriptions: an OIDC JWT `{"alg":"RS256","kid":...}` and claims."""
    return jwt.encode(dict(claims), key, algorithm=algorithm, headers={"kid": kid})


def push_claims(audience: str, email: str, now: float, /, **overrides: Any) -> dict[str, Any]:
    claims: dict[str, Any] = {
        "aud": audience,
        "azp": "113774264463038321964",
        "email": email,
        "email_verified": True,
        "exp": int(now) + 3600,
        "iat": int(now),
        "iss": "https://accounts.google.com",
        "sub": "113774264463038321964",
    }
    claims.update(overrides)
    return claims


# --------------------------------------------------------------------------- HMAC schemes


def b2_signature(secret: str, body: bytes) -> str:
    """B2 reference guide: `v1=` + lower-case hex HMAC-SHA256(secret as UTF-8, body)."""
    return "v1=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def box_signature(key: str, body: bytes, timestamp: str) -> str:
    """Box signatures-v2: base64 HMAC-SHA256(key, body bytes then timestamp bytes)."""
    mac = hmac.new(key.encode(), body, hashlib.sha256)
    mac.update(timestamp.encode())
    return base64.b64encode(mac.digest()).decode()


def box_timestamp(when: float) -> str:
    return dt.datetime.fromtimestamp(when, dt.timezone(dt.timedelta(hours=-7))).isoformat()


def cloudinary_signature(body: bytes, timestamp: str, secret: str, algorithm: str = "sha1") -> str:
    """Cloudinary notification_signatures: hex digest of body + timestamp + API secret."""
    return hashlib.new(algorithm, body + timestamp.encode() + secret.encode()).hexdigest()


def appwrite_signature(key: str, url: str, body: bytes) -> str:
    """Appwrite Webhooks.php: base64(hash_hmac('sha1', $url . $payload, $key, true))."""
    return base64.b64encode(
        hmac.new(key.encode(), url.encode() + body, hashlib.sha1).digest()
    ).decode()


# --------------------------------------------------------------------------- the bridge


@dataclass(frozen=True)
class Request:
    """One HTTP request to send to the bridge."""

    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, str] = field(default_factory=dict)
    method: str = "POST"


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    headers: Mapping[str, str]

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class FakeHttp:
    """Outbound GETs answered from a table; records every URL asked for."""

    answers: dict[str, HttpResult] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)

    async def __call__(self, url: str) -> HttpResult:
        self.asked.append(url)
        if url in self.answers:
            return self.answers[url]
        return HttpResult(200, b"")


def settings_for(
    bootstrap: str, raw_topic: str, webhook: Mapping[str, Any], publish_timeout_s: float = 10.0
) -> Settings:
    return Settings.model_validate(
        {
            "kafka": {"bootstrap_servers": bootstrap},
            "webhook": {"raw_topic": raw_topic, "publish_timeout_s": publish_timeout_s, **webhook},
        }
    )


async def exchange(
    settings: Settings,
    source: str,
    requests: Sequence[Request],
    environ: Mapping[str, str] | None = None,
    services: Services | None = None,
) -> list[Answer]:
    """Run the bridge in-process (aiohttp TestServer on 127.0.0.1), send `requests` in order
    to `/hooks/<source>`, stop the bridge (its writes acknowledged) and return the answers."""
    publisher = RawPublisher(
        settings.kafka.bootstrap_servers,
        settings.webhook.raw_topic,
        settings.webhook.publish_timeout_s,
    )
    app = create_app(settings, publisher, dict(environ or {}), services)
    answers: list[Answer] = []
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        for request in requests:
            async with client.request(
                request.method,
                f"/hooks/{source}",
                data=request.body,
                headers=dict(request.headers),
                params=dict(request.query),
            ) as response:
                answers.append(
                    Answer(response.status, await response.read(), dict(response.headers))
                )
    return answers


def unique_topic(source: str) -> str:
    return f"test.webhook.{source}.{uuid.uuid4().hex[:10]}"


def write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path
