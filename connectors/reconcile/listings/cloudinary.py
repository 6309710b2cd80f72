"""Cloudinary's listing: the Admin API's `GET /resources/{resource_type}/{type}`.

Basic auth with the API key and secret, from a `cloudinary://<key>:<secret>@<cloud_name>`
URL in the environment variable `--cloudinary-url-env` (default CLOUDINARY_URL, the SDKs'
convention); `--endpoint-url` replaces https://api.cloudinary.com/v1_1. Pages of
`max_results=500` (the maximum), each asking for the next with the last answer's
`next_cursor` until there is none (cloudinary.com/documentation, "Get resources").
Cloudinary keeps no noncurrent versions under a public id, so the listing is of live assets.

Keys are built as in Cloudinary's notifications (streams.core.normalizers.cloudinary):
`{resource_type}/{type}/{public_id}`, and the instance's prefix picks the resource and
delivery types (`image/upload/...` lists only those, with the rest as the `prefix` parameter);
otherwise every resource type of `--cloudinary-resource-types` (default image,video,raw) and
delivery type of `--cloudinary-types` (default upload) is listed. The ETag is the asset's
`etag` where the answer carries one (otherwise only presence is compared); Cloudinary has no
bucket.
"""

from __future__ import annotations

import argparse
import base64
import os
import urllib.parse
from collections.abc import Iterator

from connectors.reconcile.drift import Listed
from connectors.reconcile.listings import Listing, ListingError
from connectors.reconcile.listings.rest import get_json
from streams.config import ConfigError, InstanceConfig
from streams.core.normalizers.base import MalformedDelivery, parse_time

API = "https://api.cloudinary.com/v1_1"
PAGE = 500


def _add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--cloudinary-url-env",
        metavar="VAR",
        default="CLOUDINARY_URL",
        help="environment variable holding cloudinary://KEY:SECRET@CLOUD (default CLOUDINARY_URL)",
    )
    group.add_argument("--cloudinary-resource-types", default="image,video,raw")
    group.add_argument("--cloudinary-types", default="upload", help="delivery types to list")


def credentials(url: str | None, variable: str) -> tuple[str, str, str]:
    """(cloud name, API key, API secret) from a cloudinary:// URL."""
    parsed = urllib.parse.urlsplit(url or "")
    if parsed.scheme != "cloudinary" or not (parsed.hostname and parsed.username):
        raise ConfigError(
            f"environment variable {variable} (--cloudinary-url-env) must hold "
            "cloudinary://API_KEY:API_SECRET@CLOUD_NAME"
        )
    return (
        parsed.hostname,
        urllib.parse.unquote(parsed.username),
        urllib.parse.unquote(parsed.password or ""),
    )


def _scopes(args: argparse.Namespace, prefix: str) -> list[tuple[str, str, str | None]]:
    """(resource type, delivery type, public-id prefix) to list for the instance's prefix."""
    parts = prefix.split("/", 2) if prefix else []
    resource_types = parts[:1] or args.cloudinary_resource_types.split(",")
    types = parts[1:2] or args.cloudinary_types.split(",")
    public_prefix = f"{parts[2]}/" if len(parts) == 3 else None
    return [(r, t, public_prefix) for r in resource_types for t in types]


def _open(
    args: argparse.Namespace, instance: InstanceConfig, bucket: str | None
) -> Iterator[Listed]:
    cloud, key, secret = credentials(
        os.environ.get(args.cloudinary_url_env), args.cloudinary_url_env
    )
    base = (args.endpoint_url or API).rstrip("/")
    auth = base64.b64encode(f"{key}:{secret}".encode()).decode()
    headers = {"Authorization": f"Basic {auth}"}
    for resource_type, delivery_type, public_prefix in _scopes(args, instance.prefix):
        cursor: str | None = None
        what = f"listing Cloudinary {resource_type}/{delivery_type}"
        while True:
            query = {"max_results": str(PAGE)}
            if public_prefix:
                query["prefix"] = public_prefix
            if cursor:
                query["next_cursor"] = cursor
            path = "/".join(
                urllib.parse.quote(p, safe="")
                for p in (cloud, "resources", resource_type, delivery_type)
            )
            page = get_json(what, f"{base}/{path}?{urllib.parse.urlencode(query)}", headers)
            if not isinstance(page, dict) or not isinstance(page.get("resources"), list):
                raise ListingError(f"{what}: no `resources` in the answer")
            for resource in page["resources"]:
                try:
                    created = parse_time(resource.get("created_at"), "created_at")
                except MalformedDelivery:
                    created = None
                size = resource.get("bytes")
                etag = resource.get("etag")
                yield Listed(
                    key="/".join(
                        (
                            str(resource.get("resource_type") or resource_type),
                            str(resource.get("type") or delivery_type),
                            str(resource["public_id"]),
                        )
                    ),
                    etag=etag if isinstance(etag, str) else None,
                    size=size if isinstance(size, int) else None,
                    last_modified=created,
                )
            cursor = page.get("next_cursor")
            if not cursor:
                break


LISTING = Listing("cloudinary", _add_arguments, _open, bucketless=True)
