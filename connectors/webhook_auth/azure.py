"""Azure Event Grid webhooks: the validation handshakes and a shared secret.

Sources:
* `MicrosoftDocs/azure-docs:articles/event-grid/webhook-event-delivery.md`: with the Event
  Grid schema the first request carries `aeg-event-type: SubscriptionValidation` and an array
  holding only a `Microsoft.EventGrid.SubscriptionValidationEvent` whose `data.validationCode`
  must be echoed as `{"validationResponse": "<code>"}` with **200** (202 is not recognised).
  With the CloudEvents 1.0 schema Event Grid uses the CloudEvents abuse protection instead.
* `cloudevents/spec:cloudevents/http-webhook.md` section 4: an `OPTIONS` request with
  `WebHook-Request-Origin` (Event Grid sends `eventgrid.azure.net`), optionally
  `WebHook-Request-Rate` (requests per minute) and `WebHook-Request-Callback`; the target
  grants by answering `WebHook-Allowed-Origin` (the origin or `*`) and `WebHook-Allowed-Rate`
  (MUST when a rate was requested, SHOULD otherwise), plus `Allow`. The asynchronous callback
  is never called (it would be an outbound request an attacker chooses).
* https://learn.microsoft.com/azure/event-grid/security-authentication and
  .../delivery-properties: Event Grid payloads are unsigned; authenticate with a secret query
  parameter in the endpoint URL, or a custom delivery header (or Entra ID, not supported here).

Every request, handshakes included, must carry the secret: the query parameter is part of the
endpoint URL and so reaches the handshakes too. The handshakes are answered, never published.
A `SubscriptionDeletion` notice is acknowledged and not published either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from connectors.webhook_auth.base import RequestFacts, Verdict, publish, reject, respond, same

EVENT_TYPE_HEADER = "aeg-event-type"
ORIGIN_HEADER = "webhook-request-origin"
VALIDATION_EVENT = "Microsoft.EventGrid.SubscriptionValidationEvent"


def validation_code(body: bytes) -> str | None:
    """The `validationCode` of an Event Grid SubscriptionValidationEvent body, else None."""
    try:
        events: Any = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
        return None
    if isinstance(events, dict):
        events = [events]
    if not isinstance(events, list) or len(events) != 1 or not isinstance(events[0], dict):
        return None
    event = events[0]
    data = event.get("data")
    if event.get("eventType") != VALIDATION_EVENT or not isinstance(data, dict):
        return None
    code = data.get("validationCode")
    return code if isinstance(code, str) and code else None


@dataclass(frozen=True)
class EventGrid:
    source: str
    secret: str | None
    """None only for an `insecure` route."""
    query_param: str
    header: str | None
    allowed_origins: tuple[str, ...]
    allowed_rate: str
    methods: frozenset[str] = frozenset({"POST", "OPTIONS"})

    @property
    def secret_headers(self) -> frozenset[str]:
        return frozenset({self.header}) if self.header else frozenset()

    @property
    def read_headers(self) -> frozenset[str]:
        return self.secret_headers | {EVENT_TYPE_HEADER, ORIGIN_HEADER}

    def _credentials(self, request: RequestFacts) -> Verdict | None:
        """None when the shared secret is right (or the route is insecure)."""
        if self.secret is None:
            return None
        if self.header is not None:
            given, where = request.header(self.header), f"header {self.header}"
        else:
            given, where = request.query.get(self.query_param), f"query {self.query_param}"
        if not given:
            return reject("missing-credentials", f"no secret in {where}")
        return None if same(given, self.secret) else reject("bad-credentials", f"{where} wrong")

    async def before_body(self, request: RequestFacts) -> Verdict | None:
        """The secret is in the query or a header: checked before the body is read (and so
        before a validation handshake's JSON is parsed)."""
        return self._credentials(request)

    async def authenticate(self, request: RequestFacts) -> Verdict:
        refused = self._credentials(request)
        if refused is not None:
            return refused
        if request.method == "OPTIONS":
            return self._abuse_protection(request)
        kind = (request.header(EVENT_TYPE_HEADER) or "").strip()
        code = validation_code(request.body)
        if kind == "SubscriptionValidation" or code is not None:
            if code is None:
                return reject("malformed", "SubscriptionValidation without a code", 400)
            return respond("subscription-validation", 200, {"validationResponse": code})
        if kind == "SubscriptionDeletion":
            return respond("subscription-deletion", 200, {"ok": True})
        return publish()

    def _abuse_protection(self, request: RequestFacts) -> Verdict:
        origin = (request.header(ORIGIN_HEADER) or "").strip()
        if not origin:
            return reject("malformed", "OPTIONS without WebHook-Request-Origin", 400)
        if "*" not in self.allowed_origins and origin not in self.allowed_origins:
            return reject("origin-not-allowed", f"origin {origin!r} not allowed", 403)
        headers = {
            "WebHook-Allowed-Origin": origin,
            "WebHook-Allowed-Rate": self.allowed_rate,
            "Allow": "POST, OPTIONS",
        }
        return respond("abuse-protection", 200, None, headers, detail=f"origin {origin}")
