"""SSE followers in a process of their own, for ``bench.activity_streams``: one raw
keep-alive connection per stream (uvloop, no HTTP client library), timing each record
against the wall time its producer put in the payload (``"t"``).

    python -m bench.sse_followers <json config>

The config: ``{"host", "port", "token", "paths": [subscribe paths]}``. It connects every
path (from cursor 0), prints ``ready``, and on a line on stdin prints one JSON line:
per path the sequences received, the latencies in ms (receive wall time - ``t``), the
part of each up to the start of the transaction that appended it (``appended_at - t``)
and the receive wall times.

During the load a follower only notes each chunk the socket gave it with its arrival
time; the framing and the JSON are undone after ``stop``. The followers share the
measured machine's two cores with the server, the worker and Postgres, and parsing
every record as it came cost them about 40 us of CPU a record (0.2 cores at 5,000
records/s) that a browser on another machine would not take from the server.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from tests.support.sse_records import RecordParser


class Follower(asyncio.Protocol):
    """One SSE response: notes the bytes as they arrive (``chunks``)."""

    def __init__(self) -> None:
        self.chunks: list[tuple[float, bytes]] = []  # (wall time of arrival, bytes)
        self.head = b""
        self.started = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        if self.started.done():
            self.chunks.append((time.time(), data))
            return
        self.head += data
        head, sep, rest = self.head.partition(b"\r\n\r\n")
        if not sep:
            return
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            self.started.set_exception(RuntimeError(head.decode(errors="replace")))
            return
        self.head = head
        self.started.set_result(None)
        if rest:
            self.chunks.append((time.time(), rest))

    def results(self) -> dict[str, Any]:
        parser = RecordParser(chunked=b"chunked" in self.head.lower())
        for now, data in self.chunks:
            parser.feed(now, data)
        return {
            "sequences": parser.sequences,
            "latencies": parser.latencies,
            "in_store": parser.in_store,
            "received": parser.received,
        }


async def main(config: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    followers: list[Follower] = []
    for path in config["paths"]:
        transport, follower = await loop.create_connection(Follower, config["host"], config["port"])
        transport.write(
            f"GET {path}?cursor=0 HTTP/1.1\r\nHost: bench\r\n"
            f"Authorization: Bearer {config['token']}\r\nAccept: text/event-stream\r\n\r\n".encode()
        )
        followers.append(follower)
    await asyncio.gather(*(f.started for f in followers))
    print("ready", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    print(json.dumps([f.results() for f in followers]), flush=True)


if __name__ == "__main__":
    import uvloop

    uvloop.install()
    asyncio.run(main(json.loads(sys.argv[1])))
