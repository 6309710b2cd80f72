"""The S3 API's listing: AWS S3, MinIO, Supabase Storage's S3 endpoint, Backblaze B2's.

boto3 `list_objects_v2`, paginated (1,000 keys a page), under the instance's prefix on a path
boundary. It lists current versions only, so a versioned bucket compares its live objects
(noncurrent versions and delete markers are not listed). Credentials: the usual AWS chain
(`AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`, a profile, an instance role).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from datetime import UTC
from typing import Any

from connectors.reconcile.drift import Listed
from connectors.reconcile.listings import Listing, ListingError
from streams.config import InstanceConfig


def _add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--region", help="region of the bucket (default: the usual AWS chain)")


def s3_client(endpoint_url: str | None, region: str | None) -> Any:
    """A boto3 S3 client; path-style addressing for a custom endpoint (MinIO, Supabase)."""
    import boto3
    from botocore.config import Config

    config = Config(
        retries={"mode": "standard", "max_attempts": 5},
        s3={"addressing_style": "path"} if endpoint_url else {},
    )
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint_url, region_name=region, config=config
    )


def list_bucket(client: Any, bucket: str, prefix: str) -> Iterator[Listed]:
    """Every object of `bucket` under `prefix` (on a path boundary), page by page."""
    from botocore.exceptions import BotoCoreError, ClientError

    paginator = client.get_paginator("list_objects_v2")
    try:
        for page in paginator.paginate(Bucket=bucket, Prefix=f"{prefix}/" if prefix else ""):
            for item in page.get("Contents", []):
                modified = item.get("LastModified")
                yield Listed(
                    key=item["Key"],
                    etag=item.get("ETag"),
                    size=item.get("Size"),
                    last_modified=modified.astimezone(UTC) if modified is not None else None,
                )
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code, message = error.get("Code", "?"), str(error.get("Message", "")).replace("\n", " ")
        raise ListingError(f"listing bucket {bucket} failed: {code}: {message}") from None
    except BotoCoreError as exc:
        raise ListingError(f"listing bucket {bucket} failed: {exc}".replace("\n", " ")) from None


def _open(
    args: argparse.Namespace, instance: InstanceConfig, bucket: str | None
) -> Iterator[Listed]:
    assert bucket is not None
    return list_bucket(s3_client(args.endpoint_url, args.region), bucket, instance.prefix)


LISTING = Listing("s3", _add_arguments, _open)
