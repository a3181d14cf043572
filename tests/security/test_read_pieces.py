"""Bodies sent a piece at a time arrive whole and exact.

A server with the smallest piece (``DUCTOR_STREAMS_READ_PIECE_BYTES=16384``) answers
pages of many pieces; each body must be byte for byte what the whole page encodes to
(``store.read.read_page`` and the codec, as a one-piece answer is written): native pages
from a cursor, with redaction, with an object reference among the records; DS catch-up
of a JSON stream and of a binary stream; an object download.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from ductor_streams.auth import issue_token
from ductor_streams.config import Settings
from ductor_streams.http.codecs.json_bodies import encode_json, page_json
from ductor_streams.http.fronts.ds.reads import PAGE_BYTES, PAGE_RECORDS
from ductor_streams.store.read import read_page
from tests.conftest import API, JWT_SECRET
from tests.support.objects import ObjectApi, stream_pk
from tests.support.server import ServerProcess

PIECE = 16384


@pytest.fixture
def piece_server(settings: Settings, tmp_path: Path) -> Iterator[ServerProcess]:
    with ServerProcess(
        settings,
        log_path=tmp_path / "serve.log",
        extra_env={"DUCTOR_STREAMS_READ_PIECE_BYTES": str(PIECE)},
    ) as server:
        yield server


def _headers(tenant: str, *scopes: str) -> dict[str, str]:
    token = issue_token(
        JWT_SECRET, sub="reader", tenant=tenant, scopes=list(scopes), runs=["*"], ttl_seconds=600
    )
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.timeout(300)
async def test_pages_of_many_pieces_are_whole_and_exact(
    piece_server: ServerProcess, pool: asyncpg.Pool, tenant: str, run_id: str
) -> None:
    writer = _headers(
        tenant, "streams:read", "streams:read_unredacted", "streams:write", "streams:admin"
    )
    redacted = _headers(tenant, "streams:read")
    base = f"{API}/runs/{run_id}/streams"
    rng = random.Random(7)
    async with httpx.AsyncClient(base_url=piece_server.url, timeout=60) as client:
        definition = {
            "stream_id": "s",
            "direction": "output",
            "redaction": {"json_pointers": ["/secret"]},
        }
        created = await client.post(base, json=definition, headers=writer)
        assert created.status_code == 201, created.text
        created = await client.post(
            base, json={"stream_id": "artifacts", "direction": "output"}, headers=writer
        )
        assert created.status_code == 201, created.text
        # Records of mixed sizes (1 B to 40 KB), in two batches around an object record
        # (it goes to another stream: the object's record lands in "artifacts").
        for _ in range(2):
            batch = [
                {
                    "payload": {
                        "secret": "s" * rng.randint(0, 50),
                        "text": "t" * rng.randint(0, 40_000),
                    }
                }
                if rng.random() < 0.5
                else {"payload": rng.randint(0, 10**6)}
                for _ in range(600)
            ]
            appended = await client.post(
                f"{base}/s/records", json={"records": batch}, headers=writer
            )
            assert appended.status_code == 201, appended.text
        objects = ObjectApi(client, writer, run_id)
        data = os.urandom(3 * PIECE + 123)
        object_id, _ = await objects.put_object(data)
        small = {"records": [{"payload": {"n": i, "pad": "p" * 9000}} for i in range(40)]}
        for _ in range(2):
            appended = await client.post(f"{base}/artifacts/records", json=small, headers=writer)
            assert appended.status_code == 201, appended.text

        pk = await stream_pk(pool, tenant, run_id, "s")
        for cursor, limit, headers, redaction in (
            (0, 1000, writer, []),
            (137, 500, writer, []),
            (0, 1000, redacted, ["/secret"]),
            (1000, 1000, redacted, ["/secret"]),
        ):
            answer = await client.get(
                f"{base}/s/records", params={"cursor": cursor, "limit": limit}, headers=headers
            )
            assert answer.status_code == 200
            expected = encode_json(page_json(await read_page(pool, pk, cursor, limit), redaction))
            assert len(expected) > 4 * PIECE
            assert answer.content == expected, (cursor, limit, redaction)

        # The object's record among small records: its piece is encoded record by record.
        artifacts = await stream_pk(pool, tenant, run_id, "artifacts")
        answer = await client.get(
            f"{base}/artifacts/records", params={"limit": 1000}, headers=writer
        )
        page = await read_page(pool, artifacts, 0, 1000)
        assert [r.object is not None for r in page.records].count(True) == 1
        assert answer.content == encode_json(page_json(page, []))
        assert len(answer.content) > 4 * PIECE

        # DS catch-up of the JSON stream: the payloads spliced into an array.
        answer = await client.get(f"{API}/runs/{run_id}/ds/v1/stream/s", headers=writer)
        assert answer.status_code == 200
        ds_page = await read_page(pool, pk, 0, PAGE_RECORDS, PAGE_BYTES)
        payloads = [r.payload.encode() for r in ds_page.records]
        assert answer.content == b"[" + b",".join(payloads) + b"]"
        assert answer.headers["Stream-Next-Offset"] == f"{ds_page.next_cursor:020d}"
        assert json.loads(answer.content)[3] == json.loads(payloads[3])

        # DS catch-up of a binary stream: the bytes as they were written.
        blob = os.urandom(20 * PIECE + 7)
        path = f"{API}/runs/{run_id}/ds/v1/stream/bin"
        put = await client.put(
            path, content=blob, headers={**writer, "Content-Type": "application/octet-stream"}
        )
        assert put.status_code == 201, put.text
        answer = await client.get(path, headers=writer)
        assert answer.status_code == 200
        assert answer.content == blob

        # The object, in pieces of the piece size.
        answer = await objects.download(object_id)
        assert answer.status_code == 200
        assert answer.content == data
