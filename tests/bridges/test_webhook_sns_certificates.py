"""The SNS route as an attacker meets it, without HTTP or Kafka: unsigned fields beside the
signed ones, replays, certificate hosts, chains that do not reach a trusted CA, and the
certificate fetches an unauthenticated sender can cause (issue 13, items 1 and 6).

Every certificate here is built by the test (root -> intermediate -> leaf, like Amazon's) and
every outbound GET is answered by a fake that counts them: nothing leaves the machine.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from support.webhook_signing import (
    AWS_CERT_PEM,
    AWS_INTERMEDIATE_PEM,
    FakeHttp,
    SnsChain,
    der,
    issue,
    new_rsa_key,
    pem,
    sns_chain,
    sns_message,
    write,
)

from connectors.webhook_auth import build_authenticator
from connectors.webhook_auth.base import (
    PUBLISH,
    REJECT,
    HttpResult,
    RequestFacts,
    Services,
    Verdict,
)
from connectors.webhook_auth.s3 import (
    MAX_FETCHES_IN_FLIGHT,
    REFUSED_RETRY_S,
    UNAVAILABLE_RETRY_S,
    SnsMessages,
    sns_https_url,
    system_trust_store,
)
from streams.config import ConfigError, Settings, WebhookRouteConfig

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC).timestamp()
TOPIC = "arn:aws:sns:eu-west-1:123456789012:uploads"
CERT_URL = "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-test.pem"
TENANT_A = json.dumps(
    {
        "Records": [
            {
                "eventSource": "aws:s3",
                "eventName": "ObjectCreated:Put",
                "eventTime": "2026-03-01T11:59:59.000Z",
                "s3": {
                    "bucket": {"name": "uploads"},
                    "object": {"key": "tenant-a/report.pdf", "sequencer": "0055AED6DCD90281E5"},
                },
            }
        ]
    }
)
FOREIGN_RECORDS = [
    {
        "eventSource": "aws:s3",
        "eventName": "ObjectRemoved:Delete",
        "eventTime": "2026-03-01T11:59:59.000Z",
        "s3": {"bucket": {"name": "uploads"}, "object": {"key": "tenant-b/payroll.xlsx"}},
    }
]


@dataclass
class SlowHttp:
    """Outbound GETs that wait until `release` is set; counts every URL asked for."""

    answers: dict[str, HttpResult]
    release: asyncio.Event = field(default_factory=asyncio.Event)
    asked: list[str] = field(default_factory=list)

    async def __call__(self, url: str) -> HttpResult:
        self.asked.append(url)
        await self.release.wait()
        return self.answers.get(url, HttpResult(404, b""))


def sns(route: Mapping[str, Any], http: Any = None) -> SnsMessages:
    config = WebhookRouteConfig.model_validate({"topic_arns": [TOPIC], **route})
    config.check_for("s3")
    built = build_authenticator("s3", config, {}, Services(http_get=http or FakeHttp()))
    assert built is not None
    authenticator = built[0]
    assert isinstance(authenticator, SnsMessages)
    return authenticator


def facts(body: bytes | Mapping[str, Any], now: float = NOW) -> RequestFacts:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return RequestFacts("POST", "http://127.0.0.1/hooks/s3", {}, {}, data, now)


def check(authenticator: SnsMessages, body: bytes | Mapping[str, Any], now: float = NOW) -> Verdict:
    return asyncio.run(authenticator.authenticate(facts(body, now)))


def refused(verdict: Verdict, reason: str, status: int = 401) -> bool:
    return verdict.outcome == REJECT and verdict.reason == reason and verdict.status == status


def trusting(tmp_path: Path, chain: SnsChain, **route: Any) -> dict[str, Any]:
    """A route whose only trust anchor is the chain's root."""
    return {"trusted_ca_file": str(write(tmp_path / "root.pem", pem(chain.root))), **route}


