"""Appwrite's listing: `GET /storage/buckets/{bucketId}/files` (Storage "List files").

Server auth: the headers `X-Appwrite-Project` (`--appwrite-project`) and `X-Appwrite-Key`
(an API key with `files.read`, from the environment variable `--appwrite-key-env`, default
APPWRITE_API_KEY); `--endpoint-url` is the API root (default https://cloud.appwrite.io/v1;
a self-hosted server's `https://HOST/v1`). Pages are cursor-based: `queries[]` holds
`Query.limit(100)` (`--appwrite-page-size`) and, after the first page,
`Query.cursorAfter(<last $id>)`, in the JSON form the SDKs send
(`{"method":"limit","values":[100]}`, Appwrite 1.5 and later); the walk ends with a page
shorter than the limit. The answer is `{"total": N, "files": [File, ...]}`. Appwrite keeps
no versions, so the listing is of live files. As in Appwrite's webhooks
(streams.core.normalizers.appwrite) the bucket is the bucket id, the key the file's `$id`
and the ETag its `signature` (the content MD5).
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.parse
from collections.abc import Iterator

from connectors.reconcile.drift import Listed
from connectors.reconcile.listings import Listing, ListingError
from connectors.reconcile.listings.rest import get_json
from streams.config import ConfigError, InstanceConfig
from streams.core.normalizers.base import MalformedDelivery, parse_time

API = "https://cloud.appwrite.io/v1"
PAGE = 100


def _add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--appwrite-project", help="the project id (X-Appwrite-Project)")
    group.add_argument(
        "--appwrite-key-env",
        metavar="VAR",
        default="APPWRITE_API_KEY",
        help="environment variable holding the API key (default APPWRITE_API_KEY)",
    )
    group.add_argument(
        "--appwrite-page-size", type=int, default=PAGE, help="files per page (default 100)"
    )


def query(method: str, *values: str | int) -> str:
    return json.dumps({"method": method, "values": list(values)}, separators=(",", ":"))


def _open(
    args: argparse.Namespace, instance: InstanceConfig, bucket: str | None
) -> Iterator[Listed]:
    assert bucket is not None
    key = os.environ.get(args.appwrite_key_env)
    if not key:
        raise ConfigError(
            f"environment variable {args.appwrite_key_env} (--appwrite-key-env) is not set"
        )
    if not args.appwrite_project:
        raise ConfigError("the appwrite listing needs --appwrite-project")
    base = (args.endpoint_url or API).rstrip("/")
    headers = {"X-Appwrite-Project": args.appwrite_project, "X-Appwrite-Key": key}
    url = f"{base}/storage/buckets/{urllib.parse.quote(bucket, safe='')}/files"
    after: str | None = None
    while True:
        queries = [("queries[]", query("limit", args.appwrite_page_size))]
        if after is not None:
            queries.append(("queries[]", query("cursorAfter", after)))
        page = get_json(
            f"listing Appwrite bucket {bucket}", f"{url}?{urllib.parse.urlencode(queries)}", headers
        )
        if not isinstance(page, dict) or not isinstance(page.get("files"), list):
            raise ListingError(f"listing Appwrite bucket {bucket}: no `files` in the answer")
        files = page["files"]
        for document in files:
            try:
                updated = parse_time(document.get("$updatedAt"), "$updatedAt")
            except MalformedDelivery:
                updated = None
            size = document.get("sizeOriginal")
            signature = document.get("signature")
            yield Listed(
                key=str(document["$id"]),
                etag=signature if isinstance(signature, str) else None,
                size=size if isinstance(size, int) else None,
                last_modified=updated,
            )
        if len(files) < args.appwrite_page_size:
            break
        after = str(files[-1]["$id"])


LISTING = Listing("appwrite", _add_arguments, _open)
