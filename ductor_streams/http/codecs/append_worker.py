"""Large append bodies are decoded and encoded in a child process, off the event loop.

msgspec holds the GIL for the whole of a decode or encode call, so a thread cannot keep
a large body's work off the event loop; a process can. ``encode_in_worker`` sends the
body to one of at most ``WORKERS`` children (append_child.py in a new interpreter,
started on first use, one set per event loop) and waits for the answer without
blocking. The children run ``append_body.encode_append``, the very function small
bodies run inline (or, for a Durable Streams JSON body, ``http/fronts/ds/media.json_batch``),
and send back the encoded batch or the domain error it raised. A
child exits when its stdin closes (the server stopped); one that fails mid-request is
killed, and the next request starts another.

Frames on the pipes, big-endian: request ``body length (u64), key length (i32, -1 for
none), kind (u8, ``KINDS``), key (UTF-8), body``; answer ``meta length (u64), meta,
texts length (u64), texts``: the meta is msgpack, ``{"hash", "key", "sizes"}`` or
``{"error", "detail"}``, the texts the payloads' compact JSON one after the other (their
byte sizes are ``sizes``). Both ways the bytes move a slice at a time: asyncio copies
what a pipe does not take at once into its buffer, and one 64 MiB copy alone holds the
loop for ~30 ms.
"""

from __future__ import annotations

import asyncio
import os
import struct
import sys
import weakref
from typing import Any

import msgspec

from ductor_streams.errors import (
    InvalidBatch,
    InvalidBody,
    InvalidIdempotencyKey,
    InvalidInput,
    RecordTooLarge,
    RequestTooLarge,
    StreamsError,
)
from ductor_streams.store.encoding import EncodedBatch

# A request body as read: bytes, or a view of the memory map a large one was read into
# (``http/fronts/records.py``, ``read_body``).
Body = bytes | memoryview

# Leave a core to the event loop; the children also run at a lower priority (niceness
# 10): the server's event loop and Postgres come first when the cores are busy.
WORKERS = max(1, min(2, (os.cpu_count() or 2) - 1))
_NICENESS = 10
# Texts turned back into ``str`` between two yields to the event loop.
_YIELD_BYTES = 4 * 1024 * 1024
_PIPE_LIMIT = 1024 * 1024
_PIPE_SLICE = 1024 * 1024
REQUEST_FRAME = struct.Struct(">QiB")
# What a child makes of a body: a native append body, or a DS JSON body (an append's,
# or a create's, where [] is allowed).
KINDS = ("native", "ds-append", "ds-create")
LENGTH_FRAME = struct.Struct(">Q")
# The errors ``encode_append`` raises, by code; any other answer is an internal error.
_ERRORS: dict[str, type[StreamsError]] = {
    cls.code: cls
    for cls in (
        InvalidBody,
        InvalidInput,
        InvalidBatch,
        InvalidIdempotencyKey,
        RecordTooLarge,
        RequestTooLarge,
    )
}


async def encode_in_worker(
    raw: Body, idempotency_key: str | None, kind: str = "native"
) -> EncodedBatch:
    """``append_body.encode_append(raw, idempotency_key)`` (or, by ``kind``, the DS
    JSON body's batch: ``http/fronts/ds/media.json_batch``), computed in a child process."""
    loop = asyncio.get_running_loop()
    pool = _pools.get(loop)
    if pool is None:
        pool = _pools[loop] = _Pool(WORKERS)
    meta, texts = await pool.exchange(raw, idempotency_key, KINDS.index(kind))
    return await _batch_from(meta, texts)


async def close_workers() -> None:
    """End this event loop's children (the app's shutdown)."""
    pool = _pools.pop(asyncio.get_running_loop(), None)
    if pool is not None:
        await pool.close()


