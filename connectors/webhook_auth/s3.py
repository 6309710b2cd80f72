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
  `.com.cn` in China: `WebhookRouteConfig.SNS_HOST`, stricter than the pattern of AWS's own
  validators, see there; the `.pem` path as `aws-sdk-ruby`'s `MessageVerifier` requires), and
  reject messages of unexpected `TopicArn`s.

What is published is exactly what was signed (issue 13). A message carrying a top-level
field SNS does not send for its `Type` (http-notification-json.html,
http-subscription-confirmation-json.html, http-unsubscribe-confirmation-json.html, plus the
`MessageAttributes` of a Notification; the sets are the normalizer's,
`streams.core.normalizers.s3.SNS_NOTIFICATION_FIELDS`), or any object key twice, is refused 401
`unsigned-fields`: an extra `Records` beside a signed `Message` would otherwise be read by
the worker as if SNS had signed it. A `Timestamp` (signed) older than `max_message_age_s`
(default 1 h, the longest an HTTP(S) delivery policy retries) or more than
`SNS_CLOCK_SKEW_S` (5 min) ahead of the bridge's clock is refused 401 `replayed`; the config
check `Settings._sns_replays_are_duplicates` keeps that window inside every instance's
`dedupe_ttl`, so a replay that gets through is a duplicate the stream drops.

