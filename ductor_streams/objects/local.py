"""A local folder as an object store (``file:///var/lib/ds``).

Writes go to ``<key>.part-<token>`` beside the final file, are fsynced, and are renamed
over the final name only once their evidence matches the pins (rename is atomic on one
file system). File work runs in threads; hashing happens there too (hashlib releases the
GIL on large buffers), so the event loop only moves ~1 MiB blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import AsyncIterable, AsyncIterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

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


def path_from_url(url: str) -> Path:
    parts = urlsplit(url)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        raise ValueError(f"not a local file:// URL: {url!r}")
    return Path(unquote(parts.path))


class LocalBlobStore:
    """Objects as files under one root folder."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.root = path_from_url(url)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise ValueError("a storage key must stay inside the store")
        return path

    async def write(
        self, key: str, chunks: AsyncIterable[bytes], *, pins: Pins, content_type: str
    ) -> Evidence:
        final = self._path(key)
        temp = self._path(temp_key(key, secrets.token_hex(6)))
        await asyncio.to_thread(final.parent.mkdir, parents=True, exist_ok=True)
        handle: BinaryIO = await asyncio.to_thread(open, temp, "xb")
        hasher = EvidenceHasher()
        try:
            await pump(blocks(chunks, pins), partial(_hash_and_write, hasher, handle))
            await asyncio.to_thread(_sync_and_close, handle)
            evidence = hasher.evidence()
            if not evidence.matches(pins):
                raise mismatch(pins, f"{evidence.size} bytes, sha256 {evidence.sha256}")
            await asyncio.to_thread(_promote, temp, final)
            return evidence
        finally:
            # Whatever went wrong (mismatch, disconnect, cancellation): keep nothing.
            handle.close()
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()

    async def check(self, key: str, pins: Pins, *, stored_md5: str | None) -> Check:
        # A file carries no digest of its own: measure what is there.
        evidence = await asyncio.to_thread(_measure, self._path(key))
        if evidence is None:
            return Check.MISSING
        return Check.MATCH if evidence.matches(pins) else Check.MISMATCH

    async def read(self, key: str, block_bytes: int = BLOCK_BYTES) -> AsyncIterator[bytes]:
        try:
            handle: BinaryIO = await asyncio.to_thread(open, self._path(key), "rb")
        except FileNotFoundError:
            raise NotFound("the object's bytes are not in the store") from None
        try:
            while block := await asyncio.to_thread(handle.read, block_bytes):
                yield block
        finally:
            handle.close()

    async def delete(self, key: str) -> None:
        path = self._path(key)
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(path.unlink)

    async def list_blobs(self, prefix: str = KEY_PREFIX) -> list[StoredBlob]:
        return await asyncio.to_thread(self._list, prefix)

    def _list(self, prefix: str) -> list[StoredBlob]:
        found: list[StoredBlob] = []
        base = self.root / prefix.rstrip("/")
        if not base.is_dir():
            return found
        for directory, _dirs, files in os.walk(base):
            for name in files:
                path = Path(directory) / name
                try:
                    mtime = path.stat().st_mtime
                except FileNotFoundError:
                    continue
                key = path.relative_to(self.root).as_posix()
                found.append(StoredBlob(key, datetime.fromtimestamp(mtime, UTC)))
        return found

    def signed_upload(
        self, key: str, *, content_type: str, expires_at: datetime
    ) -> SignedUpload | None:
        return None


def _hash_and_write(hasher: EvidenceHasher, handle: BinaryIO, block: bytes) -> None:
    hasher.update(block)
    handle.write(block)


def _sync_and_close(handle: BinaryIO) -> None:
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()


def _promote(temp: Path, final: Path) -> None:
    os.replace(temp, final)
    # The rename itself must survive a crash: sync the directory entry.
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _measure(path: Path) -> Evidence | None:
    hasher = EvidenceHasher()
    try:
        with open(path, "rb") as handle:
            while block := handle.read(BLOCK_BYTES):
                hasher.update(block)
    except FileNotFoundError:
        return None
    return hasher.evidence()
