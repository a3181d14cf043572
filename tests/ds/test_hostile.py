"""A hostile caller against the DS endpoint of a real server: header values and query
parameters of absurd length, non-ASCII, negative, with leading zeros, past 2^63 or
empty are each a 4xx problem with a stable code (never a 500) and change nothing, and
the writer headers are looked at only after the token, the run, the scope and the
stream (401, 404, 403 first)."""

from __future__ import annotations

import asyncio
import random
import string
from typing import Any

import asyncpg
import httpx
import pytest

from ductor_streams.http.fronts.ds.writes import MAX_PRODUCERS
from tests.conftest import TokenFactory
from tests.ds.conftest import Ds
from tests.security.dbstate import fingerprint

PROBLEM = "application/problem+json"


def _json(headers: dict[str, str]) -> dict[str, str]:
    return {**headers, "Content-Type": "application/json"}


def assert_problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith(PROBLEM), r.headers
    problem: dict[str, Any] = r.json()
    assert problem["code"] == code and problem["status"] == status, problem
    return problem


def _random_id(n: int) -> str:
    # Random letters: a repeated character would compress under Postgres' index limit.
    return "".join(random.choice(string.ascii_letters) for _ in range(n))


async def _json_stream(ds: Ds, stream: str) -> None:
    r = await ds.http.put(ds.url(stream), headers=_json(ds.headers), content=b"[1,2,3]")
    assert r.status_code == 201, r.text


# Each offset looks like ours (20 digits) but is past a Postgres bigint.
HUGE_OFFSETS = ["99999999999999999999", "09223372036854775808"]


@pytest.mark.parametrize("offset", HUGE_OFFSETS)
@pytest.mark.parametrize("live", ["", "&live=long-poll", "&live=sse"])
async def test_offsets_past_a_bigint_are_invalid_offset(ds: Ds, offset: str, live: str) -> None:
    await _json_stream(ds, "big")
    r = await ds.http.get(ds.url("big") + f"?offset={offset}{live}", headers=ds.headers)
    assert_problem(r, 400, "invalid_offset")
    # The largest bigint is an offset of the right shape: past the tail, the 400 it is.
    r = await ds.http.get(ds.url("big") + f"?offset=09223372036854775807{live}", headers=ds.headers)
    assert_problem(r, 400, "cursor_in_future")


@pytest.mark.parametrize(
    "cursor",
    ["%C2%B2", "%D9%A3", "%EF%BC%91", "-5", "", "1" * 5000, "12abc", "%20"],
    ids=[
        "superscript-two",
        "arabic-three",
        "fullwidth-one",
        "negative",
        "empty",
        "long",
        "mixed",
        "space",
    ],
)
async def test_any_echoed_cursor_gets_a_fresh_one(ds: Ds, cursor: str) -> None:
    await _json_stream(ds, "cur")
    # At the tail (204 after the long-poll) and with records (200 at once).
    for offset, status in (("now", 204), ("-1", 200)):
        r = await ds.http.get(
            ds.url("cur") + f"?offset={offset}&live=long-poll&cursor={cursor}", headers=ds.headers
        )
        assert r.status_code == status, (r.status_code, r.text[:300])
        assert r.headers["stream-cursor"].isascii() and r.headers["stream-cursor"].isdigit()


BAD_PRODUCERS: dict[str, tuple[str, str, str]] = {
    "id-1025-chars": (_random_id(1025), "0", "0"),
    "id-6000-chars": (_random_id(6000), "0", "0"),
    "epoch-leading-zero": ("p", "00", "0"),
    "seq-leading-zeros": ("p", "0", "007"),
    "epoch-negative": ("p", "-1", "0"),
    "seq-plus": ("p", "0", "+1"),
    "epoch-2^53": ("p", str(2**53), "0"),
    "seq-2^64": ("p", "0", str(2**64)),
    "seq-2^64-plus-many": ("p", "0", "9" * 400),
    "epoch-empty": ("p", "", "0"),
    "seq-float": ("p", "0", "1.0"),
    "seq-hex": ("p", "0", "0x1"),
}


@pytest.mark.parametrize("case", list(BAD_PRODUCERS), ids=str)
async def test_bad_producer_headers_are_invalid_producer_and_change_nothing(
    ds: Ds, pool: asyncpg.Pool, tenant: str, case: str
) -> None:
    await _json_stream(ds, "prod")
    producer_id, epoch, seq = BAD_PRODUCERS[case]
    before = await fingerprint(pool, tenant)
    headers = {"Producer-Id": producer_id, "Producer-Epoch": epoch, "Producer-Seq": seq}
    r = await ds.http.post(ds.url("prod"), headers={**_json(ds.headers), **headers}, content=b"1")
    assert_problem(r, 400, "invalid_producer")
    assert await fingerprint(pool, tenant) == before