Order of checks: everything that costs nothing (JSON shape, field set, `Type`, `TopicArn`,
`Timestamp`, `SignatureVersion`, the signature's base64, `SigningCertURL`, `SubscribeURL`)
comes before the certificate is looked up, so an unsigned or malformed message never makes
the bridge fetch anything.

Certificates (`CertificateStore`): served from `certificate_files` or fetched over https, at
most 10 KB, one PEM certificate (a file may append its intermediates). Then, as
`aws/aws-sdk-java-v2` `SignatureValidator` does: valid now (the injectable clock),
digitalSignature key usage when the extension is present, an SNS subject
(`sns.amazonaws.com`, or an `sns.*.amazonaws.com[.cn]` name), an RSA key. And its chain
must verify (`cryptography.x509.verification`, the Web PKI rules a TLS client applies to a
server certificate for that SNS name) up to a trust anchor: the system trust store
(`ssl.get_default_verify_paths()`, else `certifi`) by default, or only the CAs of
`trusted_ca_file` when set. A self-signed certificate for `sns.amazonaws.com` is refused.
Intermediates: SNS serves the leaf alone, so the issuer is fetched from the leaf's
Authority Information Access `caIssuers` URL (as browsers do; at most 2 hops, 10 KB each,
DER or PEM), only after the leaf passed the checks above; intermediates found are untrusted
until the chain verifies. Air-gapped hosts put the intermediates after the leaf in the
`certificate_files` file.

Fetches are bounded: one fetch per URL at a time (concurrent messages naming it share it),
at most `MAX_FETCHES_IN_FLIGHT` distinct URLs at once (a message beyond that is answered 503
`certificate-unavailable`, so SNS delivers it again), verified certificates cached per URL
(`certificate_cache_s`, never past the chain's expiry), failures cached too: an unreachable
certificate for `UNAVAILABLE_RETRY_S` (10 s, short enough for SNS's retries 20 s apart), a
refused one for `REFUSED_RETRY_S` (5 min). Test vectors: `aws/aws-sdk-ruby`
`gems/aws-sdk-sns/spec/message_verifier_spec.rb` (messages signed by SNS with
SignatureVersion 1 and 2, and their certificate).

Handshakes: a verified `SubscriptionConfirmation` for an allowed topic is confirmed by a GET of
its `SubscribeURL` (itself required to be https on an SNS host) and answered 200, or 503 when
the GET fails so that SNS delivers it again; a verified `UnsubscribeConfirmation` is logged
and answered 200 (the bridge never resubscribes on its own). Neither is published. Raw
message delivery must be off for the subscription: a raw body carries no signature.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import re
import ssl
import warnings
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import AuthorityInformationAccessOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

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
from streams.core.normalizers.s3 import SNS_CONFIRMATION_FIELDS, SNS_NOTIFICATION_FIELDS

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
ALLOWED_FIELDS: dict[str, frozenset[str]] = {
    NOTIFICATION: SNS_NOTIFICATION_FIELDS,
    SUBSCRIBE: SNS_CONFIRMATION_FIELDS,
    UNSUBSCRIBE: SNS_CONFIRMATION_FIELDS,
}
"""Every top-level field SNS sends in an HTTP(S) delivery of each message Type."""
HASHES: dict[str, type[hashes.HashAlgorithm]] = {"1": hashes.SHA1, "2": hashes.SHA256}
MAX_CERTIFICATE_BYTES = 10 * 1024
CACHE_ENTRIES = 64
FAILURE_ENTRIES = 1024
MAX_FETCHES_IN_FLIGHT = 8
"""Distinct certificate URLs fetched at once; a message needing another one gets 503."""
MAX_AIA_FETCHES = 2
"""Intermediates fetched from `caIssuers` URLs per certificate (SNS: one, its issuing CA)."""
UNAVAILABLE_RETRY_S = 10.0
"""How long a certificate that could not be fetched is not fetched again (503 meanwhile)."""
REFUSED_RETRY_S = 300.0
"""How long a certificate that was refused (404, not SNS's, untrusted) is not fetched again."""
BEGIN, END = b"-----BEGIN CERTIFICATE-----", b"-----END CERTIFICATE-----"
SNS_SUBJECT = re.compile(r"^sns(\.[a-z0-9-]+)*\.amazonaws\.com(\.cn)?$")
SNS_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?Z$")


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


def sns_timestamp(value: Any) -> float | None:
    """Unix seconds of an SNS `Timestamp` (`2022-07-28T21:23:58.317Z`), None if it is not one."""
    if not isinstance(value, str) or not SNS_TIMESTAMP.match(value):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:  # a month 13, a second 61
        return None


def _names(certificate: x509.Certificate) -> list[str]:
    subject = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    names = [str(attribute.value) for attribute in subject]
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        names += san.value.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        pass
    return [name.lower() for name in names]


def _dns_names(certificate: x509.Certificate) -> list[str]:
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return [name.lower() for name in san.value.get_values_for_type(x509.DNSName)]


def check_certificate(certificate: x509.Certificate, now: float) -> None:
    """Raise CertificateRefused unless the leaf itself may sign SNS messages at `now`."""
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


def load_chain_file(data: bytes) -> tuple[x509.Certificate, tuple[x509.Certificate, ...]]:
    """A configured certificate file: the leaf, then optionally its intermediates."""
    text = data.strip()
    if not (text.startswith(BEGIN) and text.endswith(END)):
        raise CertificateRefused("signing certificate is not a PEM certificate")
    try:
        certificates = x509.load_pem_x509_certificates(text)
    except ValueError as exc:
        raise CertificateRefused(f"signing certificate does not parse: {exc}") from None
    return certificates[0], tuple(certificates[1:])


def load_authorities(pem_bundle: bytes) -> tuple[x509.Certificate, ...]:
    """The CA certificates of a PEM bundle; a block that does not parse is skipped (a system
    bundle may hold certificates a newer `cryptography` refuses). ValueError: none at all."""
    found: list[x509.Certificate] = []
    for block in re.findall(
        rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", pem_bundle, re.DOTALL
    ):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # e.g. a root's non-positive serial number
                found.append(x509.load_pem_x509_certificate(block))
        except ValueError:
            continue
    if not found:
        raise ValueError("no PEM certificate in it")
    return tuple(found)


def system_trust_store() -> tuple[Path, tuple[x509.Certificate, ...]]:
    """The CA bundle TLS clients on this host trust (`SSL_CERT_FILE`, OpenSSL's default file,
    else `certifi`'s), as (path, certificates). ValueError when none can be read."""
    paths = ssl.get_default_verify_paths()
    candidates = [paths.cafile, paths.openssl_cafile]
    try:
        import certifi

        candidates.append(certifi.where())
    except ImportError:  # pragma: no cover - certifi comes with aiohttp's usual installs
        pass
    for candidate in candidates:
        if not candidate:
            continue
        path = Path(candidate)
        try:
            return path, load_authorities(path.read_bytes())
        except (OSError, ValueError):
            continue
    raise ValueError("no system CA bundle found (set SSL_CERT_FILE, or trusted_ca_file)")


@dataclass(frozen=True)
class TrustAnchors:
    """The CAs an SNS signing certificate's chain must reach, and where they came from."""

    certificates: tuple[x509.Certificate, ...]
    origin: str
    store: Store = field(init=False, repr=False, compare=False)
    subjects: frozenset[x509.Name] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "store", Store(list(self.certificates)))
        subjects = frozenset(certificate.subject for certificate in self.certificates)
        object.__setattr__(self, "subjects", subjects)

    def verify(
        self, leaf: x509.Certificate, intermediates: Sequence[x509.Certificate], now: float
    ) -> list[x509.Certificate]:
        """The verified chain (leaf first), or CertificateRefused naming why not."""
        names = [name for name in _dns_names(leaf) if SNS_SUBJECT.match(name)]
        if not names:
            raise CertificateRefused("signing certificate names no SNS host in subjectAltName")
        moment = datetime.fromtimestamp(now, tz=UTC)
        try:
            verifier = (
                PolicyBuilder()
                .store(self.store)
                .time(moment)
                .max_chain_depth(4)
                .build_server_verifier(x509.DNSName(names[0]))
            )
            return verifier.verify(leaf, list(intermediates))
        except (VerificationError, ValueError) as exc:
            raise CertificateRefused(
                f"signing certificate does not chain to a CA of the {self.origin}: {exc}"
            ) from None


def _ca_issuers_url(certificate: x509.Certificate) -> str | None:
    try:
        access = certificate.extensions.get_extension_for_class(x509.AuthorityInformationAccess)
    except x509.ExtensionNotFound:
        return None
    for description in access.value:
        location = description.access_location
        if (
            description.access_method == AuthorityInformationAccessOID.CA_ISSUERS
            and isinstance(location, x509.UniformResourceIdentifier)
            and urlsplit(location.value).scheme in ("http", "https")
        ):
            return location.value
    return None


def _load_issuer(data: bytes, url: str) -> x509.Certificate:
    """A `caIssuers` answer: one certificate, DER (RFC 5280 4.2.2.1) or PEM."""
    try:
        if data.lstrip().startswith(BEGIN):
            return load_pem(data)
        return x509.load_der_x509_certificate(data)
    except (ValueError, CertificateRefused) as exc:
        raise CertificateRefused(f"issuer certificate at {url} does not parse: {exc}") from None


@dataclass
class CertificateStore:
    """Verified signing certificates by URL: from configured files, else fetched over https.

    Bounded: one fetch per URL at a time, at most `max_in_flight` URLs at once, successes
    cached for `cache_s` (never past the chain's expiry), failures for a while too.
    """

    http_get: HttpGet
    files: Mapping[str, bytes]
    cache_s: float
    anchors: TrustAnchors
    max_in_flight: int = MAX_FETCHES_IN_FLIGHT
    fetches: int = 0
    """Outbound GETs made (leaf and intermediates); for tests and the log."""
    _cache: OrderedDict[str, tuple[x509.Certificate, float]] = field(default_factory=OrderedDict)
    _failures: OrderedDict[str, tuple[Exception, float]] = field(default_factory=OrderedDict)
    _flights: dict[str, asyncio.Task[tuple[x509.Certificate, float]]] = field(default_factory=dict)

    async def get(self, url: str, now: float) -> x509.Certificate:
        """The verified certificate at `url`; CertificateRefused / CertificateUnavailable."""
        cached = self._cache.get(url)
        if cached is not None and now < cached[1]:
            return cached[0]
        failed = self._failures.get(url)
        if failed is not None and now < failed[1]:
            error = failed[0]
            raise type(error)(f"{error} (not fetched again before {failed[1] - now:.0f} s)")
        flight = self._flights.get(url)
        if flight is None:
            if len(self._flights) >= self.max_in_flight:
                raise CertificateUnavailable(
                    f"{len(self._flights)} certificate fetches in flight already"
                )
            flight = asyncio.ensure_future(self._load(url, now))
            self._flights[url] = flight
            flight.add_done_callback(lambda done: self._landed(url, now, done))
        certificate, _ = await asyncio.shield(flight)
        return certificate

    def _landed(
        self, url: str, now: float, done: asyncio.Task[tuple[x509.Certificate, float]]
    ) -> None:
        """Cache what a fetch ended with (runs once per fetch, whoever waits for it)."""
        self._flights.pop(url, None)
        if done.cancelled():
            return
        error = done.exception()
        if error is not None and not isinstance(error, Exception):
            return  # KeyboardInterrupt and the like: nothing to remember
        if error is None:
            self._cache[url] = done.result()
            self._cache.move_to_end(url)
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
            self._failures.pop(url, None)
            return
        retry = (
            UNAVAILABLE_RETRY_S if isinstance(error, CertificateUnavailable) else REFUSED_RETRY_S
        )
        self._failures[url] = (error, now + retry)
        self._failures.move_to_end(url)
        while len(self._failures) > FAILURE_ENTRIES:
            self._failures.popitem(last=False)

    async def _load(self, url: str, now: float) -> tuple[x509.Certificate, float]:
        intermediates: tuple[x509.Certificate, ...] = ()
        if url in self.files:
            data = self.files[url]
            if len(data) > 4 * MAX_CERTIFICATE_BYTES:
                raise CertificateRefused("signing certificate file is larger than 40 KB")
            leaf, intermediates = load_chain_file(data)
        else:
            leaf = load_pem(await self._fetch(url, "signing certificate"))
        check_certificate(leaf, now)  # before any intermediate is fetched for it
        found = await self._issuers(leaf, list(intermediates))
        chain = self.anchors.verify(leaf, found, now)
        expires = min(
            [now + self.cache_s] + [item.not_valid_after_utc.timestamp() for item in chain]
        )
        return leaf, expires

    async def _issuers(
        self, leaf: x509.Certificate, known: list[x509.Certificate]
    ) -> list[x509.Certificate]:
        """`known` plus the issuers fetched by `caIssuers` until one is a known subject."""
        current = leaf
        for _ in range(MAX_AIA_FETCHES):
            if current.issuer in self.anchors.subjects or current.issuer == current.subject:
                break
            if any(candidate.subject == current.issuer for candidate in known):
                break
            url = _ca_issuers_url(current)
            if url is None:
                break
            current = _load_issuer(await self._fetch(url, "issuer certificate"), url)
            known.append(current)
        return known

    async def _fetch(self, url: str, what: str) -> bytes:
        self.fetches += 1
        try:
            result = await self.http_get(url)
        except FETCH_ERRORS as exc:
            raise CertificateUnavailable(f"fetching {url}: {exc!r}") from None
        if result.status in (403, 404, 410):
            raise CertificateRefused(f"no {what} at {url} (HTTP {result.status})")
        if result.status != 200:
            raise CertificateUnavailable(f"fetching {url}: HTTP {result.status}")
        if len(result.body) > MAX_CERTIFICATE_BYTES:
            raise CertificateRefused(f"{what} at {url} is larger than 10 KB")
        return result.body


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


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """object_pairs_hook: a key given twice could be read differently by another parser."""
    result = dict(pairs)
    if len(result) != len(pairs):
        raise DuplicateKey
    return result


class DuplicateKey(ValueError):
    """An SNS message names one field twice."""


@dataclass
class SnsMessages:
    source: str
    topic_arns: frozenset[str]
    certificates: CertificateStore
    http_get: HttpGet
    confirm_subscriptions: bool
    max_message_age_s: float = 3600.0
    clock_skew_s: float = WebhookRouteConfig.SNS_CLOCK_SKEW_S
    methods: frozenset[str] = frozenset({"POST"})
    secret_headers: frozenset[str] = frozenset()
    read_headers: frozenset[str] = frozenset()
    """SNS signs inside the body; no header is read."""
    _topic_literals: tuple[bytes, ...] = field(init=False, repr=False)
    """Each allowed TopicArn as the JSON string SNS writes it."""

    def __post_init__(self) -> None:
        self._topic_literals = tuple(json.dumps(arn).encode() for arn in sorted(self.topic_arns))

    async def authenticate(self, request: RequestFacts) -> Verdict:
        checked = self._cheap_checks(request)
        if isinstance(checked, Verdict):
            return checked
        message, kind = checked
        url = str(message["SigningCertURL"])
        try:
            certificate = await self.certificates.get(url, request.now)
            check_certificate(certificate, request.now)
        except CertificateUnavailable as exc:
            return reject("certificate-unavailable", str(exc), 503)
        except CertificateRefused as exc:
            return reject("bad-certificate", str(exc))
        if not verify_signature(certificate, message):
            return reject("bad-signature", "SNS signature does not verify")
        if kind == NOTIFICATION:
            return publish()
        if kind == UNSUBSCRIBE:
            log.warning("SNS unsubscribed this endpoint from %r", message["TopicArn"])
            return respond("unsubscribe-confirmation", 200, {"ok": True})
        return await self._confirm(message)

    def _cheap_checks(self, request: RequestFacts) -> Verdict | tuple[dict[str, Any], str]:
        """Everything decided without I/O, in the order that refuses the cheapest first.

        The signature is inside the JSON, so the body must be parsed before it can be
        checked; but a body that names no `Signature` field or no allowed topic (as SNS
        writes them) is refused by a byte search first: a flood of large unsigned bodies costs
        a scan each, not a parse (about 50 ms for 1 MB of small objects)."""
        body = request.body
        if b'"Signature"' not in body:
            return reject("missing-signature", "body is not a signed SNS message")
        if not any(literal in body for literal in self._topic_literals):
            return reject("unknown-topic", "the body names no allowed TopicArn")
        try:
            message = json.loads(body, object_pairs_hook=_unique_keys)
        except DuplicateKey:
            return reject("unsigned-fields", "SNS message names a field twice")
        except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
            return reject("missing-signature", "body is not an SNS message (raw delivery?)")
        if not isinstance(message, dict) or "Signature" not in message:
            return reject("missing-signature", "body is not a signed SNS message")
        kind = message.get("Type")
        if not isinstance(kind, str) or kind not in ALLOWED_FIELDS:
            return reject("malformed", f"unknown SNS message Type {str(kind)[:64]!r}")
        extra = sorted(name for name in message if name not in ALLOWED_FIELDS[kind])
        if extra:
            shown = ", ".join(repr(name[:64]) for name in extra[:5])
            return reject(
                "unsigned-fields", f"SNS {kind} carries fields SNS does not send: {shown}"
            )
        topic = message.get("TopicArn")
        if not isinstance(topic, str) or topic not in self.topic_arns:
            return reject(
                "unknown-topic", f"TopicArn {str(message.get('TopicArn'))[:256]!r} not allowed"
            )
        published = sns_timestamp(message.get("Timestamp"))
        if published is None:
            return reject("malformed", "SNS Timestamp is missing or not an ISO 8601 UTC time")
        age = request.now - published
        if age > self.max_message_age_s:
            return reject("replayed", f"SNS message published {age:.0f} s ago")
        if -age > self.clock_skew_s:
            return reject("replayed", f"SNS message published {-age:.0f} s in the future")
        version = message.get("SignatureVersion")
        if str(version) not in HASHES:
            return reject(
                "wrong-algorithm", f"SignatureVersion {str(version)[:16]!r} is not 1 or 2"
            )
        signature = message.get("Signature")
        if string_to_sign(message) is None:
            return reject("malformed", f"SNS {kind} lacks a field SNS signs")
        try:
            if not isinstance(signature, str) or not base64.b64decode(signature, validate=True):
                raise ValueError("empty")
        except (binascii.Error, ValueError):
            return reject("bad-signature", "SNS Signature is not base64")
        url = message.get("SigningCertURL")
        if not sns_https_url(url, pem=True):
            return reject(
                "bad-certificate", f"SigningCertURL {str(url)[:256]!r} is not an SNS https .pem"
            )
        subscribe = message.get("SubscribeURL")
        if kind == SUBSCRIBE and self.confirm_subscriptions and not sns_https_url(subscribe, False):
            return reject("malformed", "SubscribeURL is not an SNS https URL")
        return message, kind

    async def _confirm(self, message: Mapping[str, Any]) -> Verdict:
        topic, url = message["TopicArn"], message.get("SubscribeURL")
        if not self.confirm_subscriptions:
            log.warning("SNS subscription to %r awaits confirmation: GET %r", topic, url)
            return respond("subscription-confirmation", 200, {"confirmed": False})
        try:
            result = await self.http_get(str(url))
        except FETCH_ERRORS as exc:
            return reject("confirmation-failed", f"GET SubscribeURL: {exc!r}", 503)
        if not 200 <= result.status < 300:
            return reject("confirmation-failed", f"GET SubscribeURL: HTTP {result.status}", 503)
        log.info("SNS subscription to %r confirmed", topic)
        return respond("subscription-confirmation", 200, {"confirmed": True})
