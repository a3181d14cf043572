"""The exact cursor rule, every branch."""

from __future__ import annotations

import pytest

from tests.foundation.helpers import append, assert_problem, create, stream_url


async def _read(client, h, run_id, query=""):
    return await client.get(stream_url(run_id, "s", "/records" + query), headers=h)


async def test_empty_stream_reads_empty_with_bounds(client, auth, run_id):
    h = auth()
    await create(client, h, run_id)
    body = (await _read(client, h, run_id)).json()
    assert body == {
        "records": [],
        "next_cursor": 0,
        "earliest_sequence": 1,
        "latest_sequence": 0,
        "closed": False,
    }


async def test_reads_strictly_after_cursor_ascending_with_limit(client, auth, run_id):
    h = auth()
    await create(client, h, run_id)
    await append(client, h, run_id, list(range(1, 11)))
    body = (await _read(client, h, run_id, "?cursor=3&limit=4")).json()
    assert [r["sequence"] for r in body["records"]] == [4, 5, 6, 7]
    assert [r["payload"] for r in body["records"]] == [4, 5, 6, 7]
    assert body["next_cursor"] == 7
    assert body["latest_sequence"] == 10 and body["earliest_sequence"] == 1
    rec = body["records"][0]
    assert set(rec) == {"sequence", "payload", "size", "appended_at", "object", "fingerprint"}
    assert rec["size"] == 1 and rec["object"] is None
    # default cursor 0, default limit 100
    assert [r["sequence"] for r in (await _read(client, h, run_id)).json()["records"]] == list(
        range(1, 11)
    )


async def test_cursor_at_latest_returns_nothing_and_keeps_cursor(client, auth, run_id):
    h = auth()
    await create(client, h, run_id)
    await append(client, h, run_id, [1, 2])
    body = (await _read(client, h, run_id, "?cursor=2")).json()
    assert body["records"] == [] and body["next_cursor"] == 2


async def test_default_limit_is_100_and_max_is_1000(client, auth, run_id):
    h = auth()
    await create(client, h, run_id)
    await append(client, h, run_id, list(range(1000)))
    await append(client, h, run_id, list(range(5)))
    assert len((await _read(client, h, run_id)).json()["records"]) == 100
    body = (await _read(client, h, run_id, "?limit=1000")).json()
    assert len(body["records"]) == 1000 and body["next_cursor"] == 1000


@pytest.mark.parametrize("cursor", ["-1", "abc", "1.5", "", "1e3", "99999999999999999999999"])
async def test_invalid_cursor_is_400(client, auth, run_id, cursor):
    h = auth()
    await create(client, h, run_id)
    assert_problem(await _read(client, h, run_id, f"?cursor={cursor}"), 400, "invalid_cursor")


@pytest.mark.parametrize("limit", ["0", "1001", "-5", "x", ""])
async def test_invalid_limit_is_400(client, auth, run_id, limit):
    h = auth()
    await create(client, h, run_id)
    assert_problem(await _read(client, h, run_id, f"?limit={limit}"), 400, "invalid_limit")


async def test_future_cursor_is_400_never_a_reset(client, auth, run_id):
    h = auth()
    await create(client, h, run_id)
    await append(client, h, run_id, [1, 2, 3])
    body = assert_problem(await _read(client, h, run_id, "?cursor=4"), 400, "cursor_in_future")
    assert "3" in body["detail"]


async def test_pruned_cursor_is_410_with_sequences(client, auth, run_id, pool, tenant):
    h = auth()
    await create(client, h, run_id)
    await append(client, h, run_id, list(range(1, 11)))
    # Retention (another module) deletes records and moves earliest_sequence; do it here by hand.
    await pool.execute(
        """
        WITH s AS (SELECT stream_pk FROM workflow_streams.streams
                    WHERE tenant = $1 AND run_id = $2 AND stream_id = 's'),
             d AS (DELETE FROM workflow_streams.records r USING s
                    WHERE r.stream_pk = s.stream_pk AND r.sequence <= 4)
        UPDATE workflow_streams.streams st SET earliest_sequence = 5 FROM s
         WHERE st.stream_pk = s.stream_pk
        """,
        tenant,
        run_id,
    )
    for cursor in (0, 1, 3):
        body = assert_problem(
            await _read(client, h, run_id, f"?cursor={cursor}"), 410, "cursor_expired"
        )
        assert body["requested_sequence"] == cursor + 1
        assert body["earliest_sequence"] == 5
        assert body["latest_sequence"] == 10
        assert body["resync_reason"] == "retention"
    # cursor 4 means "next is 5", which is retained: no 410.
    ok = (await _read(client, h, run_id, "?cursor=4")).json()
    assert [r["sequence"] for r in ok["records"]] == [5, 6, 7, 8, 9, 10]
    assert ok["earliest_sequence"] == 5


async def test_redaction_applies_without_read_unredacted(client, auth, run_id):
    admin = auth()
    await create(
        client, admin, run_id, redaction={"json_pointers": ["/user/email", "/list/1", "/missing/x"]}
    )
    await append(client, admin, run_id, [{"user": {"email": "a@b.c", "name": "A"}, "list": [1, 2]}])
    reader = auth(scopes=["streams:read"])
    rec = (await _read(client, reader, run_id)).json()["records"][0]
    assert rec["payload"] == {
        "user": {"email": "[REDACTED]", "name": "A"},
        "list": [1, "[REDACTED]"],
    }
    unredacted = auth(scopes=["streams:read", "streams:read_unredacted"])
    rec = (await _read(client, unredacted, run_id)).json()["records"][0]
    assert rec["payload"]["user"]["email"] == "a@b.c"


async def test_redaction_pointer_escapes_unescape_tilde_one_before_tilde_zero(client, auth, run_id):
    """RFC 6901: `~1` becomes `/` first, then `~0` becomes `~`, so `~01` is the key
    `~1` spelled out (here `a~1`) and never `a/`; `~10` is `/0`."""
    admin = auth()
    await create(client, admin, run_id, redaction={"json_pointers": ["/a~01", "/b~10"]})
    payload = {"a~1": 1, "a/": 2, "a~": 3, "b/0": 4, "b~0": 5, "b~10": 6}
    await append(client, admin, run_id, [payload])
    rec = (await _read(client, auth(scopes=["streams:read"]), run_id)).json()["records"][0]
    assert rec["payload"] == {**payload, "a~1": "[REDACTED]", "b/0": "[REDACTED]"}
