"""Supabase Database Webhooks: the secret header configured on the webhook.

Source: `supabase/supabase` `docker/volumes/db/webhooks.sql` and
https://supabase.com/docs/guides/database/webhooks: the trigger calls
`supabase_functions.http_request(url, method, headers, params, timeout)`, whose `headers`
(a JSON object) are sent as given. The body is not signed; the only protection is a secret
header the user puts there, so its name is configurable (`secret_header`) and its value is
compared whole, in constant time.
"""

from __future__ import annotations

from connectors.webhook_auth.base import SharedSecretHeader


def supabase_header(header: str, secret: str) -> SharedSecretHeader:
    return SharedSecretHeader("supabase", header, secret)
