"""S3 event notifications through an Amazon SNS HTTP(S) subscription.

Sources: https://docs.aws.amazon.com/sns/latest/dg/sns-verify-signature-of-message.html
(`awsdocs/amazon-sns-developer-guide:doc_source/sns-verify-signature-of-message.md`):

* The string to sign is `Name\\nValue\\n` for, in this order, `Message`, `MessageId`,
  `Subject` (if present), `Timestamp`, `TopicArn`, `Type` for a Notification, and `Message`,
  `MessageId`, `SubscribeURL`, `Timestamp`, `Token`, `TopicArn`, `Type` for a
  SubscriptionConfirmation or UnsubscribeConfirmation; values as JSON-decoded.
* `Signature` is base64 of an RSA (PKCS#1 v1.5) signature over it with SHA1
  (`SignatureVersion` 1) or SHA256 (`SignatureVersion` 2), verified with the public key of the
  X.509 certificate at `SigningCertURL`.
* Fetch the certificate over HTTPS only, from Amazon SNS (`sns.<region>.amazonaws.com`,
  `.com.cn` in China; the `.pem` path as `aws-sdk-ruby`'s `MessageVerifier` requires), and
  reject messages of unexpected `TopicArn`s.

Certificate checks follow `aws/aws-sdk-java-v2` `SignatureValidator`/`CertificateRetriever`:
valid now (the injectable clock), digitalSignature key usage when the extension is present,
an SNS subject (`sns.amazonaws.com`, or an `sns.*.amazonaws.com[.cn]` name), at most 10 KB,
cached per URL. Optionally (`trusted_ca_file`) the certificate must be issued directly by a
configured CA. Test vectors: `aws/aws-sdk-ruby` `gems/aws-sdk-sns/spec/message_verifier_spec.rb`
(messages signed by SNS with SignatureVersion 1 and 2, and their certificate).

Handshakes: a verified `SubscriptionConfirmation` for an allowed topic is confirmed by a GET of
its `SubscribeURL` (itself required to be https on an SNS host) and answered 200, or 503 when
the GET fails so that SNS delivers it again; a verified `UnsubscribeConfirmation` is logged
and answered 200 (the bridge never resubscribes on its own). Neither is published. Raw
message delivery must be off for the subscription: a raw body carries no signature.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from connectors.webhook_auth.base import (
    FETCH_ERRORS,
    HttpGet,
    RequestFacts,
    Verdict,
    publish,
    reject,
    respond,
)
from streams.config import WebhookRouteConfig

log = logging.getLogger(__name__)

NOTIFICATION = "Notification"
SUBSCRIBE = "SubscriptionConfirmation"
UNSUBSCRIBE = "UnsubscribeConfirmation"
NOTIFICATION_FIELDS = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
CONFIRMATION_FIELDS = (
    "Message",
    "MessageId",
    "SubscribeURL",
    "Timestamp",
    "Token",
    "TopicArn",
    "Type",
)
OPTIONAL_FIELDS = frozenset({"Subject"})
HASHES: dict[str, type[hashes.HashAlgorithm]] = {"1": hashes.SHA1, "2": hashes.SHA256}
MAX_CERTIFICATE_BYTES = 10 * 1024
CACHE_ENTRIES = 64
BEGIN, END = b"-----BEGIN CERTIFICATE-----", b"-----END CERTIFICATE-----"
SNS_SUBJECT = re.compile(r"^sns(\.[a-z0-9-]+)*\.amazonaws\.com(\.cn)?$")


class CertificateRefused(Exception):
    """The signing certificate is not one an SNS message may be verified with."""


class CertificateUnavailable(Exception):
    """The signing certificate could not be fetched (try again later)."""


def string_to_sign(message: Mapping[str, Any]) -> bytes | None:
    """The canonical string SNS signed, or None when a required field is missing."""
    kind = message.get("Type")
    names = NOTIFICATION_FIELDS if kind == NOTIFICATION else CONFIRMATION_FIELDS
    parts: list[str] = []
    for name in names:
        value = message.get(name)
        if value is None and name in OPTIONAL_FIELDS:
            continue
        if not isinstance(value, str):
            return None
        parts.append(f"{name}\n{value}\n")
    return "".join(parts).encode("utf-8")


def sns_https_url(url: Any, pem: bool) -> bool:
    """An https URL on an Amazon SNS host (and, for certificates, a `.pem` path)."""
    if not isinstance(url, str):
        return False
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return False
    if parts.scheme != "https" or port not in (None, 443) or parts.username is not None:
        return False
    if not WebhookRouteConfig.SNS_HOST.match(host):
        return False
    return parts.path.endswith(".pem") if pem else True


def _names(certificate: x509.Certificate) -> list[str]:
    subject = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    names = [str(attribute.value) for attribute in subject]
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        names += san.value.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        pass
    return [name.lower() for name in names]


def check_certificate(
    certificate: x509.Certificate, now: float, trusted: tuple[x509.Certificate, ...]
) -> None:
    """Raise CertificateRefused unless the certificate may sign SNS messages at `now`."""
    moment = datetime.fromtimestamp(now, tz=UTC)
    if not certificate.not_valid_before_utc <= moment <= certificate.not_valid_after_utc:
        raise CertificateRefused("signing certificate is not valid now")
    try:
        usage = certificate.extensions.get_extension_for_class(x509.KeyUsage)
        if not usage.value.digital_signature:
            raise CertificateRefused("signing certificate lacks digitalSignature key usage")
    except x509.ExtensionNotFound:
        pass
    if not any(SNS_SUBJECT.match(name) for name in _names(certificate)):
        raise CertificateRefused("signing certificate is not issued to Amazon SNS")
    if not isinstance(certificate.public_key(), rsa.RSAPublicKey):
        raise CertificateRefused("signing certificate does not hold an RSA key")
    if trusted:
        for authority in trusted:
            try:
                certificate.verify_directly_issued_by(authority)
                return
            except (ValueError, TypeError, InvalidSignature):
                continue
        raise CertificateRefused("signing certificate is not issued by a trusted CA")


def load_pem(data: bytes) -> x509.Certificate:
    """One PEM certificate and nothing else (as `aws-sdk-ruby` insists)."""
    text = data.strip()
    begins, ends = text.startswith(BEGIN), text.endswith(END)
    if not (begins and ends) or text.count(BEGIN) != 1:
        raise CertificateRefused("signing certificate is not a PEM certificate")
    try:
        return x509.load_pem_x509_certificate(text)
    except ValueError as exc:
        raise CertificateRefused(f"signing certificate does not parse: {exc}") from None


def load_authorities(pem_bundle: bytes) -> tuple[x509.Certificate, ...]:
    """The CA certificates of a PEM bundle (ValueError when it holds none)."""
    return tuple(x509.load_pem_x509_certificates(pem_bundle))


@dataclass
class CertificateStore:
    """Signing certificates by URL: from configured files, else fetched over https; cached."""

    http_get: HttpGet
    files: Mapping[str, bytes]
    cache_s: float
    _cache: OrderedDict[str, tuple[x509.Certificate, float]] = field(default_factory=OrderedDict)

    async def get(self, url: str, now: float) -> x509.Certificate:
        cached = self._cache.get(url)
        if cached is not None and now - cached[1] < self.cache_s:
            return cached[0]
        if url in self.files:
            data = self.files[url]
        else:
            try:
                result = await self.http_get(url)
            except FETCH_ERRORS as exc:
                raise CertificateUnavailable(f"fetching {url}: {exc!r}") from None
            if result.status in (403, 404, 410):
                raise CertificateRefused(f"no certificate at {url} (HTTP {result.status})")
            if result.status != 200:
                raise CertificateUnavailable(f"fetching {url}: HTTP {result.status}")
            data = result.body
        if len(data) > MAX_CERTIFICATE_BYTES:
            raise CertificateRefused("signing certificate is larger than 10 KB")
        certificate = load_pem(data)
        self._cache[url] = (certificate, now)
        self._cache.move_to_end(url)
        while len(self._cache) > CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return certificate


def verify_signature(certificate: x509.Certificate, message: Mapping[str, Any]) -> bool:
    """True when `Signature` is the certificate's signature over the string to sign."""
    canonical = string_to_sign(message)
    algorithm = HASHES.get(str(message.get("SignatureVersion")))
    signature = message.get("Signature")
    key = certificate.public_key()
    if canonical is None or algorithm is None or not isinstance(signature, str):
        return False
    if not isinstance(key, rsa.RSAPublicKey):
        return False
    try:
        raw = base64.b64decode(signature, validate=True)
        key.verify(raw, canonical, padding.PKCS1v15(), algorithm())
    except (binascii.Error, ValueError, InvalidSignature):
        return False
    return True


