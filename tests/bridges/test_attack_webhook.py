"""The webhook bridge attacked as it is served (`start_bridge`: the public port with its
connection cap and aiohttp bounds, the redacting access log, the admin port), against the real
broker, each on a fresh raw topic.

Each test is an attack: the requests, what the bridge answers, what reaches the raw topic
(nothing, for every refused request), and a control delivery afterwards that is answered 202
and is on the topic. Conditions are awaited, never slept for.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import ClientSession
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from support.kafka_io import read_topic
from support.webhook_signing import (
    appwrite_signature,
    b2_signature,
    box_signature,
    box_timestamp,
    cloudinary_signature,
    settings_for,
    unique_topic,
)

from connectors.publisher import RAW_RECORD_MAX_BYTES, RawPublisher, RecordTooLarge
from connectors.webhook import BUDGET_KEY, READY_KEY, RunningBridge, start_bridge
from connectors.webhook_auth import build_authenticator
from connectors.webhook_auth.base import RequestFacts, Services
from streams.config import ConfigError, Settings, WebhookRouteConfig, load_settings
from streams.engine.topics import RAW_TOPIC_CONFIG

pytestmark = pytest.mark.kafka

B2_SECRET = "b2-signing-secret-0123"
MINIO_TOKEN = "minio-token-0123456789"
MiB = 1024 * 1024


@asynccontextmanager
async def bridge(
    bootstrap: str,
    topic: str,
    webhook: Mapping[str, Any],
    environ: Mapping[str, str],
    services: Services | None = None,
) -> AsyncIterator[RunningBridge]:
    """The bridge as `python -m connectors webhook` serves it, on free ports, connected."""
    settings = settings_for(bootstrap, topic, webhook, publish_timeout_s=10.0)
    publisher = RawPublisher(bootstrap, topic, 10.0)
    running = await start_bridge(settings, publisher, environ, services, port=0, admin_port=0)
    try:
        await asyncio.wait_for(running.runners[0].app[READY_KEY].wait(), 30)
        yield running
    finally:
        await running.stop()


async def post(
    port: int, path: str, body: bytes, headers: Mapping[str, str] | None = None
) -> tuple[int, dict[str, str]]:
    async with (
        ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{port}{path}", data=body, headers=dict(headers or {})
        ) as response,
    ):
        await response.read()
        return response.status, dict(response.headers)


def b2_headers(body: bytes) -> dict[str, str]:
    return {"X-Bz-Event-Notification-Signature": b2_signature(B2_SECRET, body)}


def b2_event(n: int) -> bytes:
    event = {"eventId": f"control-{n}", "eventType": "b2:ObjectCreated"}
    return json.dumps({"events": [event]}).encode()


def request_head(path: str, headers: Mapping[str, str], content_length: int | None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if content_length is None:
        lines.append("Transfer-Encoding: chunked")
    else:
        lines.append(f"Content-Length: {content_length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@dataclass
class Stalled:
    """A raw connection that sent what it was given and then sends nothing more."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    @classmethod
    async def open(cls, port: int, data: bytes) -> Stalled:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)
        await writer.drain()
        return cls(reader, writer)

    async def status(self, timeout_s: float = 30) -> tuple[int, bytes]:
        """The status and head of the bridge's answer (0, b"" when it closed without one)."""
        try:
            head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), timeout_s)
        except asyncio.IncompleteReadError as exc:
            return 0, exc.partial
        return int(head.split(b" ", 2)[1]), head

    async def closed(self, timeout_s: float = 30) -> bytes:
        """Wait until the bridge closed the connection; what it sent until then."""
        return await asyncio.wait_for(self.reader.read(-1), timeout_s)

    def close(self) -> None:
        self.writer.close()


async def first_done(futures: Sequence[asyncio.Future[Any]], n: int) -> list[Any]:
    """The results of the first `n` of `futures` to finish, in the order they finished."""
    done: list[Any] = []
    pending = set(futures)
    while len(done) < n:
        finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        done += [future.result() for future in finished]
    return done[:n]


