"""The one small interface every object store implements, and what the adapters share.

Keys are chosen by the server (``storage_key``), never by a client. An upload goes to a
temporary key first and is hashed on the way; only bytes whose size and SHA-256 match the
intent's pins are promoted to the final key, so the final key never holds unverified
bytes written through this service.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Protocol

from ductor_streams.errors import ObjectEvidenceMismatch

KEY_PREFIX = "ductor-streams/"
TEMP_MARK = ".part-"
# Request chunks are gathered into blocks of about this size before a store write:
# few thread hops, and never more than a block or two in memory per upload.
BLOCK_BYTES = 1024 * 1024
_KEY = re.compile(r"^ductor-streams/(\d+)/([0-9a-f-]{36})(\.part-[0-9a-f]+)?$")


def storage_key(stream_pk: int, object_id: uuid.UUID) -> str:
    """The server-owned key of an object: it names its stream, for legal hold checks."""
    return f"{KEY_PREFIX}{stream_pk}/{object_id}"


def temp_key(key: str, token: str) -> str:
    return f"{key}{TEMP_MARK}{token}"


@dataclass(frozen=True, slots=True)
class ParsedKey:
    stream_pk: int
    object_id: uuid.UUID
    temporary: bool

    @property
    def final_key(self) -> str:
        return storage_key(self.stream_pk, self.object_id)


def parse_key(key: str) -> ParsedKey | None:
    """The parts of a key this service wrote, or None for anything else."""
    match = _KEY.fullmatch(key)
    if match is None:
        return None
    try:
        object_id = uuid.UUID(match.group(2))
    except ValueError:
        return None
    return ParsedKey(int(match.group(1)), object_id, match.group(3) is not None)


@dataclass(frozen=True, slots=True)
class Pins:
    """What the stored bytes must be: the evidence pinned at prepare."""

    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class Evidence:
    """What some bytes were measured to be (hex digests)."""

    size: int
    sha256: str
    md5: str | None  # only for stores that report an MD5 of their own (GCS)

    def matches(self, pins: Pins) -> bool:
        return self.size == pins.size and self.sha256 == pins.sha256


class Check(Enum):
    """What a store holds at a key, against the pins."""

    MATCH = "match"
    MISMATCH = "mismatch"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class StoredBlob:
    key: str
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class SignedUpload:
    """Where a client may PUT the bytes straight into the store."""

    method: str
    url: str
    headers: dict[str, str]


class EvidenceHasher:
    """SHA-256 (the pin), optionally MD5 (what GCS reports of what it holds), and the
    byte count, fed as bytes pass. MD5 is half the speed of SHA-256 here (SHA-NI), so
    only stores that can compare it pay for it."""

    def __init__(self, *, md5: bool = False) -> None:
        self._sha256 = hashlib.sha256()
        self._md5 = hashlib.md5(usedforsecurity=False) if md5 else None
        self.size = 0

    def update(self, block: bytes) -> None:
        self._sha256.update(block)
        if self._md5 is not None:
            self._md5.update(block)
        self.size += len(block)

    def evidence(self) -> Evidence:
        md5 = self._md5.hexdigest() if self._md5 is not None else None
        return Evidence(self.size, self._sha256.hexdigest(), md5)


def mismatch(pins: Pins, seen: str) -> ObjectEvidenceMismatch:
    return ObjectEvidenceMismatch(
        f"the bytes ({seen}) do not match the pins ({pins.size} bytes, sha256 {pins.sha256})"
    )


async def blocks(chunks: AsyncIterable[bytes], pins: Pins) -> AsyncIterator[bytes]:
    """Regroup chunks into blocks of about BLOCK_BYTES; stop as soon as the bytes pass
    the pinned size (the rest is never read)."""
    parts: list[bytes] = []
    pending = 0
    total = 0
    async for chunk in chunks:
        if not chunk:
            continue
        total += len(chunk)
        if total > pins.size:
            raise mismatch(pins, f"more than {pins.size} bytes")
        parts.append(chunk)
        pending += len(chunk)
        if pending >= BLOCK_BYTES:
            yield b"".join(parts)
            parts.clear()
            pending = 0
    if parts:
        yield b"".join(parts)


async def pump(source: AsyncIterable[bytes], sink: Callable[[bytes], None]) -> None:
    """Feed each block of ``source`` to ``sink`` in a worker thread, in order, receiving
    the next block while the thread hashes and writes the previous one. At most two
    blocks are held at once; the thread is always finished before this returns or
    raises, so the caller may close what ``sink`` writes to."""
    pending: asyncio.Future[None] | None = None
    try:
        async for block in source:
            if pending is not None:
                await pending
            pending = asyncio.ensure_future(asyncio.to_thread(sink, block))
        if pending is not None:
            await pending
    finally:
        if pending is not None and not pending.done():
            # A thread cannot be cancelled: let the write in flight finish first.
            with contextlib.suppress(BaseException):
                await asyncio.shield(pending)


class BlobStore(Protocol):
    """An object store of one region."""

    url: str

    async def write(
        self, key: str, chunks: AsyncIterable[bytes], *, pins: Pins, content_type: str
    ) -> Evidence:
        """Stream ``chunks`` to the store, hashing on the way; promote them to ``key``
        only if they match ``pins``, else keep nothing and raise ObjectEvidenceMismatch."""
        ...

    async def check(self, key: str, pins: Pins, *, stored_md5: str | None) -> Check:
        """Whether what the store holds at ``key`` matches ``pins``. ``stored_md5`` is the
        MD5 recorded when the bytes were verified at upload, if they were."""
        ...

    def read(self, key: str, block_bytes: int = BLOCK_BYTES) -> AsyncIterator[bytes]:
        """The bytes at ``key``, in blocks of at most ``block_bytes`` (NotFound when
        absent); each block is read when the last one has been taken."""
        ...

    async def delete(self, key: str) -> None:
        """Remove ``key``; removing what is absent is not an error."""
        ...

    async def list_blobs(self, prefix: str = KEY_PREFIX) -> list[StoredBlob]:
        """Every key under ``prefix``, with its last modification time."""
        ...

    def signed_upload(
        self, key: str, *, content_type: str, expires_at: datetime
    ) -> SignedUpload | None:
        """A URL a client may PUT the bytes to directly, when the store can sign one."""
        ...
