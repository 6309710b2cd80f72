"""The webhook bridge attacked with what a request's head may claim (issue 23 #2, #6, #7): a
header given twice, an encoded body, a key set that cannot be fetched. Served as
`python -m connectors webhook` serves it (`start_bridge`), against the real broker, each on a
fresh raw topic: the requests, what the bridge answers, what reaches the raw topic, and
deliveries that are answered 202 and are on it.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from support.kafka_io import read_topic
from support.webhook_signing import (
    appwrite_signature,
    b2_signature,
    box_signature,
    box_timestamp,
    cloudinary_signature,
    google_token,
    jwks,
    new_rsa_key,
    push_claims,
    unique_topic,
    write,
)
from test_attack_webhook import Stalled, bridge, request_head

from connectors.webhook_auth.base import Services

pytestmark = pytest.mark.kafka

NOW = 1_800_000_000.0
MiB = 1024 * 1024
AUDIENCE = "https://hooks.example.com/hooks/gcs"
ACCOUNT = "gcs-push@example-project.iam.gserviceaccount.com"
APPWRITE_URL = "https://hooks.example.com/hooks/appwrite"
SECRET = "right-secret-0123"
SECONDARY = "box-secondary-key-0123"
TOPIC_ARN = "arn:aws:sns:eu-west-1:123456789012:uploads"

Headers = list[tuple[str, str]]


async def send(
    port: int, path: str, headers: Headers, body: bytes = b"", method: str = "POST"
) -> int:
    """One request with exactly these header lines (repeats kept, in order); its status."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers]
    lines.append(f"Content-Length: {len(body)}")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    await writer.drain()
    status_line = await reader.readline()
    await reader.read(-1)
    writer.close()
    return int(status_line.split()[1])


def with_second(headers: Headers, name: str, second: str) -> Headers:
    """`headers` with another line of `name` right after its first."""
    at = next(n for n, (given, _) in enumerate(headers) if given.lower() == name.lower())
    return [*headers[: at + 1], (name, second), *headers[at + 1 :]]


# ------------------------------------------------------------- #2: one header, two readings


@dataclass(frozen=True)
class Row:
    """A delivery the route accepts (`ok`), and the header that is then given twice."""

    source: str
    header: str
    second: str
    headers: Headers
    body: bytes = b""
    query: str = ""
    method: str = "POST"
    ok: int = 202
    published: bool = True


def appwrite_document(n: int) -> bytes:
    document = {"$id": f"file-{n}", "bucketId": "photos", "$updatedAt": f"2027-01-01T00:00:0{n}Z"}
    return json.dumps(document).encode()


def appwrite_headers(body: bytes, events: str) -> Headers:
    return [
        ("X-Appwrite-Webhook-Signature", appwrite_signature(SECRET, APPWRITE_URL, body)),
        ("X-Appwrite-Webhook-Events", events),
    ]


