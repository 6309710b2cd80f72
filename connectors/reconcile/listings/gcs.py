"""Google Cloud Storage's listing (google-cloud-storage `list_blobs`, JSON API `objects.list`).

Paginated by the client (`nextPageToken`), under the instance's prefix on a path boundary.
Without `versions=True` it lists live objects only, so a versioned bucket compares its live
generations. Keys are object names, raw; the ETag is the object resource's `etag`, exactly
what the Pub/Sub notification's payload carries (streams.core.normalizers.gcs). Credentials:
Application Default Credentials; `--endpoint-url` points at an emulator (no credentials).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from connectors.reconcile.drift import Listed
from connectors.reconcile.listings import Listing, ListingError
from streams.config import InstanceConfig


def _add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--gcs-project", help="the Google Cloud project (default: from ADC)")


def _open(
    args: argparse.Namespace, instance: InstanceConfig, bucket: str | None
) -> Iterator[Listed]:
    assert bucket is not None
    from google.api_core.exceptions import GoogleAPIError
    from google.auth.exceptions import GoogleAuthError
    from google.cloud import storage

    try:
        if args.endpoint_url:  # an emulator: anonymous
            from google.auth.credentials import AnonymousCredentials

            client = storage.Client(
                project=args.gcs_project or "reconcile",
                credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
                client_options={"api_endpoint": args.endpoint_url},
            )
        else:
            client = storage.Client(project=args.gcs_project)
    except GoogleAuthError as exc:
        raise ListingError(f"no Google Cloud credentials: {exc}") from None

    prefix = f"{instance.prefix}/" if instance.prefix else None
    try:
        for blob in client.list_blobs(bucket, prefix=prefix, page_size=1000):
            yield Listed(
                key=blob.name,
                etag=blob.etag,
                size=blob.size,
                last_modified=blob.updated,
            )
    except (GoogleAPIError, GoogleAuthError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ListingError(f"listing bucket {bucket} failed: {message}") from None


LISTING = Listing("gcs", _add_arguments, _open)