class _Child:
    """One child process and its pipes; used by one request at a time."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls) -> _Child:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            # Not ``-m``: the package imports this module, and runpy would run it twice.
            # Lower priority first: the imports alone take a second of CPU.
            "-c",
            f"import os; os.nice({_NICENESS}); "
            "from ductor_streams.http.codecs.append_child import main; main()",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=_PIPE_LIMIT,
        )
        return cls(process)

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    async def exchange(
        self, raw: Body, idempotency_key: str | None, kind: int
    ) -> tuple[dict[str, Any], list[bytes]]:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        key = b"" if idempotency_key is None else idempotency_key.encode()
        stdin.write(REQUEST_FRAME.pack(len(raw), -1 if idempotency_key is None else len(key), kind))
        stdin.write(key)
        body = memoryview(raw)
        for start in range(0, len(raw), _PIPE_SLICE):
            stdin.write(body[start : start + _PIPE_SLICE])
            await stdin.drain()
        await stdin.drain()
        (meta_length,) = LENGTH_FRAME.unpack(await stdout.readexactly(LENGTH_FRAME.size))
        meta: dict[str, Any] = msgspec.msgpack.decode(await stdout.readexactly(meta_length))
        (texts_length,) = LENGTH_FRAME.unpack(await stdout.readexactly(LENGTH_FRAME.size))
        texts: list[bytes] = []
        while texts_length > 0:
            chunk = await stdout.read(min(_PIPE_SLICE, texts_length))
            if not chunk:
                raise asyncio.IncompleteReadError(b"", texts_length)
            texts.append(chunk)
            texts_length -= len(chunk)
        return meta, texts

    async def close(self) -> None:
        if self.alive:
            assert self.process.stdin is not None
            self.process.stdin.close()  # the child's read ends: it exits
            try:
                await asyncio.wait_for(self.process.wait(), 5)
            except TimeoutError:
                self.kill()

    def kill(self) -> None:
        if self.alive:
            self.process.kill()


class _Pool:
    """At most ``size`` children, each serving one request at a time."""

    def __init__(self, size: int) -> None:
        self._slots = asyncio.Semaphore(size)
        self._idle: list[_Child] = []

    async def exchange(
        self, raw: Body, idempotency_key: str | None, kind: int
    ) -> tuple[dict[str, Any], list[bytes]]:
        async with self._slots:
            child = None
            while self._idle and child is None:
                candidate = self._idle.pop()
                child = candidate if candidate.alive else None
            if child is None:
                child = await _Child.start()
            try:
                answer = await child.exchange(raw, idempotency_key, kind)
            except BaseException as exc:
                # A cancelled or failed exchange leaves the pipes mid-frame: never reuse.
                child.kill()
                if isinstance(exc, Exception):
                    # Unexpected: logged and answered 500 by the one error mapping.
                    raise RuntimeError("the append worker process failed") from exc
                raise
            self._idle.append(child)
            return answer

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for child in idle:
            await child.close()


_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = weakref.WeakKeyDictionary()


async def _batch_from(meta: dict[str, Any], texts: list[bytes]) -> EncodedBatch:
    """The child's answer as the batch, or its error raised. The texts arrive in slices
    that need not end where a payload does; they become ``str`` a few MiB at a time,
    with a yield in between."""
    if "error" in meta:
        if meta["error"] not in _ERRORS:
            raise RuntimeError(f"the append worker failed: {meta['detail']}")
        raise _ERRORS[meta["error"]](meta["detail"])
    payloads: list[str] = []
    chunks = iter(texts)
    chunk, offset, since_yield = b"", 0, 0
    for size in meta["sizes"]:
        parts: list[bytes] = []
        wanted = size
        while wanted > 0:
            if offset == len(chunk):
                chunk, offset = next(chunks), 0
            part = chunk[offset : offset + wanted]
            parts.append(part)
            offset += len(part)
            wanted -= len(part)
        payloads.append((parts[0] if len(parts) == 1 else b"".join(parts)).decode())
        since_yield += size
        if since_yield >= _YIELD_BYTES:
            since_yield = 0
            await asyncio.sleep(0)
    return EncodedBatch(payloads, meta["sizes"], [None] * len(payloads), meta["key"], meta["hash"])