@dataclass
class SnsMessages:
    source: str
    topic_arns: frozenset[str]
    certificates: CertificateStore
    trusted: tuple[x509.Certificate, ...]
    http_get: HttpGet
    confirm_subscriptions: bool
    methods: frozenset[str] = frozenset({"POST"})
    secret_headers: frozenset[str] = frozenset()

    async def authenticate(self, request: RequestFacts) -> Verdict:
        try:
            message = json.loads(request.body)
        except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
            return reject("missing-signature", "body is not an SNS message (raw delivery?)")
        if not isinstance(message, dict) or "Signature" not in message:
            return reject("missing-signature", "body is not a signed SNS message")
        kind = message.get("Type")
        if kind not in (NOTIFICATION, SUBSCRIBE, UNSUBSCRIBE):
            return reject("malformed", f"unknown SNS message Type {kind!r}")
        if message.get("TopicArn") not in self.topic_arns:
            return reject("unknown-topic", f"TopicArn {message.get('TopicArn')!r} not allowed")
        version = message.get("SignatureVersion")
        if str(version) not in HASHES:
            return reject("wrong-algorithm", f"SignatureVersion {version!r} is not 1 or 2")
        url = message.get("SigningCertURL")
        if not sns_https_url(url, pem=True):
            return reject("bad-certificate", f"SigningCertURL {url!r} is not an SNS https .pem")
        try:
            certificate = await self.certificates.get(str(url), request.now)
            check_certificate(certificate, request.now, self.trusted)
        except CertificateUnavailable as exc:
            return reject("certificate-unavailable", str(exc), 503)
        except CertificateRefused as exc:
            return reject("bad-certificate", str(exc))
        if not verify_signature(certificate, message):
            return reject("bad-signature", "SNS signature does not verify")
        if kind == NOTIFICATION:
            return publish()
        if kind == UNSUBSCRIBE:
            log.warning("SNS unsubscribed this endpoint from %s", message["TopicArn"])
            return respond("unsubscribe-confirmation", 200, {"ok": True})
        return await self._confirm(message)

    async def _confirm(self, message: Mapping[str, Any]) -> Verdict:
        topic, url = message["TopicArn"], message.get("SubscribeURL")
        if not self.confirm_subscriptions:
            log.warning("SNS subscription to %s awaits confirmation: GET %s", topic, url)
            return respond("subscription-confirmation", 200, {"confirmed": False})
        if not sns_https_url(url, pem=False):
            return reject("malformed", f"SubscribeURL {url!r} is not an SNS https URL")
        try:
            result = await self.http_get(str(url))
        except FETCH_ERRORS as exc:
            return reject("confirmation-failed", f"GET SubscribeURL: {exc!r}", 503)
        if not 200 <= result.status < 300:
            return reject("confirmation-failed", f"GET SubscribeURL: HTTP {result.status}", 503)
        log.info("SNS subscription to %s confirmed", topic)
        return respond("subscription-confirmation", 200, {"confirmed": True})
