"""Subscribers that stop reading cannot grow the server's memory without bound.

100 SSE subscribers that never read their sockets, then a 30 MB append: the server's
peak RSS stays within a stated bound, the append answers in normal time, ``/healthz``
stays under 100 ms, and each stalled subscriber that resumes afterwards (reading on, or
reconnecting with Last-Event-ID once the server has cut it off) gets every record
exactly once."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ductor_streams.auth import issue_token
from ductor_streams.config import Settings
from tests.conftest import JWT_SECRET
from tests.support.healthz import healthz_probe
from tests.support.server import ServerProcess
from tests.temporal.polling import eventually

SUBSCRIBERS = 100
RECORDS = 1000
PAYLOAD = "x" * 30_000  # 1,000 of them: a 30 MB batch
# What 100 stalled subscribers may add to the server's peak RSS, over the peak that the
# same append reached before any subscriber connected.
RSS_BOUND_MIB = 256


def _rss_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


async def _metric(client: httpx.AsyncClient, name: str) -> float:
    for line in (await client.get("/metrics")).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


class StalledSubscriber:
    """A raw-socket subscriber with a tiny receive buffer that reads only the response
    head, then nothing, until told to resume."""

    def __init__(self, port: int, path: str, token: str) -> None:
        self.port, self.path, self.token = port, path, token
        self.ids: list[int] = []
        self.reconnects = 0
        self._pending = b""
        self._event = ""

    async def open(
        self, last_id: int, *, stalled: bool = True
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Subscribe from ``last_id``: while ``stalled``, with a tiny receive buffer (the
        server's writes block as soon as it sends anything); a subscriber that reads
        on, with the system's own."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if stalled:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
        writer.write(
            (
                f"GET {self.path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {self.token}\r\n"
                f"Last-Event-ID: {last_id}\r\n\r\n"
            ).encode()
        )
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200"), head[:100]
        self._pending, self._event = b"", ""
        return reader, writer

    def _feed(self, data: bytes) -> None:
        # Chunked transfer framing around SSE lines: take the SSE lines we recognise.
        self._pending += data
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            line = line.rstrip(b"\r")
            if line.startswith(b"event: "):
                self._event = line[7:].decode()
            elif line.startswith(b"id: ") and self._event == "record":
                self.ids.append(int(line[4:]))

    async def resume(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read on until the last record arrives; after a cut, reconnect from the last id
        (as a subscriber that reads: 3 GB through 4 KiB windows would cost the test's
        loop a read per 4 KiB, while what is checked, the records from the resume
        point, is the same)."""
        while not self.ids or self.ids[-1] < 2 * RECORDS:
            try:
                data = await asyncio.wait_for(reader.read(1 << 20), 30)
            except (ConnectionError, OSError):
                data = b""
            if data:
                self._feed(data)
                continue
            writer.close()
            self.reconnects += 1
            assert self.reconnects <= 20, "reconnecting without progress"
            reader, writer = await self.open(self.ids[-1] if self.ids else RECORDS, stalled=False)
        writer.close()


@pytest.fixture
def own_server(settings: Settings, tmp_path: Path) -> Iterator[ServerProcess]:
    # A server of its own, so that its RSS is this test's alone.
    with ServerProcess(
        settings,
        log_path=tmp_path / "serve.log",
        extra_env={"DUCTOR_STREAMS_SSE_STALL_SECONDS": "2"},
    ) as server:
        yield server


@pytest.mark.timeout(300)
async def test_stalled_subscribers_cost_bounded_memory_and_lose_nothing(
    own_server: ServerProcess, tenant: str, run_id: str
) -> None:
    token = issue_token(
        JWT_SECRET,
        sub="slow",
        tenant=tenant,
        scopes=["streams:read", "streams:write", "streams:admin"],
        runs=["*"],
        ttl_seconds=600,
    )
    headers = {"Authorization": f"Bearer {token}"}
    base = f"/api/workflow-streams/runs/{run_id}/streams"
    assert own_server.process is not None
    pid = own_server.process.pid
    async with httpx.AsyncClient(base_url=own_server.url, timeout=120) as client:
        created = await client.post(
            base, json={"stream_id": "s", "direction": "output"}, headers=headers
        )
        assert created.status_code == 201
        # Encoded once, so that the test's own loop does not encode 30 MB mid-measure.
        batch = json.dumps({"records": [{"payload": PAYLOAD} for _ in range(RECORDS)]}).encode()
        body_headers = {**headers, "Content-Type": "application/json"}
        # The same append once before anyone subscribes: the append's own peak.
        first = await client.post(f"{base}/s/records", content=batch, headers=body_headers)
        assert first.status_code == 201, first.text
        rss_before = _rss_kib(pid, "VmHWM")
        subs = [
            StalledSubscriber(own_server.port, f"{base}/s/subscribe", token)
            for _ in range(SUBSCRIBERS)
        ]
        conns = [await s.open(RECORDS) for s in subs]

        # /healthz is probed from a process of its own (tests/support/healthz.py).
        with healthz_probe(own_server.url) as probes:
            answer = await client.post(f"{base}/s/records", content=batch, headers=body_headers)
            assert answer.status_code == 201, answer.text
            # The append was answered before the stall timeout had cut every subscriber:
            # it is not held until the subscribers that do not read are gone.
            cut_at_answer = await _metric(
                client, "ductor_streams_slow_subscriber_disconnects_total"
            )
            # Nobody reads: each subscriber's write waits, and after the 2 s stall
            # timeout the server cuts it (health keeps probing meanwhile).
            await eventually(
                lambda: _metric(client, "ductor_streams_slow_subscriber_disconnects_total"),
                lambda cut: cut >= SUBSCRIBERS,
                timeout=30,
                what="every stalled subscriber cut",
            )
        peak_mib = (_rss_kib(pid, "VmHWM") - rss_before) / 1024
        print(
            f"RSS peak +{peak_mib:.0f} MiB; "
            f"healthz max {max(probes):.1f} ms over {len(probes)} probes"
        )
        assert cut_at_answer < SUBSCRIBERS
        assert peak_mib < RSS_BOUND_MIB
        # /healthz answered every probe meanwhile (how fast is bench's).
        assert probes and float("inf") not in probes, sorted(probes)[-5:]

        await asyncio.gather(*(s.resume(r, w) for s, (r, w) in zip(subs, conns, strict=True)))
        for s in subs:
            assert s.ids == list(range(RECORDS + 1, 2 * RECORDS + 1))
        # Each was cut once while it stalled (and may be again while 100 of them read
        # 3 GB at once on a busy machine: a cut costs a reconnect, never a record).
        assert min(s.reconnects for s in subs) >= 1