def served(chain: SnsChain, url: str = CERT_URL) -> dict[str, HttpResult]:
    """SNS serves the leaf alone; the CA serves the intermediate (DER) at its caIssuers URL."""
    return {
        url: HttpResult(200, pem(chain.certificate)),
        chain.intermediate_url: HttpResult(200, der(chain.intermediate)),
    }


def signed(chain: SnsChain, url: str = CERT_URL, **extra: Any) -> dict[str, str]:
    return sns_message(chain.key, url, TOPIC, message=TENANT_A, timestamp=NOW, **extra)


# ------------------------------------------------------------- item 1: only what was signed


def test_signed_envelope_with_records_beside_its_message_is_refused(tmp_path: Path) -> None:
    chain = sns_chain()
    http = FakeHttp(served(chain))
    route = sns(trusting(tmp_path, chain), http)
    genuine = signed(chain)
    assert check(route, genuine).outcome == PUBLISH
    fetched = list(http.asked)
    # The signature still verifies (Records is not signed): the field set refuses it.
    for extra in (
        {"Records": FOREIGN_RECORDS},
        {"Event": "s3:TestEvent"},
        {"records": FOREIGN_RECORDS},
        {"Token": "x"},  # a confirmation's field on a Notification
        {"SubscribeURL": "https://sns.eu-west-1.amazonaws.com/?Action=ConfirmSubscription"},
    ):
        verdict = check(route, {**genuine, **extra})
        assert refused(verdict, "unsigned-fields"), (extra, verdict)
        assert next(iter(extra)) in verdict.detail
    # A second copy of a signed field: one parser would read the first, another the last.
    doubled = json.dumps(genuine)[:-1] + ', "Message": ' + json.dumps(json.dumps({"Records": []}))
    assert refused(check(route, (doubled + "}").encode()), "unsigned-fields")
    assert http.asked == fetched  # none of them cost a fetch


def test_every_field_sns_documents_is_accepted(tmp_path: Path) -> None:
    chain = sns_chain()
    route = sns(trusting(tmp_path, chain), FakeHttp(served(chain)))
    attributes = {"origin": {"Type": "String", "Value": "s3"}}
    assert check(route, signed(chain, MessageAttributes=attributes)).outcome == PUBLISH
    assert check(route, signed(chain, subject=None)).outcome == PUBLISH


def test_confirmation_with_a_notification_field_is_refused(tmp_path: Path) -> None:
    chain = sns_chain()
    http = FakeHttp(served(chain))
    route = sns(trusting(tmp_path, chain), http)
    confirmation = sns_message(
        chain.key, CERT_URL, TOPIC, kind="SubscriptionConfirmation", timestamp=NOW
    )
    assert refused(check(route, {**confirmation, "Subject": "x"}), "unsigned-fields")
    assert refused(check(route, {**confirmation, "Records": FOREIGN_RECORDS}), "unsigned-fields")
    assert http.asked == []


@pytest.mark.parametrize(
    ("published", "accepted"),
    [
        (NOW - 3599, True),
        (NOW - 3601, False),  # older than max_message_age_s (1 h)
        (NOW - 5 * 365 * 86400, False),
        (NOW + 299, True),  # within the 5 minutes of clock skew
        (NOW + 301, False),
        (NOW + 5 * 365 * 86400, False),
    ],
)
def test_timestamp_outside_the_window_is_replayed(
    tmp_path: Path, published: float, accepted: bool
) -> None:
    chain = sns_chain()
    http = FakeHttp(served(chain))
    route = sns(trusting(tmp_path, chain), http)
    message = sns_message(chain.key, CERT_URL, TOPIC, message=TENANT_A, timestamp=published)
    verdict = check(route, message)
    if accepted:
        assert verdict.outcome == PUBLISH
    else:
        assert refused(verdict, "replayed")
        assert http.asked == []  # refused before the certificate is looked up


def test_max_message_age_is_configurable(tmp_path: Path) -> None:
    chain = sns_chain()
    route = sns(trusting(tmp_path, chain, max_message_age_s="10m"), FakeHttp(served(chain)))
    assert refused(check(route, signed(chain), now=NOW + 601), "replayed")
    assert check(route, signed(chain), now=NOW + 599).outcome == PUBLISH


