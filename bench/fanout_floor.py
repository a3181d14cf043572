"""The fan-out floor: the least a Python process can do to hand an append to N subscribers.

    python -m bench.fanout_floor serve --port PORT [--host 127.0.0.1]

A stand-in for ``ductor-streams serve`` with no database, no framework and no checks:
one uvloop process with raw asyncio protocols that speaks just enough HTTP/1.1 for
``bench.sse_latency`` (its subscribers, its raw producer and its httpx client). An append
(``POST .../records``) takes the next sequence and answers 201 with it; at the end of
that turn of the event loop, the ``record`` events of every append read in it go to each
subscriber's transport as one chunk (framed once, one ``transport.write`` each). A subscribe
(``GET .../subscribe``) gets the response head and joins the fan-out; ``POST .../close``
sends ``end`` to everyone; ``GET /healthz`` answers 200. It takes ``serve``'s command
line, so ``tests.support.server.ServerProcess(module="bench.fanout_floor")`` starts it
like the real server. ``GET /metrics`` gives the two counters ``bench.sse_latency``
divides by (batches fanned out, chunk writes), so its per-write CPU column means the same.

What ``bench.sse_latency`` measures against it is this machine's own cost of the socket
writes and of the subscribers' reads: the part of the real server's latency that no
Python server in one process can take out.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import uvloop

_HEAD_END = b"\r\n\r\n"
_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def _chunk(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(body), body)


def _answer(status: int, body: bytes, content_type: bytes = b"application/json") -> bytes:
    reason = {200: b"OK", 201: b"Created", 404: b"Not Found"}[status]
    return b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        reason,
        content_type,
        len(body),
        body,
    )


class _Streams:
    """Every stream's subscribers and last sequence (one process, no persistence)."""

    def __init__(self) -> None:
        self.subscribers: dict[str, list[asyncio.Transport]] = {}
        self.sequences: dict[str, int] = {}
        self.fan_outs = 0
        self.writes = 0
        self._pending: dict[str, list[bytes]] = {}

    def append(self, stream: str, payload: bytes) -> int:
        """Take the next sequence; its event goes out with the others of this turn."""
        sequence = self.sequences.get(stream, 0) + 1
        self.sequences[stream] = sequence
        pending = self._pending.setdefault(stream, [])
        pending.append(b"id: %d\nevent: record\ndata: %s\n\n" % (sequence, payload))
        if len(self._pending) == 1 and len(pending) == 1:
            asyncio.get_running_loop().call_soon(self._flush)
        return sequence

    def _flush(self) -> None:
        # Appends read in one turn of the loop go out as one chunk: while a round of
        # writes holds the loop, the next appends wait in their sockets, and the round
        # after takes them all (as the real fan-out batches what came meanwhile).
        pending, self._pending = self._pending, {}
        for stream, events in pending.items():
            frame = _chunk(b"".join(events))
            subscribers = self.subscribers.get(stream, ())
            for transport in subscribers:
                transport.write(frame)
            self.fan_outs += 1
            self.writes += len(subscribers)

    def close(self, stream: str) -> None:
        self._flush()
        frame = _chunk(b"event: end\ndata: {}\n\n") + b"0\r\n\r\n"
        for transport in self.subscribers.pop(stream, []):
            transport.write(frame)
            transport.close()


class _Connection(asyncio.Protocol):
    def __init__(self, streams: _Streams) -> None:
        self._streams = streams
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while True:
            end = self._buffer.find(_HEAD_END)
            if end < 0:
                return
            head = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self._buffer) < end + 4 + length:
                return
            body = bytes(self._buffer[end + 4 : end + 4 + length])
            del self._buffer[: end + 4 + length]
            method, path, _ = head[0].split(" ", 2)
            self._handle(method, path.split("?", 1)[0], body)

    def _handle(self, method: str, path: str, body: bytes) -> None:
        transport = self._transport
        assert transport is not None
        streams = self._streams
        stream, _, action = path.rpartition("/")
        if method == "GET" and action == "subscribe":
            transport.write(_SSE_HEAD)
            streams.subscribers.setdefault(stream, []).append(transport)
        elif method == "POST" and action == "records":
            # The producer's body is {"records":[{"payload":P}]}: P is the record's data.
            payload = json.dumps(json.loads(body)["records"][0]["payload"]).encode()
            sequence = streams.append(stream, payload)
            answer = b'{"first_sequence":%d,"last_sequence":%d}' % (sequence, sequence)
            transport.write(_answer(201, answer))
        elif method == "POST" and action == "close":
            streams.close(stream)
            transport.write(_answer(200, b"{}"))
        elif method == "POST" and action == "streams":
            transport.write(_answer(201, b"{}"))
        elif method == "GET" and path == "/healthz":
            transport.write(_answer(200, b"{}"))
        elif method == "GET" and path == "/metrics":
            text = (
                f"ductor_streams_follower_lag_seconds_count {streams.fan_outs}\n"
                f"ductor_streams_sse_chunk_writes_total {streams.writes}\n"
            ).encode()
            transport.write(_answer(200, text, b"text/plain"))
        else:
            transport.write(_answer(404, b"{}"))

    def connection_lost(self, exc: Exception | None) -> None:
        for subscribers in self._streams.subscribers.values():
            if self._transport in subscribers:
                subscribers.remove(self._transport)  # type: ignore[arg-type]


async def serve(host: str, port: int) -> None:
    """Serve until killed."""
    streams = _Streams()
    server = await asyncio.get_running_loop().create_server(
        lambda: _Connection(streams), host, port, backlog=4096
    )
    print(f"fan-out floor on {host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fanout_floor", description=__doc__)
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--no-workers", action="store_true", help="accepted, as serve's")
    args = parser.parse_args(argv)
    uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