def rows(gcs_token: str) -> list[Row]:
    """Every header each route's authenticator reads, and the one the worker reads."""
    stamp = box_timestamp(NOW)
    box_body = b'{"trigger":"FILE.UPLOADED","source":{"id":"1","type":"file"}}'
    box = [
        ("BOX-DELIVERY-TIMESTAMP", stamp),
        ("BOX-SIGNATURE-PRIMARY", box_signature(SECRET, box_body, stamp)),
        ("BOX-SIGNATURE-SECONDARY", box_signature(SECONDARY, box_body, stamp)),
        ("BOX-SIGNATURE-VERSION", "1"),
        ("BOX-SIGNATURE-ALGORITHM", "HmacSHA256"),
    ]
    cld_body = b'{"notification_type":"upload","public_id":"a"}'
    cld_stamp = str(int(NOW))
    cloudinary = [
        ("X-Cld-Timestamp", cld_stamp),
        ("X-Cld-Signature", cloudinary_signature(cld_body, cld_stamp, SECRET)),
    ]
    b2_body = b'{"events":[{"eventId":"e-1","eventType":"b2:ObjectCreated"}]}'
    grid = b'[{"id":"1","eventType":"Microsoft.Storage.BlobCreated","subject":"/x","data":{}}]'
    delete = "buckets.*.files.*.delete,buckets.photos.files.file-1.delete"
    create = "buckets.*.files.*.create,buckets.photos.files.file-1.create"
    table = [
        Row("minio", "Authorization", "Bearer wrong", [("Authorization", f"Bearer {SECRET}")]),
        Row("supabase", "X-Webhook-Secret", "wrong", [("X-Webhook-Secret", SECRET)]),
        Row("eventbridge", "X-Api-Key", "wrong", [("X-Api-Key", SECRET)]),
        Row("gcs", "Authorization", "Bearer x.y.z", [("Authorization", f"Bearer {gcs_token}")]),
        Row("azure", "X-Grid-Secret", "wrong", [("X-Grid-Secret", SECRET)], grid),
        Row(
            "azure",
            "aeg-event-type",
            "SubscriptionValidation",
            [("X-Grid-Secret", SECRET), ("aeg-event-type", "Notification")],
            grid.replace(b'"1"', b'"2"'),
        ),
        Row(
            "azure",
            "WebHook-Request-Origin",
            "evil.example",
            [("X-Grid-Secret", SECRET), ("WebHook-Request-Origin", "eventgrid.azure.net")],
            method="OPTIONS",
            ok=200,
            published=False,
        ),
        Row(
            "b2",
            "X-Bz-Event-Notification-Signature",
            "v1=" + "0" * 64,
            [("X-Bz-Event-Notification-Signature", b2_signature(SECRET, b2_body))],
            b2_body,
        ),
        *[Row("box", name, "x", box, box_body) for name, _ in box],
        *[Row("cloudinary", name, "1", cloudinary, cld_body) for name, _ in cloudinary],
        Row(
            "appwrite",
            "X-Appwrite-Webhook-Signature",
            "AAAA",
            appwrite_headers(appwrite_document(1), create),
            appwrite_document(1),
        ),
        # The worker reads this one: [delete, create] was accepted as a delete and
        # forwarded as a create (the resurrection event_memory exists to refuse).
        Row(
            "appwrite",
            "X-Appwrite-Webhook-Events",
            create,
            appwrite_headers(appwrite_document(2), delete),
            appwrite_document(2),
        ),
    ]
    return table