@pytest.mark.parametrize("timestamp", ["", "yesterday", "2026-13-01T00:00:00.000Z", 1772366400])
def test_a_timestamp_that_is_no_time_is_malformed(tmp_path: Path, timestamp: Any) -> None:
    chain = sns_chain()
    http = FakeHttp(served(chain))
    route = sns(trusting(tmp_path, chain), http)
    assert refused(check(route, {**signed(chain), "Timestamp": timestamp}), "malformed")
    assert http.asked == []


def test_max_message_age_longer_than_a_dedupe_ttl_is_a_config_error() -> None:
    def settings(age: str, ttl: str) -> Settings:
        return Settings.model_validate(
            {
                "webhook": {"routes": {"s3": {"topic_arns": [TOPIC], "max_message_age_s": age}}},
                "instances": [{"name": "long"}, {"name": "short", "dedupe_ttl": ttl}],
            }
        )

    assert settings("1h", "65m").webhook.routes["s3"].max_message_age_s == 3600
    with pytest.raises(ValueError, match=r"webhook\.routes\.s3\.max_message_age_s.*'short'"):
        settings("1h", "64m")  # 1 h + 5 min of skew > 64 min
    # Only an SNS route that is on needs it: an instance may dedupe briefly otherwise.
    Settings.model_validate({"instances": [{"name": "brief", "dedupe_ttl": "1m"}]})


def test_max_message_age_error_names_the_field_from_a_file(tmp_path: Path) -> None:
    from streams.config import load_settings

    config = tmp_path / "streams.toml"
    config.write_text(
        '[webhook.routes.s3]\ntopic_arns = ["arn:aws:sns:eu-west-1:123456789012:uploads"]\n'
        '[[instances]]\nname = "a"\ndedupe_ttl = "30m"\n'
    )
    with pytest.raises(ConfigError, match=r"webhook\.routes\.s3\.max_message_age_s"):
        load_settings(config, {})


# ------------------------------------------------------------------ item 6: the host


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("sns.us-east-1.amazonaws.com", True),
        ("sns.eu-west-1.amazonaws.com", True),
        ("sns.ap-southeast-2.amazonaws.com", True),
        ("sns.us-gov-west-1.amazonaws.com", True),
        ("sns.cn-north-1.amazonaws.com.cn", True),
        ("sns.cn-northwest-1.amazonaws.com.cn", True),
        ("SNS.US-EAST-1.AMAZONAWS.COM", True),  # host names are case-insensitive
        ("sns.s3.amazonaws.com", False),  # the S3 bucket named `sns`
        ("sns.s3-accelerate.amazonaws.com", False),  # passes the SDKs' {3,} pattern
        ("sns.s3-us-west-2.amazonaws.com", False),  # likewise (legacy S3 regional endpoint)
        ("sns.s3.us-east-1.amazonaws.com", False),
        ("sns.amazonaws.com", False),
        ("sns.us-east-1.amazonaws.com.evil.io", False),
        ("evil.sns.us-east-1.amazonaws.com", False),
        ("sns.us-east-1.amazonaws.co", False),
    ],
)
def test_certificate_host_needs_a_region(host: str, ok: bool) -> None:
    assert sns_https_url(f"https://{host}/SimpleNotificationService-x.pem", pem=True) is ok


def test_a_certificate_on_an_s3_bucket_host_is_never_fetched(tmp_path: Path) -> None:
    chain = sns_chain()
    http = FakeHttp(served(chain, "https://sns.s3.amazonaws.com/cert.pem"))
    route = sns(trusting(tmp_path, chain), http)
    message = signed(chain, "https://sns.s3.amazonaws.com/cert.pem")
    assert refused(check(route, message), "bad-certificate")
    assert http.asked == []
    with pytest.raises(ValueError, match="Amazon SNS host"):
        WebhookRouteConfig.model_validate(
            {"certificate_files": {"https://sns.s3.amazonaws.com/c.pem": "/tmp/c.pem"}}
        )


