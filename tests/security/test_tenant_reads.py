"""Per-tenant fairness of catch-up reads (``DUCTOR_STREAMS_TENANT_MAX_READS``).

With a cap of 2 reads per tenant, tenant A's two stalled readers (raw sockets that read
the head of a 12 MB page and nothing more) hold both of A's slots. Every further
catch-up read of A, native, DS or an object download, waits its 0.2 s and is answered
``429`` ``too_many_reads`` with ``Retry-After``; tenant B's reads are all answered in
full meanwhile, and so are A's reads that take no slot (a DS read at the tail). Once A's
stalled readers go away, A reads again. A read waiting for a slot whose client hangs up
stops waiting then: it is never refused later, and holds no place in the queue.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ductor_streams.auth import issue_token
from ductor_streams.config import Settings
from tests.conftest import API, JWT_SECRET
from tests.support.objects import ObjectApi
from tests.support.server import ServerProcess
from tests.support.stalled import StalledReader, metric, open_stalled
from tests.temporal.polling import eventually

MAX_READS = 2
RECORDS = 1000
PAYLOAD = "x" * 12_000  # a 12 MB page: more than the sockets' buffers take
REFUSED = "ductor_streams_reads_refused_total"
SLOT_WAITS_ABANDONED = 'ductor_streams_waits_abandoned_total{reason="read_slot"}'


def _limited(settings: Settings, tmp_path: Path, wait_seconds: str) -> ServerProcess:
    return ServerProcess(
        settings,
        log_path=tmp_path / "serve.log",
        extra_env={
            "DUCTOR_STREAMS_TENANT_MAX_READS": str(MAX_READS),
            "DUCTOR_STREAMS_TENANT_READ_WAIT_SECONDS": wait_seconds,
            # The stalled readers keep their slots for the whole test.
            "DUCTOR_STREAMS_READ_STALL_SECONDS": "300",
        },
    )


@pytest.fixture
def limited_server(settings: Settings, tmp_path: Path) -> Iterator[ServerProcess]:
    with _limited(settings, tmp_path, "0.2") as server:
        yield server


@pytest.fixture
def patient_server(settings: Settings, tmp_path: Path) -> Iterator[ServerProcess]:
    """Reads wait up to the longest allowed for a slot: only a hang-up ends one early."""
    with _limited(settings, tmp_path, "60") as server:
        yield server


def _token(tenant: str) -> str:
    return issue_token(
        JWT_SECRET,
        sub="reader",
        tenant=tenant,
        scopes=["streams:read", "streams:write", "streams:admin"],
        runs=["*"],
        ttl_seconds=600,
    )


async def _stream(client: httpx.AsyncClient, token: str, run_id: str, payload: str) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    base = f"{API}/runs/{run_id}/streams"
    created = await client.post(
        base, json={"stream_id": "s", "direction": "output"}, headers=headers
    )
    assert created.status_code == 201, created.text
    body = json.dumps({"records": [{"payload": payload} for _ in range(RECORDS)]})
    appended = await client.post(
        f"{base}/s/records", content=body, headers={**headers, "Content-Type": "application/json"}
    )
    assert appended.status_code == 201, appended.text


async def _artifact(client: httpx.AsyncClient, headers: dict[str, str], run_id: str) -> str:
    """A stream ``artifacts`` with one small object; its download path."""
    created = await client.post(
        f"{API}/runs/{run_id}/streams",
        json={"stream_id": "artifacts", "direction": "output"},
        headers=headers,
    )
    assert created.status_code == 201, created.text
    object_id, _ = await ObjectApi(client, headers, run_id).put_object(b"object bytes")
    return f"{API}/runs/{run_id}/streams/artifacts/objects/{object_id}/content"


async def _stall_every_slot(server: ServerProcess, records: str, token: str) -> list[StalledReader]:
    """``MAX_READS`` readers of ``records`` (a 12 MB page) that take the head and stop."""
    stalled = [
        await open_stalled(server.port, f"{records}?limit={RECORDS}", token)
        for _ in range(MAX_READS)
    ]
    assert [r.status for r in stalled] == [200] * MAX_READS
    return stalled


async def _release_and_read_again(
    client: httpx.AsyncClient,
    stalled: list[StalledReader],
    records: str,
    headers: dict[str, str],
) -> None:
    """The stalled readers go away; the tenant's next read is answered 200."""
    for reader in stalled:
        reader.close()
    again = await eventually(
        lambda: client.get(records, params={"limit": 1}, headers=headers),
        lambda answer: answer.status_code == 200,
        timeout=30,
        what="tenant A reading again",
    )
    assert again.json()["records"][0]["payload"] == PAYLOAD


