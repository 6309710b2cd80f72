"""Box's listing: `GET /folders/{id}/items`, walked from `--box-folder` down (0: the root).

Box has no bucket and no flat listing, so the walk visits every folder below the starting
one, each with marker-based pagination (`usemarker=true`, `limit=1000`, `marker` = the last
answer's `next_marker`, until it is null or empty: developer.box.com, "Marker-based
Pagination" and "List items in folder"). `fields=id,type,name,sha1,size,modified_at` asks for
what the comparison needs (the default mini representation has no sha1 or size). Trashed
files are not in folder listings, so the listing is of live files. As in Box's webhooks
(streams.core.normalizers.box) the key is the file id and the ETag is the content's `sha1`;
web links are not files and are skipped. Auth: a Bearer access token, from the environment
variable `--box-token-env` (default BOX_ACCESS_TOKEN); `--endpoint-url` replaces
https://api.box.com/2.0.
"""

from __future__ import annotations

import argparse
import os
import urllib.parse
from collections.abc import Iterator

from connectors.reconcile.drift import Listed
from connectors.reconcile.listings import Listing, ListingError
from connectors.reconcile.listings.rest import get_json
from streams.config import ConfigError, InstanceConfig
from streams.core.normalizers.base import MalformedDelivery, parse_time

API = "https://api.box.com/2.0"
FIELDS = "id,type,name,sha1,size,modified_at"
PAGE = 1000


def _add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--box-folder", default="0", help="folder id to walk from (default 0)")
    group.add_argument(
        "--box-token-env",
        metavar="VAR",
        default="BOX_ACCESS_TOKEN",
        help="environment variable holding the access token (default BOX_ACCESS_TOKEN)",
    )


def _open(
    args: argparse.Namespace, instance: InstanceConfig, bucket: str | None
) -> Iterator[Listed]:
    token = os.environ.get(args.box_token_env)
    if not token:
        raise ConfigError(f"environment variable {args.box_token_env} (--box-token-env) is not set")
    base = (args.endpoint_url or API).rstrip("/")
    headers = {"Authorization": f"Bearer {token}"}
    folders = [args.box_folder]
    while folders:
        folder = folders.pop()
        marker: str | None = None
        while True:
            query = {"fields": FIELDS, "limit": str(PAGE), "usemarker": "true"}
            if marker:
                query["marker"] = marker
            url = f"{base}/folders/{urllib.parse.quote(folder)}/items?"
            page = get_json(
                f"listing Box folder {folder}", url + urllib.parse.urlencode(query), headers
            )
            if not isinstance(page, dict) or not isinstance(page.get("entries"), list):
                raise ListingError(f"listing Box folder {folder}: no `entries` in the answer")
            for entry in page["entries"]:
                kind = entry.get("type")
                if kind == "folder":
                    folders.append(str(entry["id"]))
                elif kind == "file":
                    try:
                        modified = parse_time(entry.get("modified_at"), "modified_at")
                    except MalformedDelivery:
                        modified = None
                    size = entry.get("size")
                    yield Listed(
                        key=str(entry["id"]),
                        etag=entry.get("sha1"),
                        size=size if isinstance(size, int) else None,
                        last_modified=modified,
                    )
            marker = page.get("next_marker")
            if not marker:
                break


LISTING = Listing("box", _add_arguments, _open, bucketless=True)