def test_a_header_a_check_or_the_worker_reads_given_twice_is_refused_on_every_route(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """For every header an authenticator reads (and the one the worker reads), a delivery
    the route accepts is sent again with that header given twice, the value it accepts first
    (case varied for the second line): 400 `repeated-header`, nothing published, though the
    first line alone is what the route checks. Then each delivery as it was is answered 202
    (200 for the Azure handshake) and is on the raw topic, once."""
    topic = unique_topic("repeated")
    key = new_rsa_key()
    jwks_path = write(tmp_path / "jwks.json", json.dumps(jwks(key.public_key(), "k1")))
    webhook = {
        "routes": {
            "minio": {"secret_env": "SECRET"},
            "supabase": {"secret_env": "SECRET", "secret_header": "X-Webhook-Secret"},
            "eventbridge": {"secret_env": "SECRET", "secret_header": "X-Api-Key"},
            "gcs": {"audience": AUDIENCE, "service_account": ACCOUNT, "jwks_file": str(jwks_path)},
            "azure": {"secret_env": "SECRET", "secret_header": "X-Grid-Secret"},
            "b2": {"secret_env": "SECRET"},
            "box": {"secret_env": "SECRET", "secondary_secret_env": "SECONDARY"},
            "cloudinary": {"secret_env": "SECRET"},
            "appwrite": {"secret_env": "SECRET", "url": APPWRITE_URL},
        }
    }
    token = google_token(key, "k1", push_claims(AUDIENCE, ACCOUNT, NOW))
    table = rows(token)
    environ = {"SECRET": SECRET, "SECONDARY": SECONDARY}

    async def attack() -> tuple[dict[str, int], dict[str, int]]:
        repeated, alone = {}, {}
        async with bridge(
            kafka_bootstrap, topic, webhook, environ, Services(clock=lambda: NOW)
        ) as running:
            for row in table:
                name = f"{row.source} {row.header}"
                twice = with_second(row.headers, row.header.lower(), row.second)
                path = f"/hooks/{row.source}{row.query}"
                repeated[name] = await send(running.port, path, twice, row.body, row.method)
            for row in table:
                name = f"{row.source} {row.header}"
                path = f"/hooks/{row.source}{row.query}"
                alone[name] = await send(running.port, path, row.headers, row.body, row.method)
        return repeated, alone

    repeated, alone = asyncio.run(attack())
    assert repeated == {name: 400 for name in repeated}
    assert alone == {f"{row.source} {row.header}": row.ok for row in table}
    records = asyncio.run(read_topic(kafka_bootstrap, topic))
    expected = [row.body for row in table if row.published]
    assert sorted(record.value or b"" for record in records) == sorted(expected)
    deleted = next(r for r in records if r.value == appwrite_document(2))
    assert deleted.headers["header.x-appwrite-webhook-events"].startswith(b"buckets.*.files.*.del")


def test_the_worker_read_header_is_guarded_on_an_insecure_route_and_others_are_forwarded_once(
    kafka_bootstrap: str,
) -> None:
    """An `insecure` Appwrite route checks nothing, but the worker reads the event header:
    given twice it is refused 400. A header nobody reads may come twice (proxies add
    `X-Forwarded-For` lines): it is published as one `header.<name>`, its lines joined as
    HTTP reads them, so no reader of the raw record can pick another line than the next."""
    topic = unique_topic("forwarded")
    webhook = {
        "routes": {
            "appwrite": {"insecure": True},
            "eventbridge": {"auth": "basic", "basic_username": "eb", "secret_env": "SECRET"},
        }
    }
    body = appwrite_document(3)
    delete = [("X-Appwrite-Webhook-Events", "buckets.*.files.*.delete")]
    create = "buckets.*.files.*.create"
    basic = [("Authorization", "Basic ZWI6cmlnaHQtc2VjcmV0LTAxMjM=")]  # eb:right-secret-0123
    proxied = [("X-Forwarded-For", "203.0.113.7"), ("x-forwarded-for", "10.0.0.2")]

    async def attack() -> list[int]:
        async with bridge(kafka_bootstrap, topic, webhook, {"SECRET": SECRET}) as running:
            port = running.port
            twice = with_second(delete, "x-appwrite-webhook-events", create)
            basic_twice = with_second(basic, "authorization", "Basic eDp5")
            return [
                await send(port, "/hooks/appwrite", twice, body),
                await send(port, "/hooks/eventbridge", basic_twice, b"{}"),
                await send(port, "/hooks/appwrite", [*delete, *proxied], body),
                await send(port, "/hooks/eventbridge", [*basic, *proxied], b'{"detail":{}}'),
            ]

    assert asyncio.run(attack()) == [400, 400, 202, 202]
    records = asyncio.run(read_topic(kafka_bootstrap, topic))
    assert sorted(record.value or b"" for record in records) == [body, b'{"detail":{}}']
    for record in records:
        lines = [value for name, value in record.header_lines if name == "header.x-forwarded-for"]
        assert lines == [b"203.0.113.7, 10.0.0.2"]


# ------------------------------------------------------- #6: Content-Encoding multiplies


def sns_shaped(size: int) -> bytes:
    """Unsigned, names `Signature` and the allowed topic (the byte search admits it to the
    parser), then small objects up to `size` bytes: what costs the parser most."""
    head = json.dumps({"Type": "Notification", "TopicArn": TOPIC_ARN, "Signature": "forged"})
    start = head.encode()[:-1] + b', "Padding": ['
    count = (size - len(start) - 2) // len(b'{"a":0},')
    return start + b'{"a":0},' * (count - 1) + b'{"a":0}]}'


def test_encoded_bodies_are_refused_415_from_the_head_and_never_published_decoded(
    kafka_bootstrap: str,
) -> None:
    """No provider encodes what it posts. A 1.7 KB gzip that inflates to 1 MiB of SNS-shaped
    JSON, unsigned, is answered 415 (it was decoded and parsed, then 401); a head announcing
    an encoded 1 MiB body and sending none of it is answered 415 at once; a B2 delivery
    signed over its decoded body and sent gzip-encoded is 415 (it was published decoded,
    under `header.content-encoding: gzip`); so is every other coding, in one header line or
    two. `Content-Encoding: identity` passes: that delivery is on the topic exactly as sent,
    and is the only record there."""
    topic = unique_topic("encoded")
    webhook = {
        "body_timeout_s": 5.0,
        "routes": {"s3": {"topic_arns": [TOPIC_ARN]}, "b2": {"secret_env": "SECRET"}},
    }
    inflating = gzip.compress(sns_shaped(MiB), compresslevel=9)
    b2_body = b'{"events":[{"eventId":"gz-1","eventType":"b2:ObjectCreated"}]}'
    signed = [("X-Bz-Event-Notification-Signature", b2_signature(SECRET, b2_body))]
    other = {
        "deflate": zlib.compress(b2_body),
        "br": b"\x0b\x02\x80" + b2_body + b"\x03",
        "zstd": b"(\xb5/\xfd" + b2_body,
        "x-gzip": gzip.compress(b2_body),
        "identity, gzip": gzip.compress(b2_body),
        "GZIP": gzip.compress(b2_body),
    }

    async def attack() -> dict[str, Any]:
        got: dict[str, Any] = {}
        async with bridge(kafka_bootstrap, topic, webhook, {"SECRET": SECRET}) as running:
            port = running.port
            got["inflating"] = await send(
                port, "/hooks/s3", [("Content-Encoding", "gzip")], inflating
            )
            head = request_head("/hooks/s3", {"Content-Encoding": "gzip"}, MiB)
            stalled = await Stalled.open(port, head)  # no byte of the body is ever sent
            got["head only"] = (await stalled.status(15))[0]  # reading it would be 408
            stalled.close()
            gzipped = gzip.compress(b2_body)
            got["signed gzip"] = await send(
                port, "/hooks/b2", [*signed, ("Content-Encoding", "gzip")], gzipped
            )
            for coding, encoded in other.items():
                got[coding] = await send(
                    port, "/hooks/b2", [*signed, ("Content-Encoding", coding)], encoded
                )
            two_lines = [*signed, ("Content-Encoding", "identity"), ("content-encoding", "gzip")]
            got["two lines"] = await send(port, "/hooks/b2", two_lines, gzipped)
            got["identity"] = await send(
                port, "/hooks/b2", [*signed, ("Content-Encoding", "identity")], b2_body
            )
        return got

    got = asyncio.run(attack())
    assert got.pop("identity") == 202
    assert got == {name: 415 for name in got}
    records = asyncio.run(read_topic(kafka_bootstrap, topic))
    assert [record.value for record in records] == [b2_body]
    assert records[0].headers["header.content-encoding"] == b"identity"


# ------------------------------------------------------------- #7: GCS key-set fetches


@dataclass
class KeyServer:
    """A JWKS endpoint on 127.0.0.1 that counts its requests: failing (500), slow (answers
    after `delay_s`), or well."""

    document: bytes
    failing: bool = False
    delay_s: float = 0.0
    requests: int = 0
    in_flight: int = 0
    most_in_flight: int = 0
    runner: web.AppRunner | None = None
    port: int = 0

    async def certs(self, request: web.Request) -> web.Response:
        self.requests += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            if self.failing:
                return web.Response(status=500)
            return web.Response(body=self.document, content_type="application/json")
        finally:
            self.in_flight -= 1

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/certs", self.certs)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{self.port}/certs"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@dataclass
class Clock:
    now: float = NOW

    def __call__(self) -> float:
        return self.now


def gcs_webhook(url: str) -> dict[str, Any]:
    route = {"audience": AUDIENCE, "service_account": ACCOUNT, "jwks_url": url}
    return {"routes": {"gcs": route}}


def bearer(token: str) -> Headers:
    return [("Authorization", f"Bearer {token}")]


def test_a_failing_key_set_is_fetched_once_for_many_requests_and_again_after_a_while(
    kafka_bootstrap: str,
) -> None:
    """The key set's URL answers 500. 30 requests with tokens no one at Google signed: each
    503 (Pub/Sub retries), and the URL asked once (it was asked 30 times). 11 s later (the
    bridge's clock) the URL works: a token Google's key signed is fetched for once more,
    answered 202 and published; none of the 30 is."""
    topic = unique_topic("gcs-failing")
    google = new_rsa_key()
    server = KeyServer(json.dumps(jwks(google.public_key(), "k1")).encode(), failing=True)
    clock = Clock()
    forged = google_token(new_rsa_key(), "k1", push_claims(AUDIENCE, ACCOUNT, NOW))
    body = b'{"message":{"data":"e30=","messageId":"m-1"}}'

    async def attack() -> dict[str, Any]:
        url = await server.start()
        try:
            async with bridge(
                kafka_bootstrap, topic, gcs_webhook(url), {}, Services(clock=clock)
            ) as running:
                statuses = [
                    await send(running.port, "/hooks/gcs", bearer(forged), b"{}") for _ in range(30)
                ]
                asked = server.requests
                server.failing = False
                clock.now = NOW + 11
                token = google_token(google, "k1", push_claims(AUDIENCE, ACCOUNT, clock.now))
                after = await send(running.port, "/hooks/gcs", bearer(token), body)
                return {"statuses": statuses, "asked": asked, "after": after}
        finally:
            await server.stop()

    got = asyncio.run(attack())
    assert got["statuses"] == [503] * 30
    assert got["asked"] == 1
    assert got["after"] == 202
    assert server.requests == 2
    assert [record.value for record in asyncio.run(read_topic(kafka_bootstrap, topic))] == [body]


def test_concurrent_requests_against_a_slow_key_set_share_one_fetch(kafka_bootstrap: str) -> None:
    """The key set's URL answers after 1 s. 40 concurrent requests whose tokens name
    Google's key id but are signed by the attacker: one fetch, shared (there were 40 at
    once), then every one 401. A delivery with a real token afterwards is 202 without another
    fetch, and is the only record published."""
    topic = unique_topic("gcs-slow")
    google = new_rsa_key()
    server = KeyServer(json.dumps(jwks(google.public_key(), "k1")).encode(), delay_s=1.0)
    now = time.time()
    forged = google_token(new_rsa_key(), "k1", push_claims(AUDIENCE, ACCOUNT, now))
    token = google_token(google, "k1", push_claims(AUDIENCE, ACCOUNT, now))
    body = b'{"message":{"data":"e30=","messageId":"m-2"}}'

    async def attack() -> dict[str, Any]:
        url = await server.start()
        try:
            async with bridge(kafka_bootstrap, topic, gcs_webhook(url), {}) as running:
                statuses = await asyncio.gather(
                    *(send(running.port, "/hooks/gcs", bearer(forged), b"{}") for _ in range(40))
                )
                after = await send(running.port, "/hooks/gcs", bearer(token), body)
                return {"statuses": statuses, "after": after}
        finally:
            await server.stop()

    got = asyncio.run(attack())
    assert got["statuses"] == [401] * 40
    assert (server.requests, server.most_in_flight) == (1, 1)
    assert got["after"] == 202
    assert server.requests == 1
    assert [record.value for record in asyncio.run(read_topic(kafka_bootstrap, topic))] == [body]


# ------------------------------------------ issue 31, item 3: input never forges a log line


def test_a_header_forging_a_log_line_is_logged_escaped(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A `Content-Encoding` that holds a line separator HTTP lets through (U+2028, U+0085: the
    head is UTF-8) and then a line in the bridge's log format: refused 415, and the refusal's
    log line carries it escaped, so no line of the log (split as `str.splitlines`, as many
    log readers do) starts with the forged text (the bridge logs the codings lower-cased and
    split at commas: the forged line has neither)."""
    topic = unique_topic("forged-log")
    forged = "[2026-12-07 03:00:00.000] [1] [critical] forged ok"
    webhook = {"routes": {"b2": {"secret_env": "SECRET"}}}
    b2_body = b'{"events":[{"eventId":"log-1","eventType":"b2:ObjectCreated"}]}'
    signed = [("X-Bz-Event-Notification-Signature", b2_signature(SECRET, b2_body))]
    separators = ["\u2028", "\x85", "\u2029", "\x0b", "\x1c"]

    async def attack() -> list[int]:
        async with bridge(kafka_bootstrap, topic, webhook, {"SECRET": SECRET}) as running:
            return [
                await send(
                    running.port,
                    "/hooks/b2",
                    [*signed, ("Content-Encoding", f"gzip{separator}{forged}")],
                    b2_body,
                )
                for separator in separators
            ]

    with caplog.at_level(logging.INFO):
        statuses = asyncio.run(attack())
    assert set(statuses) <= {400, 415} and 415 in statuses, statuses
    refusals = [r.getMessage() for r in caplog.records if "415 encoded-body" in r.getMessage()]
    assert len(refusals) == statuses.count(415)
    lines = [line for record in caplog.records for line in record.getMessage().splitlines()]
    assert not [line for line in lines if line.startswith(forged)], lines
    assert all(forged in message and message.isprintable() for message in refusals), refusals
    assert asyncio.run(read_topic(kafka_bootstrap, topic)) == []
