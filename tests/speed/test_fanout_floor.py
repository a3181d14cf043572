"""bench/fanout_floor.py, the process bench.sse_latency compares the server's fan-out with:
its figures are quoted, so it must deliver what the real server would. Every subscriber
gets every appended record once, in order, then ``end``; appends read in one turn go out
as one chunk; /metrics counts what it wrote."""

from __future__ import annotations

import asyncio
import re

from ductor_streams.config import Settings
from tests.support.server import ServerProcess

STREAM = "/api/workflow-streams/runs/r/streams/s"
IDS = re.compile(rb"^id: (\d+)$", re.MULTILINE)


async def _request(port: int, method: str, path: str, body: bytes = b"") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head)[1])  # type: ignore[index]
    answer = head + await reader.readexactly(length)
    writer.close()
    return answer


async def _subscribe(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {STREAM}/subscribe HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head
    return reader, writer


def test_every_subscriber_gets_every_record_once_in_order_then_end() -> None:
    async def scenario(port: int) -> None:
        subscribers = [await _subscribe(port) for _ in range(3)]
        answers = []
        for i in range(5):
            body = b'{"records":[{"payload":{"i":%d}}]}' % i
            answers.append(await _request(port, "POST", f"{STREAM}/records", body))
        assert [a.split(b"\r\n", 1)[0] for a in answers] == [b"HTTP/1.1 201 Created"] * 5
        assert [re.search(rb'"first_sequence":(\d+)', a)[1] for a in answers] == [  # type: ignore[index]
            b"1",
            b"2",
            b"3",
            b"4",
            b"5",
        ]
        await _request(port, "POST", f"{STREAM}/close")
        for reader, writer in subscribers:
            body = await asyncio.wait_for(reader.read(), 10)  # the floor closes after end
            assert [int(m) for m in IDS.findall(body)] == [1, 2, 3, 4, 5]
            assert b'data: {"i": 3}' in body
            assert body.count(b"event: end") == 1 and body.endswith(b"0\r\n\r\n")
            writer.close()
        metrics = await _request(port, "GET", "/metrics")
        assert b"ductor_streams_follower_lag_seconds_count 5\n" in metrics
        assert b"ductor_streams_sse_chunk_writes_total 15\n" in metrics

    with ServerProcess(Settings(), module="bench.fanout_floor") as floor:
        asyncio.run(scenario(floor.port))


def test_appends_read_in_one_turn_go_out_as_one_chunk() -> None:
    async def scenario(port: int) -> None:
        reader, writer = await _subscribe(port)
        # Three requests in one write: the floor reads them in one turn of its loop.
        requests = b"".join(
            b"POST %s/records HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
            % (STREAM.encode(), len(body), body)
            for body in (b'{"records":[{"payload":{"i":%d}}]}' % i for i in range(3))
        )
        _, producer = await asyncio.open_connection("127.0.0.1", port)
        producer.write(requests)
        size_line = await asyncio.wait_for(reader.readuntil(b"\r\n"), 10)
        chunk = await reader.readexactly(int(size_line, 16) + 2)
        assert [int(m) for m in IDS.findall(chunk)] == [1, 2, 3]
        producer.close()
        writer.close()

    with ServerProcess(Settings(), module="bench.fanout_floor") as floor:
        asyncio.run(scenario(floor.port))