@pytest.mark.timeout(300)
async def test_a_tenant_past_its_reads_gets_429_while_another_reads(
    limited_server: ServerProcess, tenant: str, run_id: str
) -> None:
    other = f"t-{uuid.uuid4().hex[:8]}"
    token_a, token_b = _token(tenant), _token(other)
    a = {"Authorization": f"Bearer {token_a}"}
    b = {"Authorization": f"Bearer {token_b}"}
    records = f"{API}/runs/{run_id}/streams/s/records"
    ds = f"{API}/runs/{run_id}/ds/v1/stream/s"
    async with httpx.AsyncClient(base_url=limited_server.url, timeout=60) as client:
        await _stream(client, token_a, run_id, PAYLOAD)
        await _stream(client, token_b, run_id, "small")
        download = await _artifact(client, a, run_id)
        stalled = await _stall_every_slot(limited_server, records, token_a)

        refused_before = await metric(client, REFUSED)
        # A's reads past its cap, all at once: each waits, then 429.
        answers = await asyncio.gather(
            *(client.get(records, params={"limit": 1}, headers=a) for _ in range(4)),
            client.get(ds, headers=a),
            client.get(download, headers=a),
        )
        assert [r.status_code for r in answers] == [429] * 6
        for answer in answers:
            assert answer.headers["Retry-After"] == "1"
            assert answer.headers["Content-Type"].startswith("application/problem+json")
            problem = answer.json()
            assert problem["code"] == "too_many_reads"
            assert problem["status"] == 429
        assert await metric(client, REFUSED) - refused_before == 6

        # B reads in full meanwhile; A's read at the tail takes no slot.
        answers_b = await asyncio.gather(
            *(client.get(records, params={"limit": RECORDS}, headers=b) for _ in range(3)),
            client.get(ds, headers=b),
        )
        assert [r.status_code for r in answers_b] == [200] * 4
        for answer in answers_b[:3]:
            page = answer.json()
            assert [r["sequence"] for r in page["records"]] == list(range(1, RECORDS + 1))
        assert answers_b[3].json() == ["small"] * RECORDS
        at_tail = await client.get(ds, params={"offset": "now"}, headers=a)
        assert at_tail.status_code == 200
        assert await metric(client, REFUSED) - refused_before == 6

        # A's stalled readers go away: their slots come back.
        await _release_and_read_again(client, stalled, records, a)
        assert (await client.get(download, headers=a)).content == b"object bytes"


async def _hung_up_after_sending(port: int, path: str, token: str) -> asyncio.StreamWriter:
    """A GET sent whole on a socket of its own; the caller closes it unanswered."""
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    )
    await writer.drain()
    return writer


@pytest.mark.timeout(300)
async def test_a_read_waiting_for_a_slot_stops_when_its_client_goes(
    patient_server: ServerProcess, tenant: str, run_id: str
) -> None:
    token = _token(tenant)
    a = {"Authorization": f"Bearer {token}"}
    records = f"{API}/runs/{run_id}/streams/s/records"
    ds = f"{API}/runs/{run_id}/ds/v1/stream/s"
    async with httpx.AsyncClient(base_url=patient_server.url, timeout=60) as client:
        await _stream(client, token, run_id, PAYLOAD)
        download = await _artifact(client, a, run_id)
        stalled = await _stall_every_slot(patient_server, records, token)
        refused_before = await metric(client, REFUSED)
        gone_before = await metric(client, SLOT_WAITS_ABANDONED)

        # Three reads wait for one of A's slots (each may wait 60 s); their clients go.
        waiting = [
            await _hung_up_after_sending(patient_server.port, path, token)
            for path in (f"{records}?limit=1", ds, download)
        ]
        for writer in waiting:
            writer.close()
        await eventually(
            lambda: metric(client, SLOT_WAITS_ABANDONED),
            lambda gone: gone == gone_before + 3,
            timeout=30,
            what="the waits of the reads whose clients went ended",
        )
        # Ended by the hang-up, not by the wait running out: none of them is refused.
        assert await metric(client, REFUSED) == refused_before

        # The slots the stalled readers give back go to nobody who left: a new read
        # of A takes one.
        await _release_and_read_again(client, stalled, records, a)
        assert await metric(client, REFUSED) == refused_before
