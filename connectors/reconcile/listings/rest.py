"""GET a JSON page from a provider's REST list API (Box, Cloudinary, Appwrite).

Standard library only (urllib): a listing is a sequence of blocking page requests. 429 and
5xx answers and connection errors are retried a few times (Retry-After honoured up to 30 s);
any other answer is a `ListingError` naming the status and the provider's message.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from connectors.reconcile.listings import ListingError

ATTEMPTS = 4
TIMEOUT_S = 30.0


def _message(body: bytes) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body[:200].decode(errors="replace").replace("\n", " ")
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict):  # Cloudinary: {"error": {"message": ...}}
            error = error.get("message")
        for value in (data.get("message"), error, data.get("code")):
            if isinstance(value, str | int) and value:
                return str(value)
    return json.dumps(data)[:200]


def get_json(what: str, url: str, headers: Mapping[str, str]) -> Any:
    """The JSON body of `GET url`; `what` names the listing in errors."""
    request = urllib.request.Request(url, headers={"Accept": "application/json", **headers})
    for attempt in range(1, ATTEMPTS + 1):
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                body = response.read()
            try:
                return json.loads(body)
            except ValueError:
                raise ListingError(f"{what}: the answer is not JSON") from None
        except urllib.error.HTTPError as exc:
            body = exc.read()
            retry = exc.code == 429 or exc.code >= 500
            if not retry or attempt == ATTEMPTS:
                raise ListingError(f"{what} failed: HTTP {exc.code}: {_message(body)}") from None
            after = exc.headers.get("Retry-After", "")
            time.sleep(min(float(after), 30.0) if after.isdigit() else attempt)
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            if attempt == ATTEMPTS:
                reason = getattr(exc, "reason", exc)
                raise ListingError(f"{what} failed: {reason}") from None
            time.sleep(attempt)
    raise AssertionError("unreachable")