# ------------------------------------------------------------------ item 6: the chain


def test_default_trust_store_refuses_a_self_signed_sns_certificate() -> None:
    key = new_rsa_key()
    self_signed = issue(key, "sns.amazonaws.com", key)
    http = FakeHttp({CERT_URL: HttpResult(200, pem(self_signed))})
    route = sns({}, http)  # no trusted_ca_file: the system trust store
    verdict = check(route, sns_message(key, CERT_URL, TOPIC, message=TENANT_A, timestamp=NOW))
    assert refused(verdict, "bad-certificate")
    assert "system trust store" in verdict.detail


def test_default_trust_store_refuses_a_private_ca_chain() -> None:
    chain = sns_chain()
    http = FakeHttp(served(chain))
    route = sns({}, http)
    verdict = check(route, signed(chain))
    assert refused(verdict, "bad-certificate")
    assert http.asked == [CERT_URL, chain.intermediate_url]  # it did try to build the chain


def test_sns_vector_chain_reaches_the_system_store() -> None:
    """The Amazon intermediate the tests ship is authentic: the system's Amazon root signed
    it, and it signed the certificate of the messages SNS signed (AWS_CERT_PEM)."""
    _, roots = system_trust_store()
    intermediate = x509.load_pem_x509_certificate(AWS_INTERMEDIATE_PEM)
    leaf = x509.load_pem_x509_certificate(AWS_CERT_PEM)
    root = next(root for root in roots if root.subject == intermediate.issuer)
    intermediate.verify_directly_issued_by(root)
    leaf.verify_directly_issued_by(intermediate)


def test_chain_to_a_configured_root_through_a_fetched_intermediate(tmp_path: Path) -> None:
    chain = sns_chain()
    http = FakeHttp(served(chain))
    route = sns(trusting(tmp_path, chain), http)
    assert check(route, signed(chain)).outcome == PUBLISH
    assert check(route, signed(chain)).outcome == PUBLISH
    assert http.asked == [CERT_URL, chain.intermediate_url]  # both once, then cached


def test_chain_from_a_configured_file_needs_no_fetch(tmp_path: Path) -> None:
    chain = sns_chain()
    bundle = write(tmp_path / "leaf.pem", pem(chain.certificate) + pem(chain.intermediate))
    http = FakeHttp()
    route = sns(trusting(tmp_path, chain, certificate_files={CERT_URL: str(bundle)}), http)
    assert check(route, signed(chain)).outcome == PUBLISH
    assert http.asked == []


def test_intermediate_of_another_ca_does_not_make_a_chain(tmp_path: Path) -> None:
    chain, stranger = sns_chain(), sns_chain()
    # The leaf's caIssuers URL serves a CA certificate of the same name from another root.
    forged = issue(
        stranger.intermediate_key,
        chain.intermediate.subject.rfc4514_string().removeprefix("CN="),
        stranger.intermediate_key,
        ca=True,
    )
    answers = {**served(chain), chain.intermediate_url: HttpResult(200, der(forged))}
    route = sns(trusting(tmp_path, chain), FakeHttp(answers))
    assert refused(check(route, signed(chain)), "bad-certificate")


def test_expired_leaf_is_refused(tmp_path: Path) -> None:
    chain = sns_chain()
    expired = issue(
        chain.key,
        "sns.amazonaws.com",
        chain.intermediate_key,
        issuer=chain.intermediate.subject,
        not_after=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        ca_issuers=chain.intermediate_url,
    )
    http = FakeHttp({**served(chain), CERT_URL: HttpResult(200, pem(expired))})
    route = sns(trusting(tmp_path, chain), http)
    assert refused(check(route, signed(chain)), "bad-certificate")
    assert http.asked == [CERT_URL]  # the leaf alone refuses it: no intermediate fetched


