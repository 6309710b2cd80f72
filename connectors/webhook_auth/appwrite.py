"""Appwrite webhooks: `X-Appwrite-Webhook-Signature` = base64(HMAC-SHA1(key, URL + body)).

Sources: `appwrite/appwrite` `src/Appwrite/Platform/Workers/Webhooks.php` (`$signature =
base64_encode(hash_hmac('sha1', $url . $payload, $signatureKey, true))`) and
https://appwrite.io/docs/apis/webhooks ("append the payload to the end of webhook URL ...
HMAC-SHA1"). The URL is the one registered in Appwrite, configured per route (`url`): what
the bridge receives behind proxies may differ. Some Appwrite versions sign the URL as stored,
others `rawurldecode($url)`; both forms are accepted (they differ only for `%` escapes). No
timestamp is signed, so there is no replay window; the optional HTTP basic auth of Appwrite
webhooks is not checked.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from connectors.webhook_auth.base import RequestFacts, Verdict, publish, reject, same

HEADER = "x-appwrite-webhook-signature"


def signature(key: str, url: bytes | str, body: bytes) -> str:
    url_bytes = url.encode() if isinstance(url, str) else url
    digest = hmac.new(key.encode("utf-8"), url_bytes + body, hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def signed_urls(url: str) -> tuple[bytes, ...]:
    """The URL forms Appwrite versions sign: as stored, and PHP `rawurldecode`d."""
    stored, decoded = url.encode(), unquote_to_bytes(url)
    return (stored,) if decoded == stored else (stored, decoded)


@dataclass(frozen=True)
class AppwriteSignature:
    source: str
    key: str
    url: str
    methods: frozenset[str] = frozenset({"POST"})
    secret_headers: frozenset[str] = frozenset()

    async def authenticate(self, request: RequestFacts) -> Verdict:
        given = request.header(HEADER)
        if not given:
            return reject("missing-signature", f"no {HEADER} header")
        matched = False
        for url in signed_urls(self.url):
            matched |= same(given.strip(), signature(self.key, url, request.body))
        return publish() if matched else reject("bad-signature", "HMAC-SHA1 does not match")