async def test_non_ascii_header_bytes_are_one_producer(ds: Ds) -> None:
    await _json_stream(ds, "utf")
    name = "José-生产者".encode()  # sent as raw UTF-8 bytes; a server sees latin-1
    raw = [(k.encode(), v.encode()) for k, v in _json(ds.headers).items()]
    for seq, status in (("0", 200), ("0", 204), ("1", 200)):
        headers = [
            *raw,
            (b"Producer-Id", name),
            (b"Producer-Epoch", b"0"),
            (b"Producer-Seq", seq.encode()),
        ]
        r = await ds.http.post(ds.url("utf"), headers=headers, content=b"1")
        assert r.status_code == status, (r.status_code, r.text[:300])


async def test_the_longest_producer_id_is_accepted(ds: Ds) -> None:
    await _json_stream(ds, "long")
    headers = {"Producer-Id": _random_id(1024), "Producer-Epoch": "0", "Producer-Seq": "0"}
    r = await ds.http.post(ds.url("long"), headers={**_json(ds.headers), **headers}, content=b"1")
    assert r.status_code == 200, r.text
    r = await ds.http.post(ds.url("long"), headers={**_json(ds.headers), **headers}, content=b"1")
    assert r.status_code == 204, r.text


async def test_an_empty_stream_seq_is_refused(ds: Ds, pool: asyncpg.Pool, tenant: str) -> None:
    await _json_stream(ds, "sseq")
    before = await fingerprint(pool, tenant)
    r = await ds.http.post(
        ds.url("sseq"), headers={**_json(ds.headers), "Stream-Seq": ""}, content=b"1"
    )
    assert_problem(r, 400, "invalid_request")
    assert await fingerprint(pool, tenant) == before
    # A real one still works after the refusal.
    r = await ds.http.post(
        ds.url("sseq"), headers={**_json(ds.headers), "Stream-Seq": "a"}, content=b"1"
    )
    assert r.status_code == 204, r.text


BAD_WRITER = {"Producer-Id": "p", "Producer-Epoch": "-1", "Stream-Seq": ""}


async def test_writer_headers_are_looked_at_after_access(ds: Ds, auth: TokenFactory) -> None:
    await _json_stream(ds, "acc")
    body = b"1"
    no_token = {"Content-Type": "application/json", **BAD_WRITER}
    r = await ds.http.post(ds.url("acc"), headers=no_token, content=body)
    assert_problem(r, 401, "unauthenticated")
    other_run = auth(runs=["someone-else"])
    r = await ds.http.post(ds.url("acc"), headers={**_json(other_run), **BAD_WRITER}, content=body)
    assert_problem(r, 404, "not_found")
    read_only = auth(scopes=["streams:read"])
    r = await ds.http.post(ds.url("acc"), headers={**_json(read_only), **BAD_WRITER}, content=body)
    assert_problem(r, 403, "forbidden")
    r = await ds.http.post(
        ds.url("missing"), headers={**_json(ds.headers), **BAD_WRITER}, content=body
    )
    assert_problem(r, 404, "not_found")
    # Closing needs streams:admin: a write-only token is 403 before its headers are read.
    write_only = auth(scopes=["streams:write"])
    closing = {**_json(write_only), **BAD_WRITER, "Stream-Closed": "true"}
    r = await ds.http.post(ds.url("acc"), headers=closing, content=body)
    assert_problem(r, 403, "forbidden")
    # With access decided, the headers are: 400.
    r = await ds.http.post(ds.url("acc"), headers={**_json(ds.headers), **BAD_WRITER}, content=body)
    assert_problem(r, 400, "invalid_producer")


