"""Google Cloud Storage as an object store (``gs://bucket`` or ``gs://bucket/prefix``).

The client library is synchronous, so every call runs in a thread. Uploads stream to a
temporary object through a resumable session (``BLOCK_BYTES``-sized writes, one
``UPLOAD_CHUNK`` buffered by the library), hashed on the way; when SHA-256 and size match
the pins and the MD5 GCS computed equals ours, the object is copied server-side to its
final name and the temporary one removed. Commit then trusts GCS's own MD5 of the final
object when it equals the MD5 recorded at upload, and otherwise (bytes PUT through a
signed URL) downloads and hashes them.

Signed upload URLs are handed out only when the URL asks for them
(``gs://bucket?signed_uploads=1``) and credentials that can sign are available from
``GOOGLE_APPLICATION_CREDENTIALS`` (a service-account key file).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
from collections.abc import AsyncIterable, AsyncIterator
from datetime import UTC, datetime
from functools import partial
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ductor_streams.compat.gcs import abandon_upload
from ductor_streams.errors import NotFound
from ductor_streams.objects.blobstore import (
    BLOCK_BYTES,
    KEY_PREFIX,
    Check,
    Evidence,
    EvidenceHasher,
    Pins,
    SignedUpload,
    StoredBlob,
    blocks,
    mismatch,
    pump,
    temp_key,
)

# A multiple of 256 KiB, as resumable uploads require; the library buffers one of these.
UPLOAD_CHUNK = 4 * 1024 * 1024


def _md5_hex(b64: str | None) -> str | None:
    return base64.b64decode(b64).hex() if b64 else None


class GcsBlobStore:
    """Objects in one bucket (under an optional prefix)."""

    def __init__(
        self,
        url: str,
        *,
        client: Any | None = None,
        signer: Any | None = None,
        credentials_file: str | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "gs" or not parts.netloc:
            raise ValueError(f"not a gs:// URL: {url!r}")
        self.url = url
        self.bucket_name = parts.netloc
        self.prefix = parts.path.strip("/") + "/" if parts.path.strip("/") else ""
        options = parse_qs(parts.query)
        self._want_signed = options.get("signed_uploads", ["0"])[0].lower() in ("1", "true")
        self._client = client
        self._signer = signer
        self._credentials_file = credentials_file
        self._bucket: Any | None = None

    def _get_bucket(self) -> Any:
        if self._bucket is None:
            from google.cloud import storage

            if self._client is None:
                self._client = storage.Client()
            self._bucket = self._client.bucket(self.bucket_name)
        return self._bucket

    def _name(self, key: str) -> str:
        return self.prefix + key

    async def write(
        self, key: str, chunks: AsyncIterable[bytes], *, pins: Pins, content_type: str
    ) -> Evidence:
        bucket = await asyncio.to_thread(self._get_bucket)
        temp = bucket.blob(self._name(temp_key(key, secrets.token_hex(6))))
        writer = await asyncio.to_thread(
            temp.open, "wb", chunk_size=UPLOAD_CHUNK, content_type=content_type
        )
        hasher = EvidenceHasher(md5=True)
        written = False
        try:
            await pump(blocks(chunks, pins), partial(_hash_and_write, hasher, writer))
            await asyncio.to_thread(writer.close)
            written = True
            evidence = hasher.evidence()
            if not evidence.matches(pins):
                raise mismatch(pins, f"{evidence.size} bytes, sha256 {evidence.sha256}")
            await asyncio.to_thread(self._promote, bucket, temp, key, evidence)
            return evidence
        finally:
            if not written:
                # An unfinished resumable session leaves no object behind.
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(abandon_upload, writer)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(_delete_blob, temp)

    def _promote(self, bucket: Any, temp: Any, key: str, evidence: Evidence) -> None:
        temp.reload()
        if temp.size != evidence.size or _md5_hex(temp.md5_hash) != evidence.md5:
            raise mismatch(Pins(evidence.size, evidence.sha256), "altered on the way to GCS")
        final = bucket.copy_blob(temp, bucket, self._name(key))
        final.reload()
        if final.size != evidence.size or _md5_hex(final.md5_hash) != evidence.md5:
            raise mismatch(Pins(evidence.size, evidence.sha256), "altered when promoted")

    async def check(self, key: str, pins: Pins, *, stored_md5: str | None) -> Check:
        return await asyncio.to_thread(self._check, key, pins, stored_md5)

    def _check(self, key: str, pins: Pins, stored_md5: str | None) -> Check:
        blob = self._get_bucket().get_blob(self._name(key))
        if blob is None:
            return Check.MISSING
        if blob.size != pins.size:
            return Check.MISMATCH
        if stored_md5 is not None and _md5_hex(blob.md5_hash) == stored_md5:
            # GCS's own digest of what it holds equals the digest of the bytes whose
            # SHA-256 was verified at upload: they are those bytes.
            return Check.MATCH
        hasher = EvidenceHasher()
        with blob.open("rb", chunk_size=BLOCK_BYTES * 4) as reader:
            while block := reader.read(BLOCK_BYTES):
                hasher.update(block)
        return Check.MATCH if hasher.evidence().matches(pins) else Check.MISMATCH

    async def read(self, key: str, block_bytes: int = BLOCK_BYTES) -> AsyncIterator[bytes]:
        blob = await asyncio.to_thread(self._get_bucket().get_blob, self._name(key))
        if blob is None:
            raise NotFound("the object's bytes are not in the store")
        # The reader buffers a chunk (a multiple of 256 KiB) ahead of the blocks.
        chunk = -(-block_bytes * 4 // (256 * 1024)) * 256 * 1024
        reader = await asyncio.to_thread(blob.open, "rb", chunk_size=chunk)
        try:
            while block := await asyncio.to_thread(reader.read, block_bytes):
                yield block
        finally:
            reader.close()

    async def delete(self, key: str) -> None:
        bucket = await asyncio.to_thread(self._get_bucket)
        await asyncio.to_thread(_delete_blob, bucket.blob(self._name(key)))

    async def list_blobs(self, prefix: str = KEY_PREFIX) -> list[StoredBlob]:
        return await asyncio.to_thread(self._list, prefix)

    def _list(self, prefix: str) -> list[StoredBlob]:
        bucket = self._get_bucket()
        found = []
        for blob in bucket.client.list_blobs(bucket, prefix=self._name(prefix)):
            updated = blob.updated or datetime.now(UTC)
            found.append(StoredBlob(blob.name[len(self.prefix) :], updated))
        return found

    def _signing_credentials(self) -> Any | None:
        if not self._want_signed:
            return None
        if self._signer is None:
            path = self._credentials_file
            if not path:
                return None
            from google.oauth2 import service_account

            self._signer = service_account.Credentials.from_service_account_file(path)
        return self._signer

    def signed_upload(
        self, key: str, *, content_type: str, expires_at: datetime
    ) -> SignedUpload | None:
        signer = self._signing_credentials()
        if signer is None:
            return None
        blob = self._get_bucket().blob(self._name(key))
        url = blob.generate_signed_url(
            version="v4",
            expiration=expires_at,
            method="PUT",
            content_type=content_type,
            credentials=signer,
        )
        return SignedUpload("PUT", url, {"Content-Type": content_type})


def _hash_and_write(hasher: EvidenceHasher, writer: Any, block: bytes) -> None:
    hasher.update(block)
    writer.write(block)


def _delete_blob(blob: Any) -> None:
    from google.api_core.exceptions import NotFound as GcsNotFound

    with contextlib.suppress(GcsNotFound):
        blob.delete()
