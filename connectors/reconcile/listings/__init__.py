"""The listing providers reconcile can compare with: one module each, named in `LISTINGS`.

A module defines `LISTING` (a `Listing`): its options and `open`, which returns an iterator
of `Listed` (the live objects only: noncurrent versions, snapshots and trashed items are not
listed) under the instance's prefix. Errors surface as `ListingError` with one line; an
iterator that fails part-way makes the whole run publish nothing (see `connectors.reconcile`).
Client libraries are imported inside `open`, so `python -m connectors --help` stays quick.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from connectors.reconcile.drift import Listed
from streams.config import ConfigError, InstanceConfig

LISTINGS = {
    "s3": "connectors.reconcile.listings.s3",
    "gcs": "connectors.reconcile.listings.gcs",
    "azure": "connectors.reconcile.listings.azure",
    "box": "connectors.reconcile.listings.box",
    "cloudinary": "connectors.reconcile.listings.cloudinary",
    "appwrite": "connectors.reconcile.listings.appwrite",
}
"""Listing name -> module."""

SOURCE_LISTINGS = {
    "s3": "s3",
    "eventbridge": "s3",
    "minio": "s3",
    "supabase": "s3",  # Supabase Storage's S3 endpoint
    "b2": "s3",  # Backblaze B2's S3-compatible endpoint
    "gcs": "gcs",
    "azure": "azure",
    "box": "box",
    "cloudinary": "cloudinary",
    "appwrite": "appwrite",
}
"""An instance's source -> the listing that sees its objects (the default of `--provider`)."""


class ListingError(Exception):
    """Listing failed, as one line (credentials, a missing bucket, a bad page)."""


@dataclass(frozen=True)
class Listing:
    name: str
    add_arguments: Callable[[argparse._ArgumentGroup], None]
    open: Callable[[argparse.Namespace, InstanceConfig, str | None], Iterator[Listed]]
    """(args, instance, bucket) -> the live objects under the instance's prefix."""
    bucketless: bool = False
    """The provider has no buckets (its events name none): reconcile compares bucket None."""


def listing(name: str) -> Listing:
    module = importlib.import_module(LISTINGS[name])
    found: Listing = module.LISTING
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--provider",
        choices=sorted(set(LISTINGS) | set(SOURCE_LISTINGS)),
        help="whose listing to compare with (default: from the instance's one source, else s3)",
    )
    for name in LISTINGS:
        group = parser.add_argument_group(f"{name} listing")
        listing(name).add_arguments(group)


def chosen(args: argparse.Namespace, instance: InstanceConfig) -> Listing:
    """`--provider`, else the listing of the instance's one source, else the S3 API."""
    name = args.provider or instance.reconciled_source or "s3"
    if name not in SOURCE_LISTINGS:
        raise ConfigError(
            f"instance {instance.name!r}: no listing for source {name!r}; pass --provider "
            f"({', '.join(sorted(LISTINGS))})"
        )
    return listing(SOURCE_LISTINGS[name])
