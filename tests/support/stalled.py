"""Readers that stop reading: raw sockets with a tiny receive buffer that send a GET, take
the response head, and then read nothing. And what a test watches of the server meanwhile:
its memory (/proc) and its metrics."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass
class StalledReader:
    """One stalled request: the response head it got, and its socket's streams."""

    head: bytes
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    @property
    def status(self) -> int:
        return int(self.head.split(b" ", 2)[1])

    async def drain_to_end(self, timeout: float = 30.0) -> int:  # noqa: ASYNC109
        """Read what the server sent until the connection ends (EOF or reset); the
        number of body bytes read. TimeoutError if it stays open."""
        received = 0

        async def read_all() -> None:
            nonlocal received
            while True:
                try:
                    data = await self.reader.read(1 << 20)
                except (ConnectionError, OSError):
                    return
                if not data:
                    return
                received += len(data)

        await asyncio.wait_for(read_all(), timeout)
        return received

    def close(self) -> None:
        self.writer.close()


async def open_stalled(port: int, path: str, token: str) -> StalledReader:
    """Send ``GET path`` from a socket with a 4 KiB receive buffer and read only the
    response head."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 16)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    )
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    return StalledReader(head, reader, writer)


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """A memory figure of the process from /proc/<pid>/status (VmRSS, VmHWM), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


async def metric(client: httpx.AsyncClient, sample: str) -> float:
    """The value of one sample of ``/metrics``, named with its labels as exposed (e.g.
    ``ductor_streams_read_stall_cuts_total{route="ds"}``); 0 when absent."""
    for line in (await client.get("/metrics")).text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return 0.0