async def _raw_head(url: str, head: bytes) -> bytes:
    """Send a request head (no body) and return the status line and headers of the answer."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head)
        await writer.drain()
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("content_type", "length"),
    [("text/plain", 40_000_001), ("application/octet-stream", 48_000_001)],
    ids=["text", "binary"],
)
async def test_a_body_past_its_modes_limit_is_refused_unread(
    ds_server: Any, ds: Ds, content_type: str, length: int
) -> None:
    """A text body of more than 4 bytes per allowed character (40,000,000), or a binary one
    past 48,000,000 bytes, cannot be within its limit: 413 from the announced length,
    without waiting for a byte of the body (the JSON cap, 80 MiB, was every mode's)."""
    r = await ds.http.put(ds.url("cap"), headers={**ds.headers, "Content-Type": content_type})
    assert r.status_code == 201, r.text
    head = (
        f"POST {ds.url('cap')} HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: {ds.headers['Authorization']}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {length}\r\n\r\n"
    ).encode()
    answer = await _raw_head(ds_server.url, head)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"application/problem+json" in answer


async def test_a_text_append_in_another_charset_is_refused(
    ds: Ds, pool: asyncpg.Pool, tenant: str
) -> None:
    r = await ds.http.put(ds.url("txt"), headers={**ds.headers, "Content-Type": "text/plain"})
    assert r.status_code == 201, r.text
    before = await fingerprint(pool, tenant)
    # Bytes that are valid UTF-8 but said to be Latin-1: stored as UTF-8 they would read
    # back as other text than the writer meant.
    headers = {**ds.headers, "Content-Type": "text/plain; charset=iso-8859-1"}
    r = await ds.http.post(ds.url("txt"), headers=headers, content="café".encode())
    assert_problem(r, 400, "invalid_body")
    assert await fingerprint(pool, tenant) == before
    headers = {**ds.headers, "Content-Type": "text/plain; charset=UTF-8"}
    r = await ds.http.post(ds.url("txt"), headers=headers, content="café".encode())
    assert r.status_code == 204, r.text


async def test_producers_per_stream_are_capped(ds: Ds, pool: asyncpg.Pool, tenant: str) -> None:
    """A writer inventing a Producer-Id per request cannot grow ds_producers without
    limit: at MAX_PRODUCERS a new producer is 409 too_many_producers and writes nothing,
    while a producer the stream knows goes on writing."""
    await _json_stream(ds, "many")

    def producer(pid: str, seq: int) -> dict[str, str]:
        return {
            **_json(ds.headers),
            "Producer-Id": pid,
            "Producer-Epoch": "0",
            "Producer-Seq": str(seq),
        }

    r = await ds.http.post(ds.url("many"), headers=producer("known", 0), content=b"1")
    assert r.status_code == 200, r.text
    pk = await pool.fetchval(
        "SELECT stream_pk FROM workflow_streams.streams"
        " WHERE tenant = $1 AND run_id = $2 AND stream_id = 'many'",
        tenant,
        ds.run_id,
    )
    # The other MAX_PRODUCERS - 1 producers, as if each had written once.
    await pool.execute(
        "INSERT INTO workflow_streams.ds_producers (stream_pk, producer_id, epoch, last_seq)"
        " SELECT $1, 'p' || g, 0, 0 FROM generate_series(2, $2) g",
        pk,
        MAX_PRODUCERS,
    )
    before = await fingerprint(pool, tenant)
    r = await ds.http.post(ds.url("many"), headers=producer("one-too-many", 0), content=b"1")
    assert_problem(r, 409, "too_many_producers")
    assert await fingerprint(pool, tenant) == before
    r = await ds.http.post(ds.url("many"), headers=producer("known", 1), content=b"2")
    assert r.status_code == 200, r.text
    # Below the cap again, a new producer is welcome.
    await pool.execute(
        "DELETE FROM workflow_streams.ds_producers WHERE stream_pk = $1 AND producer_id = 'p2'", pk
    )
    r = await ds.http.post(ds.url("many"), headers=producer("one-too-many", 0), content=b"1")
    assert r.status_code == 200, r.text
    count = await pool.fetchval(
        "SELECT count(*) FROM workflow_streams.ds_producers WHERE stream_pk = $1", pk
    )
    assert count == MAX_PRODUCERS


async def test_another_tenant_never_sees_or_writes_the_stream(
    ds: Ds, pool: asyncpg.Pool, tenant: str, auth: TokenFactory
) -> None:
    """Tenant B's token on tenant A's run and stream names: 404 for reads and writes, and a
    PUT makes B's own stream, never touching A's."""
    await _json_stream(ds, "iso")
    other = auth(tenant=f"{tenant}-b")
    before = await fingerprint(pool, tenant)
    for method, url in (("GET", "?offset=-1"), ("HEAD", ""), ("GET", "?offset=-1&live=sse")):
        r = await ds.http.request(method, ds.url("iso") + url, headers=other)
        assert r.status_code == 404, (method, url, r.status_code)
    r = await ds.http.post(ds.url("iso"), headers=_json(other), content=b"[9]")
    assert_problem(r, 404, "not_found")
    r = await ds.http.put(ds.url("iso"), headers=_json(other), content=b"[7]")
    assert r.status_code == 201, r.text  # B's own stream of the same names
    assert await fingerprint(pool, tenant) == before
    r = await ds.http.get(ds.url("iso") + "?offset=-1", headers=other)
    assert r.json() == [7]
    r = await ds.http.get(ds.url("iso") + "?offset=-1", headers=ds.headers)
    assert r.json() == [1, 2, 3]