def test_a_leaf_not_named_for_sns_fetches_no_intermediate(tmp_path: Path) -> None:
    chain = sns_chain(common_name="www.example.com")
    http = FakeHttp(served(chain))
    route = sns(trusting(tmp_path, chain), http)
    assert refused(check(route, signed(chain)), "bad-certificate")
    assert http.asked == [CERT_URL]


# ---------------------------------------------------------------- item 6: bounded fetches


def test_unsigned_and_malformed_messages_never_fetch(tmp_path: Path) -> None:
    chain = sns_chain()
    http = FakeHttp()
    route = sns(trusting(tmp_path, chain), http)
    genuine = signed(chain)
    verdicts = []
    for index in range(200):
        url = f"https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-{index}.pem"
        unsigned = {k: v for k, v in genuine.items() if k != "Signature"}
        variants = [
            {**unsigned, "SigningCertURL": url},
            {**genuine, "SigningCertURL": url, "Records": FOREIGN_RECORDS},
            {**genuine, "SigningCertURL": url, "Timestamp": "2019-01-01T00:00:00.000Z"},
            {**genuine, "SigningCertURL": url, "TopicArn": TOPIC + "-other"},
            {**genuine, "SigningCertURL": url, "Signature": "not base64!"},
            {**genuine, "SigningCertURL": url, "SignatureVersion": "3"},
            {**genuine, "SigningCertURL": url, "MessageId": 7},
        ]
        verdicts += [check(route, variant) for variant in variants]
    assert all(verdict.outcome == REJECT and verdict.status == 401 for verdict in verdicts)
    assert http.asked == []


