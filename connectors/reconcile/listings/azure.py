"""Azure Blob Storage's listing (azure-storage-blob `list_blobs`, List Blobs with a marker).

The bucket is the container (as in Event Grid events: streams.core.normalizers.azure); keys
are blob names under the instance's prefix. Without `include` it lists current blobs only
(no snapshots, versions or soft-deleted blobs), so a versioned container compares its live
blobs. ETags compare with the events' `eTag` (quotes stripped). Credentials as for the
azure-queue bridge: `--azure-connection-string-env VAR`, or `--azure-account-url URL` with
`--azure-credential-env VAR` (an account key or SAS token) or a SAS in the URL.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any

from connectors.reconcile.drift import Listed
from connectors.reconcile.listings import Listing, ListingError
from streams.config import ConfigError, InstanceConfig


def _add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--azure-connection-string-env",
        metavar="VAR",
        help="environment variable holding the storage account's connection string",
    )
    group.add_argument("--azure-account-url", help="the blob service URL (with a SAS, or ...)")
    group.add_argument(
        "--azure-credential-env",
        metavar="VAR",
        help="... environment variable holding an account key or SAS token",
    )


def _service(args: argparse.Namespace) -> Any:
    from azure.storage.blob import BlobServiceClient

    if args.azure_connection_string_env:
        value = os.environ.get(args.azure_connection_string_env)
        if not value:
            raise ConfigError(
                f"environment variable {args.azure_connection_string_env} "
                "(--azure-connection-string-env) is not set"
            )
        try:
            return BlobServiceClient.from_connection_string(value)
        except ValueError as exc:
            raise ConfigError(f"the connection string is not valid: {exc}") from None
    if args.azure_account_url:
        credential = None
        if args.azure_credential_env:
            credential = os.environ.get(args.azure_credential_env)
            if not credential:
                raise ConfigError(
                    f"environment variable {args.azure_credential_env} "
                    "(--azure-credential-env) is not set"
                )
        return BlobServiceClient(args.azure_account_url, credential=credential)
    raise ConfigError(
        "the azure listing needs --azure-connection-string-env VAR or --azure-account-url URL"
    )


def _open(
    args: argparse.Namespace, instance: InstanceConfig, bucket: str | None
) -> Iterator[Listed]:
    assert bucket is not None
    from azure.core.exceptions import AzureError, HttpResponseError

    container = _service(args).get_container_client(bucket)
    prefix = f"{instance.prefix}/" if instance.prefix else None
    try:
        for blob in container.list_blobs(name_starts_with=prefix, results_per_page=5000):
            yield Listed(
                key=blob.name,
                etag=blob.etag,
                size=blob.size,
                last_modified=blob.last_modified,
            )
    except HttpResponseError as exc:
        code = getattr(exc, "error_code", None) or exc.status_code
        message = (exc.reason or "").replace("\n", " ")
        raise ListingError(f"listing container {bucket} failed: {code}: {message}") from None
    except AzureError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ListingError(f"listing container {bucket} failed: {first}") from None


LISTING = Listing("azure", _add_arguments, _open)
