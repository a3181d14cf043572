"""Large objects: intents (``intents.ObjectService``: prepare, upload, commit, abort,
download) and the blob stores behind one small interface (``local.py`` for file://,
``gcs.py`` for gs://). The service is imported from its module, so that maintenance can
use the stores without importing the service that uses maintenance."""

from ductor_streams.objects.blobstore import BlobStore, Check, Evidence, Pins, SignedUpload
from ductor_streams.objects.models import MAX_OBJECT_BYTES, ObjectIntent, PrepareRequest
from ductor_streams.objects.stores import BlobStores, open_store

__all__ = [
    "MAX_OBJECT_BYTES",
    "BlobStore",
    "BlobStores",
    "Check",
    "Evidence",
    "ObjectIntent",
    "Pins",
    "PrepareRequest",
    "SignedUpload",
    "open_store",
]
