"""The object store of each region, from ``Settings.object_stores`` (region -> URL)."""

from __future__ import annotations

from collections.abc import Mapping

from ductor_streams.errors import PlacementMismatch
from ductor_streams.objects.blobstore import BlobStore
from ductor_streams.objects.gcs import GcsBlobStore
from ductor_streams.objects.local import LocalBlobStore


def open_store(url: str, *, credentials_file: str | None = None) -> BlobStore:
    """The adapter for one store URL: ``file://`` or ``gs://``. ``credentials_file`` is a
    service account key that signs upload URLs (``GOOGLE_APPLICATION_CREDENTIALS``)."""
    if url.startswith("file://"):
        return LocalBlobStore(url)
    if url.startswith("gs://"):
        return GcsBlobStore(url, credentials_file=credentials_file)
    raise ValueError(f"unsupported object store URL {url!r}")


class BlobStores:
    """Opens each region's store once, on first use (a GCS client is made only when a
    ``gs://`` region is used)."""

    def __init__(self, urls: Mapping[str, str], *, credentials_file: str | None = None) -> None:
        self._urls = dict(urls)
        self._credentials_file = credentials_file
        self._open: dict[str, BlobStore] = {}

    @property
    def regions(self) -> list[str]:
        return sorted(self._urls)

    def has(self, region: str) -> bool:
        return region in self._urls

    def for_region(self, region: str) -> BlobStore:
        store = self._open.get(region)
        if store is None:
            url = self._urls.get(region)
            if url is None:
                raise PlacementMismatch(f"no object store is configured for region {region!r}")
            store = self._open[region] = open_store(url, credentials_file=self._credentials_file)
        return store

    def put(self, region: str, store: BlobStore) -> None:
        """Use ``store`` for ``region`` (tests hand in a store with its own client)."""
        self._urls[region] = store.url
        self._open[region] = store
