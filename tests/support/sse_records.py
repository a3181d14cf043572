"""Parsing of a ``text/event-stream`` response's ``record`` events as the bytes arrive,
chunked framing undone, each record timed by the bytes that completed it (its payload's
``t`` is when it was made). Used by the bench's SSE followers and by the tests that
check them.
"""

from __future__ import annotations

import json
from datetime import datetime


class RecordParser:
    """Undoes the chunked framing and parses the ``data:`` lines of ``record`` events;
    each record is timed by the arrival of the bytes that completed its event."""

    def __init__(self, *, chunked: bool) -> None:
        self.chunked = chunked
        self.raw = b""
        self.body = b""
        self.chunk_left = 0
        self.sequences: list[int] = []
        self.latencies: list[float] = []
        self.received: list[float] = []  # wall time each record arrived
        self.in_store: list[float] = []  # made -> its transaction began (appended_at)

    def feed(self, now: float, data: bytes) -> None:
        self.raw += data
        if self.chunked:
            self._dechunk()
        else:
            self.body, self.raw = self.body + self.raw, b""
        *frames, self.body = self.body.split(b"\n\n")
        for frame in frames:
            for line in frame.split(b"\n"):
                if line.startswith(b"data: "):
                    record = json.loads(line[6:])
                    if "sequence" in record:
                        self.sequences.append(record["sequence"])
                        made = record["payload"]["t"]
                        self.latencies.append((now - made) * 1000)
                        self.received.append(now)
                        appended = datetime.fromisoformat(record["appended_at"]).timestamp()
                        self.in_store.append((appended - made) * 1000)

    def _dechunk(self) -> None:
        while self.raw:
            if self.chunk_left == 0:
                end = self.raw.find(b"\r\n")
                if end < 0:
                    return
                line, self.raw = self.raw[:end], self.raw[end + 2 :]
                if line:  # else the CRLF that ends a chunk's data
                    self.chunk_left = int(line.split(b";")[0], 16)
                continue
            piece = self.raw[: self.chunk_left]
            self.body += piece
            self.raw = self.raw[len(piece) :]
            self.chunk_left -= len(piece)
