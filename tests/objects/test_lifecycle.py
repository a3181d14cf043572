"""Every branch of the object contract, on both stores (local folder, GCS emulator)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import asyncpg
import httpx

from tests.conftest import TokenFactory
from tests.support.objects import (
    MiB,
    ObjectApi,
    ObjectEnv,
    create_stream,
    prepare_body,
    sha256_hex,
    stream_pk,
)


def api_for(env: ObjectEnv, auth: TokenFactory, run_id: str) -> ObjectApi:
    return ObjectApi(env.client, auth(), run_id)


async def test_32_mib_round_trip_record_invisible_until_commit(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str, pool: asyncpg.Pool, tenant: str
) -> None:
    api = api_for(objects_env, auth, run_id)
    await create_stream(api.client, api.headers, run_id)
    data = os.urandom(32 * MiB)
    body = prepare_body(data, metadata={"name": "model.bin", "z": 1, "a": [1, 2]})

    prepared = await api.prepare(body)
    assert prepared.status_code == 201, prepared.text
    answer = prepared.json()
    assert set(answer) == {"object_id", "state", "expires_at", "upload"}
    assert answer["state"] == "prepared"
    object_id = answer["object_id"]
    assert answer["upload"] == {
        "method": "PUT",
        "url": f"{api.base}/objects/{object_id}/content",
        "headers": {"Content-Type": "application/octet-stream"},
    }
    # The storage key is the server's: it names the stream and the object, nothing else.
    pk = await stream_pk(pool, tenant, run_id, "artifacts")
    key = await pool.fetchval(
        "SELECT storage_key FROM workflow_streams.object_intents WHERE object_id = $1",
        __import__("uuid").UUID(object_id),
    )
    assert key == f"ductor-streams/{pk}/{object_id}"

    uploaded = await api.upload(object_id, data)
    assert uploaded.status_code == 200, uploaded.text
    assert uploaded.json() == {"object_id": object_id, "state": "uploaded"}
    assert await objects_env.keys(pk) == [key]  # no temporary part left behind

    # Prepared and uploaded: still no record.
    page = (await api.records()).json()
    assert page["records"] == [] and page["latest_sequence"] == 0

    committed = await api.commit(object_id)
    assert committed.status_code == 201, committed.text
    assert committed.json() == {"sequence": 1}

    page = (await api.records()).json()
    assert [r["sequence"] for r in page["records"]] == [1]
    record = page["records"][0]
    assert record["payload"] == {"name": "model.bin", "z": 1, "a": [1, 2]}
    assert list(record["payload"]) == ["name", "z", "a"]  # as sent, key order kept
    assert record["size"] == len(b'{"name":"model.bin","z":1,"a":[1,2]}')
    assert record["object"] == {
        "object_id": object_id,
        "sha256": sha256_hex(data),
        "size": 32 * MiB,
        "content_type": "application/octet-stream",
    }

    downloaded = await api.download(object_id)
    assert downloaded.status_code == 200
    assert downloaded.headers["content-type"].startswith("application/octet-stream")
    assert len(downloaded.content) == 32 * MiB
    assert sha256_hex(downloaded.content) == sha256_hex(data)

    again = await api.commit(object_id)
    assert again.status_code == 200 and again.json() == {"sequence": 1}
    assert (await api.stream_state())["latest_sequence"] == 1

    state = (await api.state(object_id)).json()
    assert state["state"] == "committed" and state["sequence"] == 1


async def test_prepare_is_idempotent_by_key_and_pins(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str, pool: asyncpg.Pool, tenant: str
) -> None:
    api = api_for(objects_env, auth, run_id)
    await create_stream(api.client, api.headers, run_id)
    data = b"hello object"
    body = prepare_body(data, key="k-1")
    first = await api.prepare(body)
    assert first.status_code == 201
    second = await api.prepare(body)
    assert second.status_code == 200
    assert second.json()["object_id"] == first.json()["object_id"]
    assert second.json()["state"] == "prepared"
    for change in (
        {"size": len(data) + 1},
        {"sha256": sha256_hex(b"other")},
        {"content_type": "text/plain"},
        {"metadata": {"name": "other"}},
        {"schema": "other/v1"},
    ):
        conflict = await api.prepare({**body, **change})
        assert conflict.status_code == 409, change
        assert conflict.json()["code"] == "definition_conflict"
    pk = await stream_pk(pool, tenant, run_id, "artifacts")
    count = await pool.fetchval(
        "SELECT count(*) FROM workflow_streams.object_intents WHERE stream_pk = $1", pk
    )
    assert count == 1


async def test_prepare_rejects_bad_input_and_creates_nothing(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str, pool: asyncpg.Pool, tenant: str
) -> None:
    api = api_for(objects_env, auth, run_id)
    await create_stream(api.client, api.headers, run_id)
    data = b"x" * 10
    cases = [
        ({"size": 33_554_433}, 413, "object_too_large"),
        ({"region": "mars"}, 422, "placement_mismatch"),
        ({"sha256": "nothex"}, 400, "invalid_request"),
        ({"size": -1}, 400, "invalid_request"),
        ({"content_type": "not a type"}, 400, "invalid_request"),
        ({"idempotency_key": ""}, 400, "invalid_idempotency_key"),
        ({"metadata": {"blob": "x" * 70_000}}, 413, "record_too_large"),
        ({"surprise": 1}, 400, "invalid_body"),
        ({"metadata": [1, 2]}, 400, "invalid_body"),
    ]
    for change, status, code in cases:
        response = await api.prepare({**prepare_body(data), **change})
        assert response.status_code == status, (change, response.text)
        assert response.headers["content-type"].startswith("application/problem+json")
        assert response.json()["code"] == code, change
    pk = await stream_pk(pool, tenant, run_id, "artifacts")
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM workflow_streams.object_intents WHERE stream_pk = $1", pk
        )
        == 0
    )


async def test_wrong_bytes_keep_nothing(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str, pool: asyncpg.Pool, tenant: str
) -> None:
    api = api_for(objects_env, auth, run_id)
    await create_stream(api.client, api.headers, run_id)
    pk = await stream_pk(pool, tenant, run_id, "artifacts")
    data = os.urandom(3 * MiB + 17)
    object_id = (await api.prepare(prepare_body(data))).json()["object_id"]
    wrong = bytearray(data)
    wrong[MiB] ^= 0xFF
    for body in (bytes(wrong), data[:-1], data + b"!", b""):
        response = await api.upload(object_id, body)
        assert response.status_code == 422, response.text
        assert response.json()["code"] == "object_evidence_mismatch"
        assert await objects_env.keys(pk) == []
        assert (await api.state(object_id)).json()["state"] == "prepared"
    # Commit before a good upload: not uploaded, and no record.
    early = await api.commit(object_id)
    assert early.status_code == 409 and early.json()["code"] == "object_not_uploaded"
    assert (await api.stream_state())["latest_sequence"] == 0
    # The right bytes still go through afterwards.
    assert (await api.upload(object_id, data)).status_code == 200
    # Uploading again after success checks the bytes but keeps what is stored.
    assert (await api.upload(object_id, data)).json()["state"] == "uploaded"
    again = await api.upload(object_id, bytes(wrong))
    assert again.status_code == 422 and again.json()["code"] == "object_evidence_mismatch"
    assert (await api.commit(object_id)).json() == {"sequence": 1}
    assert sha256_hex((await api.download(object_id)).content) == sha256_hex(data)


async def test_abort_removes_bytes_and_blocks_commit(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str, pool: asyncpg.Pool, tenant: str
) -> None:
    api = api_for(objects_env, auth, run_id)
    await create_stream(api.client, api.headers, run_id)
    pk = await stream_pk(pool, tenant, run_id, "artifacts")
    data = os.urandom(MiB)
    object_id = (await api.prepare(prepare_body(data))).json()["object_id"]
    assert (await api.upload(object_id, data)).status_code == 200
    assert len(await objects_env.keys(pk)) == 1

    aborted = await api.abort(object_id)
    assert aborted.status_code == 200
    assert aborted.json() == {"object_id": object_id, "state": "aborted"}
    assert await objects_env.keys(pk) == []
    outbox = await pool.fetch(
        "SELECT reason, state, attempts FROM workflow_streams.deletion_outbox WHERE object_id = $1",
        __import__("uuid").UUID(object_id),
    )
    assert [tuple(r) for r in outbox] == [("aborted", "done", 1)]

    for call, status, code in (
        (api.commit(object_id), 409, "object_aborted"),
        (api.upload(object_id, data), 409, "object_aborted"),
    ):
        response = await call
        assert response.status_code == status and response.json()["code"] == code
    assert (await api.abort(object_id)).json()["state"] == "aborted"
    assert (await api.stream_state())["latest_sequence"] == 0
    missing = await api.download(object_id)
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"


async def test_abort_of_committed_object_is_refused(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str
) -> None:
    api = api_for(objects_env, auth, run_id)
    await create_stream(api.client, api.headers, run_id)
    object_id, _ = await api.put_object(b"kept")
    response = await api.abort(object_id)
    assert response.status_code == 409 and response.json()["code"] == "object_committed"
    upload = await api.upload(object_id, b"kept")
    assert upload.status_code == 409 and upload.json()["code"] == "object_committed"
    assert (await api.download(object_id)).content == b"kept"


async def test_expired_intent_refuses_upload_and_commit(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str, pool: asyncpg.Pool
) -> None:
    api = api_for(objects_env, auth, run_id)
    await create_stream(api.client, api.headers, run_id)
    data = b"late bytes"
    uploaded_id = (await api.prepare(prepare_body(data))).json()["object_id"]
    assert (await api.upload(uploaded_id, data)).status_code == 200
    prepared_id = (await api.prepare(prepare_body(data))).json()["object_id"]
    # The clock passes the expiry (the intents' own TTL is an hour).
    await pool.execute(
        "UPDATE workflow_streams.object_intents SET expires_at = now() - interval '1 second' "
        "WHERE object_id = ANY($1::uuid[])",
        [uploaded_id, prepared_id],
    )
    for call in (
        api.commit(uploaded_id),
        api.upload(prepared_id, data),
        api.commit(prepared_id),
        api.abort(uploaded_id),
    ):
        response = await call
        assert response.status_code == 410, response.text
        assert response.json()["code"] == "object_expired"
    assert (await api.state(uploaded_id)).json()["state"] == "expired"
    assert (await api.stream_state())["latest_sequence"] == 0


async def test_commit_follows_close_and_credit_rules(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str
) -> None:
    api = api_for(objects_env, auth, run_id)
    await create_stream(
        api.client,
        api.headers,
        run_id,
        consumers=["ui"],
        credit={"max_unread_items": 1},
    )
    data = b"credit bound"
    object_id = (await api.prepare(prepare_body(data))).json()["object_id"]
    assert (await api.upload(object_id, data)).status_code == 200
    inline = await api.client.post(
        f"{api.base}/records", json={"records": [{"payload": 1}]}, headers=api.headers
    )
    assert inline.status_code == 201
    refused = await api.commit(object_id)
    assert refused.status_code == 429 and refused.json()["code"] == "credit_exhausted"
    assert int(refused.headers["retry-after"]) >= 1
    assert (await api.state(object_id)).json()["state"] == "uploaded"
    assert (await api.stream_state())["latest_sequence"] == 1
    ack = await api.client.post(
        f"{api.base}/consumers/ui/ack", json={"sequence": 1}, headers=api.headers
    )
    assert ack.status_code == 200
    assert (await api.commit(object_id)).json() == {"sequence": 2}

    second = (await api.prepare(prepare_body(data))).json()["object_id"]
    assert (await api.upload(second, data)).status_code == 200
    closed = await api.client.post(f"{api.base}/close", headers=api.headers)
    assert closed.status_code == 200
    refused = await api.commit(second)
    assert refused.status_code == 409 and refused.json()["code"] == "stream_closed"
    late = await api.prepare(prepare_body(data))
    assert late.status_code == 409 and late.json()["code"] == "stream_closed"
    assert (await api.stream_state())["latest_sequence"] == 2


async def test_concurrent_commits_append_once(
    objects_env: ObjectEnv, object_server: Any, auth: TokenFactory, run_id: str
) -> None:
    headers = auth()
    async with httpx.AsyncClient(base_url=object_server.url, timeout=60) as http:
        api = ObjectApi(http, headers, run_id)
        await create_stream(http, headers, run_id)
        data = os.urandom(256 * 1024)
        object_id = (await api.prepare(prepare_body(data))).json()["object_id"]
        assert (await api.upload(object_id, data)).status_code == 200
        answers = await asyncio.gather(*(api.commit(object_id) for _ in range(8)))
        assert sorted(a.status_code for a in answers) == [200] * 7 + [201]
        assert {a.json()["sequence"] for a in answers} == {1}
        page = (await api.records()).json()
        assert [r["sequence"] for r in page["records"]] == [1]


async def test_access_scope_tenant_and_egress(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str
) -> None:
    api = api_for(objects_env, auth, run_id)
    await create_stream(
        api.client,
        api.headers,
        run_id,
        placement={"client_egress_regions": ["local"]},
        authorization={"readers": ["*"], "writers": ["tester"]},
    )
    data = b"guarded"
    object_id, _ = await api.put_object(data)

    far = await api.download(object_id, headers=auth(region="elsewhere"))
    assert far.status_code == 403 and far.json()["code"] == "egress_denied"
    near = await api.download(object_id, headers=auth(region="local"))
    assert near.status_code == 200 and near.content == data

    no_read = await api.download(object_id, headers=auth(scopes=["streams:write"]))
    assert no_read.status_code == 403 and no_read.json()["code"] == "forbidden"
    no_write = await api.prepare(prepare_body(data), headers=auth(scopes=["streams:read"]))
    assert no_write.status_code == 403 and no_write.json()["code"] == "forbidden"
    not_writer = await api.prepare(prepare_body(data), headers=auth(sub="mallory"))
    assert not_writer.status_code == 403 and not_writer.json()["code"] == "forbidden"
    other_tenant = await api.download(object_id, headers=auth(tenant="t-other"))
    assert other_tenant.status_code == 404 and other_tenant.json()["code"] == "not_found"
    other_run = await api.download(object_id, headers=auth(runs=["run-other"]))
    assert other_run.status_code == 404
    for bad in ("not-a-uuid", "00000000-0000-0000-0000-000000000000"):
        response = await api.commit(bad)
        assert response.status_code == 404 and response.json()["code"] == "not_found"


async def test_object_of_another_stream_is_not_found(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str
) -> None:
    api = api_for(objects_env, auth, run_id)
    await create_stream(api.client, api.headers, run_id)
    await create_stream(api.client, api.headers, run_id, stream_id="other")
    object_id, _ = await api.put_object(b"mine")
    other = ObjectApi(api.client, api.headers, run_id, "other")
    for response in (await other.download(object_id), await other.commit(object_id)):
        assert response.status_code == 404 and response.json()["code"] == "not_found"


async def test_object_on_input_stream_is_queued_for_delivery(
    objects_env: ObjectEnv, auth: TokenFactory, run_id: str, pool: asyncpg.Pool, tenant: str
) -> None:
    api = api_for(objects_env, auth, run_id)
    await create_stream(api.client, api.headers, run_id, direction="input")
    _, sequence = await api.put_object(b"for the workflow")
    pk = await stream_pk(pool, tenant, run_id, "artifacts")
    rows = await pool.fetch(
        "SELECT sequence FROM workflow_streams.input_deliveries WHERE stream_pk = $1", pk
    )
    assert [r["sequence"] for r in rows] == [sequence] == [1]
