"""The child process of the append workers (append_worker.py): reads requests from stdin,
encodes each body as the server would inline (``append_body.encode_append``, or a
Durable Streams JSON body's ``json_batch``), and writes the answer to stdout. Started
as ``python -c "from ductor_streams.http.codecs.append_child import main; main()"``."""

from __future__ import annotations

import sys
from typing import Any, BinaryIO

import msgspec

from ductor_streams.errors import StreamsError
from ductor_streams.http.codecs.append_body import encode_append
from ductor_streams.http.codecs.append_worker import KINDS, LENGTH_FRAME, REQUEST_FRAME
from ductor_streams.http.fronts.ds.media import json_batch


def answer(raw: bytes, idempotency_key: str | None, kind: int = 0) -> bytes:
    """The child's answer to one request: the frames after the request's."""
    texts = b""
    try:
        if KINDS[kind] == "native":
            batch = encode_append(raw, idempotency_key)
        else:
            batch = json_batch(raw, create=KINDS[kind] == "ds-create")
    except StreamsError as exc:
        meta: dict[str, Any] = {"error": exc.code, "detail": exc.detail}
    except Exception as exc:  # reported, not raised: the child serves the next request
        meta = {"error": "internal_error", "detail": type(exc).__name__}
    else:
        meta = {"hash": batch.request_hash, "key": batch.idempotency_key, "sizes": batch.sizes}
        texts = "".join(batch.payloads).encode()
    packed = msgspec.msgpack.encode(meta)
    return LENGTH_FRAME.pack(len(packed)) + packed + LENGTH_FRAME.pack(len(texts)) + texts


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    data = stream.read(size)
    if len(data) < size:
        return None  # the server closed the pipe: stop
    return data


def main() -> None:
    """The child: answer requests from stdin on stdout until stdin closes."""
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the answer pipe
    while (header := _read_exactly(requests, REQUEST_FRAME.size)) is not None:
        body_length, key_length, kind = REQUEST_FRAME.unpack(header)
        key = b"" if key_length <= 0 else _read_exactly(requests, key_length)
        raw = _read_exactly(requests, body_length) if body_length else b""
        if key is None or raw is None:
            return
        answers.write(answer(raw, None if key_length < 0 else key.decode(), kind))
        answers.flush()
