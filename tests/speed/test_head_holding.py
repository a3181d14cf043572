"""The server's HTTP protocol sends a response's head together with its body
(http/protocol.py): unit tests of the transport wrapper, then the real server."""

from __future__ import annotations

import asyncio
from typing import Any

from ductor_streams.http.protocol import _HeadHoldingTransport

HEAD = b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n"


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> Any:
        return f"extra:{name}"


async def test_head_and_body_go_in_one_write() -> None:
    fake = FakeTransport()
    transport = _HeadHoldingTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    transport.write(HEAD)
    assert fake.writes == []
    transport.write(b"{}")
    assert fake.writes == [HEAD + b"{}"]
    await asyncio.sleep(0)  # the scheduled flush finds nothing held
    assert fake.writes == [HEAD + b"{}"]


async def test_a_head_alone_goes_out_at_the_end_of_the_turn() -> None:
    # A streamed response (SSE): its head must not wait for the first event.
    fake = FakeTransport()
    transport = _HeadHoldingTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    transport.write(HEAD)
    await asyncio.sleep(0)
    assert fake.writes == [HEAD]
    transport.write(b"5\r\nhello\r\n")
    assert fake.writes == [HEAD, b"5\r\nhello\r\n"]


async def test_close_sends_a_held_head_first_and_the_rest_is_delegated() -> None:
    fake = FakeTransport()
    transport = _HeadHoldingTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    transport.write(b"not a head")
    transport.write(HEAD)
    transport.close()
    assert fake.writes == [b"not a head", HEAD] and fake.closed
    assert transport.get_extra_info("peername") == "extra:peername"


async def test_the_server_answers_an_append_in_one_piece(server, auth, run_id) -> None:  # type: ignore[no-untyped-def]
    import httpx

    from tests.support.live import create_stream, stream_url

    headers = auth()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        await create_stream(c, run_id, "out", headers)
    body = b'{"records":[{"payload":1}]}'
    request = (
        f"POST {stream_url(run_id, 'out')}/records HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: {headers['Authorization']}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    host, port = server.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        for _ in range(20):
            writer.write(request)
            await writer.drain()
            # The first read after a request yields the whole answer: head and body
            # were sent together (with two writes, this read often ends at the head).
            first = await asyncio.wait_for(reader.read(65536), 10)
            head, _, rest = first.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 201")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            assert len(rest) == length, first
    finally:
        writer.close()