async def create_raw_topic(bootstrap: str, topic: str) -> None:
    """A raw topic as the stream creates it (its record limit, not the broker's 1 MiB)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1, topic_configs=RAW_TOPIC_CONFIG)])
    finally:
        await admin.close()


# ------------------------------------------------------------------ item 7: held bodies


def test_stalled_bodies_are_bounded_refused_then_timed_out_while_a_delivery_gets_202(
    kafka_bootstrap: str,
) -> None:
    """20 connections announce 1 MiB, send all of it but one byte and stall; 2 more stream
    512 KiB chunked and stall. The bodies held stay within `max_bodies_bytes` (8 MiB): those
    that do not fit get 503 with Retry-After at once, the held ones 408 after `body_timeout_s`,
    and all are closed. A signed delivery sent meanwhile is answered 202 while the held ones
    still wait; nothing of the attackers is published."""
    topic = unique_topic("b2")
    webhook = {
        "max_body_bytes": MiB,
        "max_bodies_bytes": 8 * MiB,
        "body_timeout_s": 5.0,
        "routes": {"b2": {"secret_env": "B2_SECRET"}},
    }
    forged = {"X-Bz-Event-Notification-Signature": "v1=" + "0" * 64}  # passes the head check

    async def attack() -> dict[str, Any]:
        async with bridge(kafka_bootstrap, topic, webhook, {"B2_SECRET": B2_SECRET}) as running:
            budget = running.runners[0].app[BUDGET_KEY]
            head = request_head("/hooks/b2", forged, MiB)
            stalled = [await Stalled.open(running.port, head + b"x" * (MiB - 1)) for _ in range(20)]
            chunk = b"x" * (256 * 1024)
            framed = (f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n") * 2
            chunked_head = request_head("/hooks/b2", forged, None)
            stalled += [await Stalled.open(running.port, chunked_head + framed) for _ in range(2)]
            answers = [asyncio.ensure_future(one.status()) for one in stalled]
            # The 12 announced bodies that cannot fit are refused from their head.
            early = await first_done(answers, 12)
            held_at_peak = budget.held
            body = b2_event(1)
            started = time.monotonic()
            during = await post(running.port, "/hooks/b2", body, b2_headers(body))
            legit_ms = (time.monotonic() - started) * 1000
            still_waiting = sum(not answer.done() for answer in answers)
            statuses = await asyncio.gather(*answers)
            closed = await asyncio.gather(*(one.closed() for one in stalled))
            for one in stalled:
                one.close()
            control = b2_event(2)
            after = await post(running.port, "/hooks/b2", control, b2_headers(control))
            return {
                "early": sorted(status for status, _ in early),
                "held_at_peak": held_at_peak,
                "limit": budget.limit,
                "during": during[0],
                "legit_ms": legit_ms,
                "still_waiting": still_waiting,
                "statuses": [status for status, _ in statuses],
                "heads": [head for _, head in statuses],
                "closed": closed,
                "after": after[0],
                "held_after": budget.held,
            }

    got = asyncio.run(attack())
    records = asyncio.run(read_topic(kafka_bootstrap, topic))
    print(f"\nlegit delivery during the attack answered in {got['legit_ms']:.0f} ms")
    assert got["early"] == [503] * 12
    assert 7 * MiB < got["held_at_peak"] <= got["limit"]
    assert got["during"] == 202
    assert got["still_waiting"] >= 8  # answered while the 8 held bodies waited for their 408
    statuses = got["statuses"]
    assert statuses[:20].count(408) == 8 and statuses[:20].count(503) == 12
    assert set(statuses[20:]) <= {408, 503}
    for status, head in zip(statuses, got["heads"], strict=True):
        assert status != 503 or b"Retry-After: 5" in head
    assert all(rest == b"" or rest.endswith(b"\n") for rest in got["closed"])  # closed by it
    assert got["after"] == 202
    assert got["held_after"] == 0
    assert sorted(record.value or b"" for record in records) == [b2_event(1), b2_event(2)]


def test_slow_headers_are_closed_and_connections_over_the_cap_get_503(
    kafka_bootstrap: str,
) -> None:
    """5 connections (the cap) dribble an unfinished request head: a 6th connection is
    answered 503 and closed at once, the 5 are closed without an answer after
    `idle_timeout_s` (aiohttp's default: 75 s); then a delivery gets 202."""
    topic = unique_topic("minio")
    webhook = {
        "max_connections": 5,
        "idle_timeout_s": 1.5,
        "routes": {"minio": {"secret_env": "MINIO_TOKEN"}},
    }
    partial = b"POST /hooks/minio HTTP/1.1\r\nHost: x\r\nX-Slow: "

    async def attack() -> dict[str, Any]:
        environ = {"MINIO_TOKEN": MINIO_TOKEN}
        async with bridge(kafka_bootstrap, topic, webhook, environ) as running:
            started = time.monotonic()
            slow = [await Stalled.open(running.port, partial) for _ in range(5)]
            extra = await Stalled.open(running.port, partial)
            over_cap = await extra.status(10)
            answered = await asyncio.gather(*(one.status(30) for one in slow))
            seconds = time.monotonic() - started
            for one in [*slow, extra]:
                one.close()
            body = b'{"EventName":"s3:ObjectCreated:Put","Key":"uploads/a","Records":[]}'
            authorization = {"Authorization": f"Bearer {MINIO_TOKEN}"}
            after = await post(running.port, "/hooks/minio", body, authorization)
            return {"over": over_cap, "answered": answered, "after": after[0], "secs": seconds}

    got = asyncio.run(attack())
    records = asyncio.run(read_topic(kafka_bootstrap, topic))
    print(f"\nslow-header connections closed after {got['secs']:.1f} s")
    assert got["over"][0] == 503
    assert b"Retry-After: 1" in got["over"][1]
    assert got["answered"] == [(0, b"")] * 5  # closed, no answer: the head never completed
    assert got["secs"] < 30
    assert got["after"] == 202
    assert len(records) == 1


ROUTES = {
    "minio": {"secret_env": "SECRET"},
    "supabase": {"secret_env": "SECRET", "secret_header": "X-Webhook-Secret"},
    "eventbridge": {"secret_env": "SECRET", "secret_header": "X-Api-Key"},
    "gcs": {"secret_env": "SECRET"},
    "azure": {"secret_env": "SECRET"},
    "b2": {"secret_env": "SECRET"},
    "box": {"secret_env": "SECRET"},
    "cloudinary": {"secret_env": "SECRET"},
    "appwrite": {"secret_env": "SECRET", "url": "https://hooks.example.com/hooks/appwrite"},
}
WRONG = {
    "minio": ("", {"Authorization": "Bearer wrong"}),
    "supabase": ("", {"X-Webhook-Secret": "wrong"}),
    "eventbridge": ("", {"X-Api-Key": "wrong"}),
    "gcs": ("?token=wrong", {}),
    "azure": ("?code=wrong", {"aeg-event-type": "SubscriptionValidation"}),
    "b2": ("", {}),
    "box": ("", {"BOX-DELIVERY-TIMESTAMP": "2000-01-01T00:00:00Z", "BOX-SIGNATURE-PRIMARY": "x"}),
    "cloudinary": ("", {"X-Cld-Timestamp": "1", "X-Cld-Signature": "0" * 40}),
    "appwrite": ("", {}),
}


@pytest.mark.parametrize("source", sorted(ROUTES))
def test_a_request_without_a_valid_secret_is_refused_before_its_body_is_read(
    kafka_bootstrap: str, source: str
) -> None:
    """The head says 1 MiB is coming and no byte of it is ever sent: the route answers 401
    from the head alone (credential in a header or the query; for HMAC routes the signature
    header missing, or a signed timestamp outside the window), so no body is read, held or
    parsed. Nothing is published."""
    topic = unique_topic(source)
    webhook = {"max_body_bytes": MiB, "routes": {source: ROUTES[source]}}
    query, headers = WRONG[source]

    async def attack() -> tuple[int, int]:
        async with bridge(kafka_bootstrap, topic, webhook, {"SECRET": "right-secret"}) as running:
            head = request_head(f"/hooks/{source}{query}", headers, MiB)
            attacker = await Stalled.open(running.port, head)
            status, _ = await attacker.status(15)
            attacker.close()
            return status, running.runners[0].app[BUDGET_KEY].held

    status, held = asyncio.run(attack())
    assert status == 401
    assert held == 0
    assert asyncio.run(read_topic(kafka_bootstrap, topic)) == []


# ------------------------------------------------------------------ item 8: secrets in logs


def test_query_secrets_never_reach_the_log(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Azure's `?code=`, a GCS `?token=` and a configured `secret_query_param`, right and
    wrong, are in no log line; the access log still logs each request (names only)."""
    topic = unique_topic("logs")
    azure_secret, gcs_secret = "azure-SECRET-value-1", "gcs-SECRET-value-2"
    webhook = {
        "routes": {
            "azure": {"secret_env": "AZ", "secret_query_param": "sig"},
            "gcs": {"secret_env": "GCS"},
        }
    }
    event = json.dumps(
        [{"id": "1", "eventType": "Microsoft.Storage.BlobCreated", "subject": "/x", "data": {}}]
    ).encode()
    wrong = "WRONG-guess-secret-3"

    async def run() -> list[int]:
        async with bridge(
            kafka_bootstrap, topic, webhook, {"AZ": azure_secret, "GCS": gcs_secret}
        ) as running:
            statuses = []
            for path in [
                f"/hooks/azure?sig={azure_secret}",
                f"/hooks/azure?sig={wrong}&code={azure_secret}",
                f"/hooks/gcs?token={gcs_secret}",
                f"/hooks/gcs?token={wrong}",
                f"/hooks/nowhere?token={gcs_secret}",
            ]:
                statuses.append((await post(running.port, path, event))[0])
            return statuses

    with caplog.at_level(logging.DEBUG):
        statuses = asyncio.run(run())
    assert statuses == [202, 401, 202, 401, 404]
    access = [record.getMessage() for record in caplog.records if record.name == "aiohttp.access"]
    assert len(access) == 5
    assert any('"POST /hooks/azure?sig=***"' in line for line in access)
    for secret in (azure_secret, gcs_secret, wrong):
        assert secret not in caplog.text
    assert len(asyncio.run(read_topic(kafka_bootstrap, topic))) == 2


# ------------------------------------------------------------------ item 9: blank secrets


def test_blank_secrets_keep_routes_off_and_empty_credentials_never_match(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A secret variable that is empty or whitespace is no secret: the route answers 404 and
    the start-up log names the variable; a blank Box secondary key is ignored (a delivery
    signed with the blank key is refused). With a real token, `Bearer` with no token is 401."""
    topic = unique_topic("blank")
    names = {
        "minio": "MINIO_T",
        "supabase": "SUPA_T",
        "eventbridge": "EB_T",
        "gcs": "GCS_T",
        "azure": "AZ_T",
        "b2": "B2_T",
        "cloudinary": "CLD_T",
        "appwrite": "AW_T",
    }
    routes: dict[str, Any] = {
        source: {**ROUTES[source], "secret_env": names[source]} for source in names
    }
    routes["box"] = {"secret_env": "BOX_P", "secondary_secret_env": "BOX_S"}
    blanks = ["", " ", "\t", "\n", "  \r\n "]
    environ = {name: blanks[n % len(blanks)] for n, name in enumerate(names.values())}
    environ |= {"BOX_P": "box-primary-key", "BOX_S": " "}
    now = 1_800_000_000.0
    body = b'{"trigger":"FILE.UPLOADED","source":{"id":"1","type":"file"}}'
    stamp = box_timestamp(now)
    box_forged = {
        "BOX-DELIVERY-TIMESTAMP": stamp,
        "BOX-SIGNATURE-SECONDARY": box_signature(" ", body, stamp),
        "BOX-SIGNATURE-VERSION": "1",
        "BOX-SIGNATURE-ALGORITHM": "HmacSHA256",
    }
    box_signed = {
        **box_forged,
        "BOX-SIGNATURE-PRIMARY": box_signature("box-primary-key", body, stamp),
    }
    del box_signed["BOX-SIGNATURE-SECONDARY"]

    async def run() -> dict[str, Any]:
        async with bridge(
            kafka_bootstrap, topic, {"routes": routes}, environ, Services(clock=lambda: now)
        ) as running:
            off = {}
            for source in names:
                off[source] = (
                    await post(running.port, f"/hooks/{source}", body, {"Authorization": "Bearer "})
                )[0]
            forged = (await post(running.port, "/hooks/box", body, box_forged))[0]
            signed = (await post(running.port, "/hooks/box", body, box_signed))[0]
            return {"off": off, "forged": forged, "signed": signed}

    with caplog.at_level(logging.WARNING):
        got = asyncio.run(run())
    assert got["off"] == {source: 404 for source in names}
    for variable in [*names.values(), "BOX_S"]:
        assert f"environment variable {variable} " in caplog.text
    assert got["forged"] == 401
    assert got["signed"] == 202
    assert [record.value for record in asyncio.run(read_topic(kafka_bootstrap, topic))] == [body]

    # The same route with a real token: a blank or missing token is never it.
    topic = unique_topic("minio")

    async def minio() -> list[int]:
        async with bridge(
            kafka_bootstrap, topic, {"routes": {"minio": ROUTES["minio"]}}, {"SECRET": "t0k"}
        ) as running:
            statuses = []
            for authorization in ["Bearer ", "Bearer", "Bearer  \t", " ", "Bearer t0k"]:
                statuses.append(
                    (
                        await post(
                            running.port, "/hooks/minio", b"{}", {"Authorization": authorization}
                        )
                    )[0]
                )
            return statuses

    assert asyncio.run(minio()) == [401, 401, 401, 401, 202]
    assert len(asyncio.run(read_topic(kafka_bootstrap, topic))) == 1


# ------------------------------------------------------------------ item 11


def test_absurd_signed_timestamps_are_refused_with_one_line_and_no_traceback(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic = unique_topic("timestamps")
    now = 1_800_000_000.0
    routes = {
        "cloudinary": {"secret_env": "CLD"},
        "box": {"secret_env": "BOX"},
    }
    body = b'{"notification_type":"upload","public_id":"a"}'
    cloudinary = [
        "9" * 5000,
        "1" + "0" * 20,
        "\u0661\u0668\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660",  # Arabic-Indic digits
        "-1800000000",
        "1.8e9",
    ]
    box = [
        "2" * 5000,
        "9999-12-31T23:59:59-23:59",
        "0001-01-01T00:00:00+23:59",
        "2027-01-15T08:00:00",  # no offset
    ]

    def cld(timestamp: str) -> dict[str, str]:
        return {
            "X-Cld-Timestamp": timestamp,
            "X-Cld-Signature": cloudinary_signature(body, timestamp, "cld-secret"),
        }

    def boxed(timestamp: str) -> dict[str, str]:
        return {
            "BOX-DELIVERY-TIMESTAMP": timestamp,
            "BOX-SIGNATURE-PRIMARY": box_signature("box-key", body, timestamp),
            "BOX-SIGNATURE-VERSION": "1",
            "BOX-SIGNATURE-ALGORITHM": "HmacSHA256",
        }

    async def run() -> tuple[list[int], list[int], list[int]]:
        async with bridge(
            kafka_bootstrap,
            topic,
            {"routes": routes},
            {"CLD": "cld-secret", "BOX": "box-key"},
            Services(clock=lambda: now),
        ) as running:
            bad = [
                (await post(running.port, "/hooks/cloudinary", body, cld(t)))[0] for t in cloudinary
            ]
            bad_box = [(await post(running.port, "/hooks/box", body, boxed(t)))[0] for t in box]
            good = [
                (await post(running.port, "/hooks/cloudinary", body, cld(str(int(now)))))[0],
                (await post(running.port, "/hooks/box", body, boxed(box_timestamp(now))))[0],
            ]
            return bad, bad_box, good

    with caplog.at_level(logging.INFO):
        bad, bad_box, good = asyncio.run(run())
    assert bad == [401] * len(cloudinary)
    assert bad_box == [401] * len(box)
    assert good == [202, 202]
    refusals = [
        r for r in caplog.records if r.name == "connectors.webhook" and "refused" in r.getMessage()
    ]
    assert len(refusals) == len(cloudinary) + len(box)
    assert all("malformed" in r.getMessage() or "replayed" in r.getMessage() for r in refusals)
    assert not [r for r in caplog.records if r.exc_info]
    assert all(len(r.getMessage()) < 6000 for r in caplog.records)
    assert [record.value for record in asyncio.run(read_topic(kafka_bootstrap, topic))] == [
        body,
        body,
    ]


def test_the_admin_port_serves_health_and_metrics_and_the_public_port_does_not(
    kafka_bootstrap: str,
) -> None:
    topic = unique_topic("admin")
    webhook = {"admin_port": 9, "routes": {"minio": {"secret_env": "MINIO_TOKEN"}}}  # 0 in start

    async def run() -> dict[str, Any]:
        async with bridge(kafka_bootstrap, topic, webhook, {"MINIO_TOKEN": MINIO_TOKEN}) as running:
            assert running.admin_port is not None
            got: dict[str, Any] = {}
            async with ClientSession() as session:
                for port, where in [(running.port, "public"), (running.admin_port, "admin")]:
                    for path in ("/healthz", "/metrics"):
                        async with session.get(f"http://127.0.0.1:{port}{path}") as response:
                            got[f"{where}{path}"] = (response.status, await response.text())
                async with session.post(
                    f"http://127.0.0.1:{running.admin_port}/hooks/minio",
                    data=b"{}",
                    headers={"Authorization": f"Bearer {MINIO_TOKEN}"},
                ) as response:
                    got["admin-hooks"] = response.status
            got["control"] = (
                await post(
                    running.port, "/hooks/minio", b"{}", {"Authorization": f"Bearer {MINIO_TOKEN}"}
                )
            )[0]
            return got

    got = asyncio.run(run())
    assert got["public/healthz"][0] == 404 and got["public/metrics"][0] == 404
    assert got["admin/healthz"] == (200, '{"ok": true, "kafka": true}')
    assert got["admin/metrics"][0] == 200 and "bridge_webhook_accepted" in got["admin/metrics"][1]
    assert got["admin-hooks"] == 404
    assert got["control"] == 202
    assert len(asyncio.run(read_topic(kafka_bootstrap, topic))) == 1


def test_admin_port_from_the_environment(tmp_path: Any) -> None:
    settings = load_settings(None, {"WEBHOOK_ADMIN_PORT": "9091", "WEBHOOK_ADMIN_HOST": "0.0.0.0"})
    assert (settings.webhook.admin_port, settings.webhook.admin_host) == (9091, "0.0.0.0")
    assert load_settings(None, {}).webhook.admin_port is None


# ------------------------------------------------------------------ item 5: Appwrite events


def test_a_signed_appwrite_body_with_another_event_header_is_refused(kafka_bootstrap: str) -> None:
    """The event header is unsigned. While a body is remembered, it may come again with its
    own header (a redelivery) and, once, as a file delete (what deleting an unchanged file
    sends: indistinguishable from a create replayed as a delete, the documented exposure);
    a deleted file's body replayed as a create (a resurrection) or a create sent as an update
    is refused, and never reaches the raw topic. With the memory full (capacity 1), a
    forgotten body's resurrection passes: the documented bound."""
    url = "https://hooks.example.com/hooks/appwrite"
    key = "appwrite-signature-key"
    create = "buckets.*.files.*.create,buckets.uploads.files.f1.create,buckets.*.files.*"
    update = "buckets.*.files.*.update,buckets.uploads.files.f1.update,buckets.*.files.*"
    delete = "buckets.*.files.*.delete,buckets.uploads.files.f1.delete,buckets.*.files.*"

    def file_body(file_id: str) -> bytes:
        return json.dumps(
            {
                "$id": file_id,
                "bucketId": "uploads",
                "$createdAt": "2026-11-30T10:00:00.000+00:00",
                "$updatedAt": "2026-11-30T10:00:00.000+00:00",
                "name": f"{file_id}.png",
                "signature": "5d41402abc4b2a76b9719d911017c592",
                "sizeOriginal": 5,
            }
        ).encode()

    def signed(body: bytes, events: str) -> dict[str, str]:
        return {
            "X-Appwrite-Webhook-Signature": appwrite_signature(key, url, body),
            "X-Appwrite-Webhook-Events": events,
        }

    f1, f2, f3 = file_body("f1"), file_body("f2"), file_body("f3")
    same_set = "buckets.*.files.*," + create.replace(",buckets.*.files.*", "")

    async def run(memory: int, sends: list[tuple[bytes, str]]) -> tuple[list[int], str]:
        topic = unique_topic("appwrite")
        route = {"secret_env": "AW", "url": url, "event_memory": memory}
        async with bridge(
            kafka_bootstrap, topic, {"routes": {"appwrite": route}}, {"AW": key}
        ) as running:
            return [
                (await post(running.port, "/hooks/appwrite", body, signed(body, events)))[0]
                for body, events in sends
            ], topic

    sends = [
        (f1, create),
        (f1, create),  # redelivery
        (f1, same_set),  # the same names in another order: the same header
        (f1, update),  # a create sent as an update
        (f1, delete),  # the file deleted unchanged (or a create replayed as a delete)
        (f1, delete),  # redelivery of the delete
        (f1, create),  # the attack: the deleted file's body as a create
        (f1, "buckets.*.files.*.create"),  # a subset is another header too
        (f2, delete),  # another body: its own first delivery
        (f2, create),  # resurrection of f2
        (f3, create),  # control
    ]
    statuses, topic = asyncio.run(run(10_000, sends))
    assert statuses == [202, 202, 202, 401, 202, 202, 401, 401, 202, 401, 202]
    published = asyncio.run(read_topic(kafka_bootstrap, topic))
    admitted = [send for send, status in zip(sends, statuses, strict=True) if status == 202]
    assert sorted(
        (r.value, r.headers["header.x-appwrite-webhook-events"]) for r in published
    ) == sorted((body, events.encode()) for body, events in admitted)
    # The bound: once forgotten (capacity 1, another body came), the resurrection passes.
    statuses, _ = asyncio.run(run(1, [(f1, delete), (f3, create), (f1, create)]))
    assert statuses == [202, 202, 202]


def test_appwrite_memory_forgets_after_its_ttl_and_keeps_only_authentic_bodies() -> None:
    """Pure: the memory's window is `event_memory_s` on the bridge's clock, and a body whose
    signature fails is never remembered (an attacker cannot fill the memory or pin a header)."""
    url = "https://hooks.example.com/hooks/appwrite"
    config = WebhookRouteConfig.model_validate(
        {"secret_env": "AW", "url": url, "event_memory_s": "1h"}
    )
    built = build_authenticator("appwrite", config, {"AW": "key"}, Services())
    assert built is not None
    authenticator = built[0]
    body = b'{"$id":"f1","bucketId":"uploads"}'

    def request(events: str, at: float, key: str = "key") -> RequestFacts:
        headers = {
            "x-appwrite-webhook-signature": appwrite_signature(key, url, body),
            "x-appwrite-webhook-events": events,
        }
        return RequestFacts("POST", url, {}, headers, body, at)

    create, delete = "buckets.*.files.*.create", "buckets.*.files.*.delete"

    def outcome(facts: RequestFacts) -> str:
        verdict = asyncio.run(authenticator.authenticate(facts))
        return verdict.outcome if verdict.outcome == "publish" else verdict.reason

    assert outcome(request(create, 0.0, key="forged")) == "bad-signature"
    assert outcome(request(delete, 10.0)) == "publish"  # the forged one pinned nothing
    assert outcome(request(create, 3000.0)) == "event-mismatch"
    assert outcome(request(create, 10.0 + 3601.0)) == "publish"  # forgotten after 1 h


# ------------------------------------------------------------------ item 2: the raw record


def test_the_raw_record_is_bounded_headers_included(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    """120 headers of 8 KB: aiohttp refuses more than 64 header lines (400). 50 headers of
    8 KB (400 KB) are over `max_header_bytes` (64 KiB): 431, nothing published. A 1 MiB body
    with 40 KB of headers, within the budget, is published whole to a raw topic as the stream
    creates it."""
    topic = unique_topic("headers")
    webhook = {"max_body_bytes": MiB, "routes": {"b2": {"secret_env": "B2_SECRET"}}}
    body = json.dumps({"events": [], "pad": "x" * (MiB - 100)}).encode()
    assert len(body) <= MiB
    many = {f"X-Pad-{n}": "v" * 8000 for n in range(120)}
    some = {f"X-Pad-{n}": "v" * 8000 for n in range(50)}
    within = {f"X-Pad-{n}": "v" * 1000 for n in range(40)}

    async def run() -> list[int]:
        await create_raw_topic(kafka_bootstrap, topic)
        async with bridge(kafka_bootstrap, topic, webhook, {"B2_SECRET": B2_SECRET}) as running:
            return [
                (await post(running.port, "/hooks/b2", body, {**b2_headers(body), **headers}))[0]
                for headers in (many, some, within)
            ]

    with caplog.at_level(logging.INFO):
        assert asyncio.run(run()) == [400, 431, 202]
    # aiohttp's refusal of the 120 headers: one line, no traceback (attackers repeat it).
    parse_errors = [r for r in caplog.records if r.name == "connectors.webhook.http"]
    assert len(parse_errors) == 1 and "Too many headers" in parse_errors[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info]
    records = asyncio.run(read_topic(kafka_bootstrap, topic))
    assert [record.value for record in records] == [body]
    size = len(records[0].value or b"") + sum(
        len(k) + len(v) for k, v in records[0].headers.items()
    )
    assert size <= RAW_RECORD_MAX_BYTES


def test_limits_that_cannot_fit_a_raw_record_are_a_config_error(tmp_path: Any) -> None:
    path = tmp_path / "streams.toml"
    path.write_text("[webhook]\nmax_body_bytes = 4194304\n")
    with pytest.raises(ConfigError, match=r"webhook\.max_body_bytes"):
        load_settings(path, {})
    path.write_text("[webhook]\nmax_body_bytes = 2097152\nmax_header_bytes = 2097152\n")
    with pytest.raises(ConfigError, match=r"webhook\.max_body_bytes.*max_header_bytes"):
        load_settings(path, {})
    path.write_text("[webhook]\nmax_body_bytes = 2097152\nmax_bodies_bytes = 1048576\n")
    with pytest.raises(ConfigError, match=r"max_bodies_bytes"):
        load_settings(path, {})
    assert Settings().webhook.max_header_bytes == 64 * 1024


def test_a_pulled_message_over_the_record_bound_is_refused_before_it_is_sent(
    kafka_bootstrap: str,
) -> None:
    """The pull bridges publish through the same RawPublisher: a Pub/Sub message may carry
    10 MB of data and ~125 KB of attributes, over what the raw topic takes. It is refused as
    RecordTooLarge (a PublishFailed: never acknowledged upstream) without a send; the next
    message is published."""
    topic = unique_topic("pull")

    async def run() -> None:
        publisher = RawPublisher(kafka_bootstrap, topic, 10.0)
        await publisher.start()
        try:
            attributes = [(f"attribute.a{n}", b"v" * 1024) for n in range(100)]
            with pytest.raises(RecordTooLarge):
                await publisher.publish(b"x" * (RAW_RECORD_MAX_BYTES - 50_000), attributes)
            await publisher.publish(b"control", attributes)
        finally:
            await publisher.stop()

    asyncio.run(run())
    assert [record.value for record in asyncio.run(read_topic(kafka_bootstrap, topic))] == [
        b"control"
    ]