def test_large_bodies_without_a_signature_or_an_allowed_topic_are_never_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flood of 1 MB unsigned bodies costs the bridge a byte search each, not a JSON parse
    (the parse runs Python per object: ~50 ms for 1 MB of small objects)."""
    import connectors.webhook_auth.s3 as s3_auth

    chain = sns_chain()
    route = sns(trusting(tmp_path, chain), FakeHttp())
    parsed: list[int] = []
    real_loads = s3_auth.json.loads

    def counting_loads(text: Any, **kwargs: Any) -> Any:
        parsed.append(len(text))
        return real_loads(text, **kwargs)

    monkeypatch.setattr(s3_auth.json, "loads", counting_loads)
    objects = ("[" + ",".join(['{"a":1}'] * 120_000) + "]").encode()
    named = json.dumps({"Type": "Notification", "Signature": "x", "TopicArn": "arn:other", "P": 1})
    padded = named.encode()[:-1] + b',"Pad":' + objects + b"}"
    assert refused(check(route, objects), "missing-signature")
    assert refused(check(route, padded), "unknown-topic")
    assert parsed == []
    check(route, signed(chain))  # a message naming both is parsed (then checked further)
    assert len(parsed) == 1


def test_concurrent_messages_naming_one_url_share_one_fetch(tmp_path: Path) -> None:
    chain = sns_chain()

    async def go() -> tuple[list[Verdict], list[str]]:
        http = SlowHttp(served(chain))
        route = sns(trusting(tmp_path, chain), http)
        pending = [
            asyncio.ensure_future(route.authenticate(facts(signed(chain)))) for _ in range(50)
        ]
        while not http.asked:  # the first fetch started; the other 49 arrive while it runs
            await asyncio.sleep(0)
        await asyncio.sleep(0.01)
        http.release.set()
        return list(await asyncio.gather(*pending)), http.asked

    verdicts, asked = asyncio.run(go())
    assert [verdict.outcome for verdict in verdicts] == [PUBLISH] * 50
    assert asked == [CERT_URL, chain.intermediate_url]


def test_a_url_that_failed_is_not_fetched_for_every_message(tmp_path: Path) -> None:
    chain = sns_chain()
    http = FakeHttp({CERT_URL: HttpResult(500, b"")})
    route = sns(trusting(tmp_path, chain), http)
    for offset in range(20):
        verdict = check(route, signed(chain), now=NOW + offset * 0.1)
        assert refused(verdict, "certificate-unavailable", 503)
    assert http.asked == [CERT_URL]
    # After UNAVAILABLE_RETRY_S it is tried again (SNS retries 20 s apart by default).
    http.answers.update(served(chain))
    later = NOW + UNAVAILABLE_RETRY_S + 1
    assert check(route, signed(chain), now=later).outcome == PUBLISH
    assert http.asked == [CERT_URL, CERT_URL, chain.intermediate_url]


def test_a_refused_certificate_is_remembered_longer(tmp_path: Path) -> None:
    chain = sns_chain()
    http = FakeHttp({CERT_URL: HttpResult(404, b"")})
    route = sns(trusting(tmp_path, chain), http)
    for offset in (0, UNAVAILABLE_RETRY_S + 1, REFUSED_RETRY_S - 1):
        assert refused(check(route, signed(chain), now=NOW + offset), "bad-certificate")
    assert http.asked == [CERT_URL]
    http.answers.update(served(chain))
    assert check(route, signed(chain), now=NOW + REFUSED_RETRY_S + 1).outcome == PUBLISH


def test_fetches_in_flight_are_capped(tmp_path: Path) -> None:
    chain = sns_chain()
    urls = [
        f"https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-{index}.pem"
        for index in range(MAX_FETCHES_IN_FLIGHT + 5)
    ]

    async def go() -> tuple[list[Verdict], list[str]]:
        answers: dict[str, HttpResult] = {}
        for url in urls:
            answers.update(served(chain, url))
        http = SlowHttp(answers)
        route = sns(trusting(tmp_path, chain), http)
        pending = [
            asyncio.ensure_future(route.authenticate(facts(signed(chain, url)))) for url in urls
        ]
        while len(http.asked) < MAX_FETCHES_IN_FLIGHT:
            await asyncio.sleep(0)
        await asyncio.sleep(0.01)
        asked_while_full = list(http.asked)
        http.release.set()
        verdicts = list(await asyncio.gather(*pending))
        assert asked_while_full == urls[:MAX_FETCHES_IN_FLIGHT]
        return verdicts, http.asked

    verdicts, _ = asyncio.run(go())
    first = verdicts[:MAX_FETCHES_IN_FLIGHT]
    assert [verdict.outcome for verdict in first] == [PUBLISH] * MAX_FETCHES_IN_FLIGHT
    # Beyond the cap: 503, so SNS delivers them again; nothing was fetched for them.
    assert all(
        refused(verdict, "certificate-unavailable", 503)
        for verdict in verdicts[MAX_FETCHES_IN_FLIGHT:]
    )


def test_signature_of_the_wrong_length_is_refused_after_the_fetch(tmp_path: Path) -> None:
    # Well-formed but forged: this one does cost a fetch, once per URL (then cached).
    chain = sns_chain()
    http = FakeHttp(served(chain))
    route = sns(trusting(tmp_path, chain), http)
    forged = {**signed(chain), "Signature": base64.b64encode(b"\0" * 256).decode()}
    for _ in range(5):
        assert refused(check(route, forged), "bad-signature")
    assert http.asked == [CERT_URL, chain.intermediate_url]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"Type": ["Notification"]}, "malformed"),
        ({"Type": {"a": 1}}, "malformed"),
        ({"TopicArn": [TOPIC]}, "unknown-topic"),
        ({"TopicArn": {"arn": TOPIC}}, "unknown-topic"),
        ({"SignatureVersion": ["2"]}, "wrong-algorithm"),
        ({"SigningCertURL": {"url": CERT_URL}}, "bad-certificate"),
        ({"Signature": ["c2ln"]}, "bad-signature"),
    ],
)
def test_fields_of_the_wrong_type_are_refused_not_crashed_on(
    tmp_path: Path, change: dict[str, Any], reason: str
) -> None:
    chain = sns_chain()
    http = FakeHttp(served(chain))
    route = sns(trusting(tmp_path, chain), http)
    assert refused(check(route, {**signed(chain), **change}), reason)
    assert http.asked == []
