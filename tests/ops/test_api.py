"""Operator endpoints against real delivery rows: every input append commits its pending
delivery row; states move through the delivery module's own outbox functions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import asyncpg

from ductor_streams.auth import SCOPES
from ductor_streams.schema import QUERIES
from tests.conftest import API
from tests.ops.helpers import (
    OPS,
    append,
    assert_problem,
    delivery_ids,
    input_stream,
    mark_dead,
    mark_delivered,
    mark_retrying,
)

OPS_ONLY = ["streams:ops"]


async def _two_runs(client: Any, auth: Any, tenant: str) -> tuple[str, str, dict[str, str]]:
    admin = auth(tenant=tenant)
    await input_stream(client, admin, "run-a")
    await input_stream(client, admin, "run-b")
    await input_stream(client, admin, "run-b", stream_id="side")
    assert await append(client, admin, "run-a", [{"n": 1}, {"n": 2}, {"n": 3}]) == (1, 3)
    assert await append(client, admin, "run-b", [{"n": 4}, {"n": 5}]) == (1, 2)
    assert await append(client, admin, "run-b", [{"n": 6}], stream_id="side") == (1, 1)
    return "run-a", "run-b", auth(tenant=tenant, scopes=OPS_ONLY, sub="oncall")


async def test_list_shows_one_row_per_input_record_with_the_contract_fields(
    client, auth, tenant, pool
):
    await _two_runs(client, auth, tenant)
    ops = auth(tenant=tenant, scopes=OPS_ONLY)
    r = await client.get(f"{OPS}/deliveries", headers=ops)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["next_page"] is None
    rows = body["deliveries"]
    assert [(d["run_id"], d["stream_id"], d["sequence"]) for d in rows] == [
        ("run-a", "in", 1),
        ("run-a", "in", 2),
        ("run-a", "in", 3),
        ("run-b", "in", 1),
        ("run-b", "in", 2),
        ("run-b", "side", 1),
    ]
    ids = [d["delivery_id"] for d in rows]
    assert ids == sorted(ids)
    for d in rows:
        assert d["state"] == "pending"
        assert d["attempts"] == 0
        assert d["last_error"] is None
        assert d["delivered_at"] is None
        assert d["retried_by"] is None and d["retried_at"] is None
        assert datetime.fromisoformat(d["next_attempt_at"]) <= datetime.now(UTC)
        assert "payload" not in d
    expected = {
        "delivery_id",
        "run_id",
        "stream_id",
        "sequence",
        "state",
        "attempts",
        "last_error",
        "next_attempt_at",
        "delivered_at",
    }
    assert expected <= set(rows[0])
    assert ids == await delivery_ids(pool, tenant, "run-a", "in") + await delivery_ids(
        pool, tenant, "run-b", "in"
    ) + await delivery_ids(pool, tenant, "run-b", "side")


async def test_filters_by_state_run_stream_and_age(client, auth, tenant, pool):
    run_a, run_b, ops = await _two_runs(client, auth, tenant)
    a_ids = await delivery_ids(pool, tenant, run_a, "in")
    b_ids = await delivery_ids(pool, tenant, run_b, "in")
    side_ids = await delivery_ids(pool, tenant, run_b, "side")
    await mark_delivered(pool, a_ids[:2])
    await mark_dead(pool, b_ids, "workflow 'run-b' has completed")

    async def ids(**params: str) -> list[int]:
        r = await client.get(f"{OPS}/deliveries", params=params, headers=ops)
        assert r.status_code == 200, r.text
        return [d["delivery_id"] for d in r.json()["deliveries"]]

    assert await ids(state="delivered") == a_ids[:2]
    assert await ids(state="dead") == b_ids
    assert await ids(state="pending") == [a_ids[2], *side_ids]
    assert await ids(state="retrying") == []
    assert await ids(run=run_b) == b_ids + side_ids
    assert await ids(run=run_b, stream="side") == side_ids
    assert await ids(stream="in", state="dead") == b_ids
    assert await ids(run="run-nobody") == []
    assert await ids(older_than="0") == a_ids + b_ids + side_ids
    assert await ids(older_than="3600") == []
    # made older than a minute: only those match
    await pool.execute(
        "UPDATE workflow_streams.input_deliveries SET created_at = now() - interval '2 minutes' "
        "WHERE delivery_id = ANY($1::bigint[])",
        side_ids,
    )
    assert await ids(older_than="60") == side_ids

    retrying = await mark_retrying(pool, tenant, "temporal UNAVAILABLE: down", delay=300)
    assert retrying == [a_ids[2], side_ids[0]]
    r = await client.get(f"{OPS}/deliveries", params={"state": "retrying"}, headers=ops)
    rows = r.json()["deliveries"]
    assert [d["delivery_id"] for d in rows] == retrying
    assert {d["attempts"] for d in rows} == {1}
    assert {d["last_error"] for d in rows} == {"temporal UNAVAILABLE: down"}
    assert all(datetime.fromisoformat(d["next_attempt_at"]) > datetime.now(UTC) for d in rows)


async def test_keyset_pages_cover_every_row_once(client, auth, tenant, pool):
    admin = auth(tenant=tenant)
    await input_stream(client, admin, "run-p")
    await append(client, admin, "run-p", list(range(7)))
    ops = auth(tenant=tenant, scopes=OPS_ONLY)
    pages: list[list[int]] = []
    page: str | None = None
    while True:
        params = {"limit": "3", **({"page": page} if page else {})}
        r = await client.get(f"{OPS}/deliveries", params=params, headers=ops)
        assert r.status_code == 200, r.text
        pages.append([d["sequence"] for d in r.json()["deliveries"]])
        page = r.json()["next_page"]
        if page is None:
            break
    assert pages == [[1, 2, 3], [4, 5, 6], [7]]
    # exactly a page's worth left: no empty page after it
    r = await client.get(f"{OPS}/deliveries", params={"limit": "7"}, headers=ops)
    assert len(r.json()["deliveries"]) == 7 and r.json()["next_page"] is None


async def test_retry_round_trip_is_audited_and_only_for_dead(client, auth, tenant, pool):
    _, run_b, ops = await _two_runs(client, auth, tenant)
    dead = await delivery_ids(pool, tenant, run_b, "in")
    await mark_dead(pool, dead, "workflow 'run-b' has completed")
    before = datetime.now(UTC)

    r = await client.post(f"{OPS}/deliveries/{dead[0]}/retry", headers=ops)
    assert r.status_code == 200, r.text
    retried = r.json()
    assert retried["delivery_id"] == dead[0]
    assert retried["state"] == "pending"
    assert retried["attempts"] == 0
    assert retried["retried_by"] == "oncall"
    assert before <= datetime.fromisoformat(retried["retried_at"]) <= datetime.now(UTC)
    assert datetime.fromisoformat(retried["next_attempt_at"]) <= datetime.now(UTC)
    assert retried["last_error"] == "workflow 'run-b' has completed"  # why it had died

    r = await client.get(f"{OPS}/deliveries", params={"state": "dead"}, headers=ops)
    assert [d["delivery_id"] for d in r.json()["deliveries"]] == dead[1:]

    # not dead any more: 409, and nothing changes
    row_before = await pool.fetchrow(
        "SELECT * FROM workflow_streams.input_deliveries WHERE delivery_id = $1", dead[0]
    )
    again = await client.post(f"{OPS}/deliveries/{dead[0]}/retry", headers=ops)
    problem = assert_problem(again, 409, "delivery_not_dead")
    assert problem["state"] == "pending"
    row_after = await pool.fetchrow(
        "SELECT * FROM workflow_streams.input_deliveries WHERE delivery_id = $1", dead[0]
    )
    assert dict(row_after) == dict(row_before)

    # a bad body is refused before anything happens
    bad = await client.post(f"{OPS}/deliveries/{dead[1]}/retry", json={"force": 1}, headers=ops)
    assert_problem(bad, 400, "invalid_body")
    still = await client.get(f"{OPS}/deliveries/{dead[1]}", headers=ops)
    assert still.json()["state"] == "dead" and still.json()["retried_by"] is None
    ok = await client.post(f"{OPS}/deliveries/{dead[1]}/retry", json={}, headers=ops)
    assert ok.status_code == 200 and ok.json()["state"] == "pending"

    assert_problem(
        await client.post(f"{OPS}/deliveries/999999999/retry", headers=ops), 404, "not_found"
    )
    assert_problem(await client.post(f"{OPS}/deliveries/abc/retry", headers=ops), 404, "not_found")


async def test_scope_streams_ops_is_required(client, auth, tenant, pool):
    run_a, _, _ = await _two_runs(client, auth, tenant)
    dead = await delivery_ids(pool, tenant, run_a, "in")
    await mark_dead(pool, dead, "gone")
    everything_but_ops = [s for s in SCOPES if s != "streams:ops"]
    no_ops = auth(tenant=tenant, scopes=everything_but_ops)
    for method, path in [
        ("GET", f"{OPS}/deliveries"),
        ("GET", f"{OPS}/deliveries/{dead[0]}"),
        ("POST", f"{OPS}/deliveries/{dead[0]}/retry"),
        ("GET", f"{OPS}/gaps"),
        ("GET", f"{OPS}/summary"),
    ]:
        assert_problem(await client.request(method, path, headers=no_ops), 403, "forbidden")
        assert_problem(await client.request(method, path), 401, "unauthenticated")
        bad = {"Authorization": "Bearer not-a-token"}
        assert_problem(await client.request(method, path, headers=bad), 401, "unauthenticated")
    row = await pool.fetchrow(
        "SELECT state, retried_by FROM workflow_streams.input_deliveries WHERE delivery_id = $1",
        dead[0],
    )
    assert (row["state"], row["retried_by"]) == ("dead", None)


async def test_other_tenants_and_runs_do_not_exist_for_the_operator(client, auth, tenant, pool):
    run_a, run_b, _ = await _two_runs(client, auth, tenant)
    dead = await delivery_ids(pool, tenant, run_a, "in")
    await mark_dead(pool, dead, "gone")

    stranger = auth(tenant=tenant + "-other", scopes=OPS_ONLY)
    r = await client.get(f"{OPS}/deliveries", headers=stranger)
    assert r.json() == {"deliveries": [], "next_page": None}
    assert_problem(
        await client.get(f"{OPS}/deliveries/{dead[0]}", headers=stranger), 404, "not_found"
    )
    assert_problem(
        await client.post(f"{OPS}/deliveries/{dead[0]}/retry", headers=stranger), 404, "not_found"
    )
    summary = (await client.get(f"{OPS}/summary", headers=stranger)).json()
    assert summary["counts"] == {"pending": 0, "retrying": 0, "delivered": 0, "dead": 0}
    assert (
        await pool.fetchval(
            "SELECT state FROM workflow_streams.input_deliveries WHERE delivery_id = $1", dead[0]
        )
        == "dead"
    )

    only_b = auth(tenant=tenant, scopes=OPS_ONLY, runs=[run_b])
    r = await client.get(f"{OPS}/deliveries", headers=only_b)
    assert {d["run_id"] for d in r.json()["deliveries"]} == {run_b}
    assert len(r.json()["deliveries"]) == 3
    assert_problem(
        await client.post(f"{OPS}/deliveries/{dead[0]}/retry", headers=only_b), 404, "not_found"
    )
    r = await client.get(f"{OPS}/deliveries", params={"run": run_a}, headers=only_b)
    assert r.json()["deliveries"] == []


async def test_bad_parameters_are_problems_with_stable_codes(client, auth, tenant):
    ops = auth(tenant=tenant, scopes=OPS_ONLY)
    cases = [
        ("deliveries", {"state": "stuck"}, "invalid_filter"),
        ("deliveries", {"run": "-bad run"}, "invalid_filter"),
        ("deliveries", {"stream": "UPPER"}, "invalid_filter"),
        ("deliveries", {"older_than": "-1"}, "invalid_filter"),
        ("deliveries", {"older_than": "soon"}, "invalid_filter"),
        ("deliveries", {"older_than": "nan"}, "invalid_filter"),
        ("deliveries", {"staet": "dead"}, "invalid_filter"),
        ("deliveries", {"limit": "0"}, "invalid_limit"),
        ("deliveries", {"limit": "1001"}, "invalid_limit"),
        ("deliveries", {"page": "abc"}, "invalid_page"),
        ("deliveries", {"page": "-1"}, "invalid_page"),
        ("gaps", {"page": "x"}, "invalid_page"),
        ("gaps", {"state": "dead"}, "invalid_filter"),
        ("summary", {"limit": "x"}, "invalid_limit"),
        ("summary", {"run": "r"}, "invalid_filter"),
    ]
    for endpoint, params, code in cases:
        r = await client.get(f"{OPS}/{endpoint}", params=params, headers=ops)
        assert_problem(r, 400, code)
    twice = await client.get(f"{OPS}/deliveries?state=dead&state=pending", headers=ops)
    assert_problem(twice, 400, "invalid_filter")


async def test_show_gives_the_payload_only_to_callers_who_may_read_it(client, auth, tenant, pool):
    admin = auth(tenant=tenant)
    await input_stream(
        client,
        admin,
        "run-s",
        redaction={"json_pointers": ["/user/email"]},
        placement={"client_egress_regions": ["local"]},
        authorization={"readers": ["reader", "oncall"], "writers": ["*"]},
    )
    await append(client, admin, "run-s", [{"user": {"email": "a@example.com", "name": "A"}}])
    (delivery,) = await delivery_ids(pool, tenant, "run-s", "in")
    url = f"{OPS}/deliveries/{delivery}"

    async def record(**token: Any) -> dict[str, Any]:
        r = await client.get(url, headers=auth(tenant=tenant, **token))
        assert r.status_code == 200, r.text
        assert r.json()["delivery_id"] == delivery and r.json()["state"] == "pending"
        result: dict[str, Any] = r.json()["record"]
        return result

    plain = await record(scopes=["streams:ops"], sub="oncall")
    assert plain["payload_visible"] is False and "payload" not in plain
    assert plain["payload_hidden_reason"] == "the token lacks streams:read"
    assert plain["size"] == len(b'{"user":{"email":"a@example.com","name":"A"}}')

    redacted = await record(scopes=["streams:ops", "streams:read"], sub="oncall")
    assert redacted["payload_visible"] is True
    assert redacted["payload"] == {"user": {"email": "[REDACTED]", "name": "A"}}

    full = await record(
        scopes=["streams:ops", "streams:read", "streams:read_unredacted"], sub="oncall"
    )
    assert full["payload"] == {"user": {"email": "a@example.com", "name": "A"}}
    # The record's fingerprint, whatever the caller may see of its payload, as reads show it.
    reader = auth(tenant=tenant, sub="reader")
    read = await client.get(f"{API}/runs/run-s/streams/in/records", headers=reader)
    assert read.status_code == 200, read.text
    [stored] = read.json()["records"]
    assert plain["fingerprint"] == redacted["fingerprint"] == full["fingerprint"]
    assert full["fingerprint"] == stored["fingerprint"]

    not_reader = await record(scopes=["streams:ops", "streams:read"], sub="someone")
    assert not_reader["payload_visible"] is False and "payload" not in not_reader
    assert "readers" in not_reader["payload_hidden_reason"]

    abroad = await record(scopes=["streams:ops", "streams:read"], sub="oncall", region="mars")
    assert abroad["payload_visible"] is False and "payload" not in abroad
    assert "region" in abroad["payload_hidden_reason"]


async def test_summary_counts_oldest_age_and_lag_per_stream(client, auth, tenant, pool):
    run_a, run_b, ops = await _two_runs(client, auth, tenant)
    a_ids = await delivery_ids(pool, tenant, run_a, "in")
    b_ids = await delivery_ids(pool, tenant, run_b, "in")
    side_ids = await delivery_ids(pool, tenant, run_b, "side")
    await mark_delivered(pool, a_ids[:1])
    await mark_dead(pool, b_ids, "gone")
    await pool.execute(
        "UPDATE workflow_streams.input_deliveries SET created_at = now() - interval '90 seconds' "
        "WHERE delivery_id = $1",
        side_ids[0],
    )
    r = await client.get(f"{OPS}/summary", headers=ops)
    assert r.status_code == 200, r.text
    summary = r.json()
    assert summary["counts"] == {"pending": 3, "retrying": 0, "delivered": 1, "dead": 2}
    assert 90 <= summary["oldest_pending_age_seconds"] < 120
    lag = [
        (s["run_id"], s["stream_id"], s["owed"], s["pending"], s["dead"])
        for s in summary["streams"]
    ]
    # the longest waiting first: side (90 s), then run-a and run-b by their oldest row
    assert lag[0] == (run_b, "side", 1, 1, 0)
    assert sorted(lag[1:]) == [(run_a, "in", 2, 2, 0), (run_b, "in", 2, 0, 2)]
    by_key = {(s["run_id"], s["stream_id"]): s for s in summary["streams"]}
    assert by_key[(run_a, "in")]["first_undelivered_sequence"] == 2
    assert by_key[(run_a, "in")]["latest_sequence"] == 3
    assert by_key[(run_a, "in")]["last_delivered_at"] is not None
    assert by_key[(run_b, "in")]["last_delivered_at"] is None
    assert by_key[(run_b, "side")]["lag_seconds"] >= 90

    limited = (await client.get(f"{OPS}/summary", params={"limit": "1"}, headers=ops)).json()
    assert [(s["run_id"], s["stream_id"]) for s in limited["streams"]] == [(run_b, "side")]

    await mark_delivered(pool, a_ids[1:] + side_ids)
    summary = (await client.get(f"{OPS}/summary", headers=ops)).json()
    assert summary["counts"] == {"pending": 0, "retrying": 0, "delivered": 4, "dead": 2}
    assert summary["oldest_pending_age_seconds"] is None
    assert [(s["run_id"], s["stream_id"]) for s in summary["streams"]] == [(run_b, "in")]


async def _stream_pk(pool: asyncpg.Pool, tenant: str, run_id: str, stream_id: str) -> int:
    pk: int = await pool.fetchval(
        "SELECT stream_pk FROM workflow_streams.streams "
        "WHERE tenant = $1 AND run_id = $2 AND stream_id = $3",
        tenant,
        run_id,
        stream_id,
    )
    return pk


async def test_gaps_newest_first_filtered_and_paged(client, auth, tenant, pool):
    run_a, run_b, ops = await _two_runs(client, auth, tenant)
    pk_a = await _stream_pk(pool, tenant, run_a, "in")
    pk_b = await _stream_pk(pool, tenant, run_b, "in")
    # as live delivery records them (its own named query)
    for pk, expected, received in [(pk_a, 2, 4), (pk_b, 1, 2), (pk_a, 5, 9)]:
        await pool.execute(
            QUERIES["gap_evidence_insert"], pk, expected, received, received - expected, "srv-1"
        )
    r = await client.get(f"{OPS}/gaps", headers=ops)
    assert r.status_code == 200, r.text
    gaps = r.json()["gaps"]
    assert [(g["run_id"], g["expected_sequence"], g["received_sequence"]) for g in gaps] == [
        (run_a, 5, 9),
        (run_b, 1, 2),
        (run_a, 2, 4),
    ]
    assert gaps[0]["repaired_records"] == 4 and gaps[0]["detected_by"] == "srv-1"
    assert r.json()["next_page"] is None

    only_a = await client.get(f"{OPS}/gaps", params={"run": run_a}, headers=ops)
    assert [g["expected_sequence"] for g in only_a.json()["gaps"]] == [5, 2]

    first = (await client.get(f"{OPS}/gaps", params={"limit": "2"}, headers=ops)).json()
    assert [g["expected_sequence"] for g in first["gaps"]] == [5, 1]
    rest = await client.get(
        f"{OPS}/gaps", params={"limit": "2", "page": first["next_page"]}, headers=ops
    )
    assert [g["expected_sequence"] for g in rest.json()["gaps"]] == [2]
    assert rest.json()["next_page"] is None

    stranger = auth(tenant=tenant + "-x", scopes=OPS_ONLY)
    assert (await client.get(f"{OPS}/gaps", headers=stranger)).json()["gaps"] == []


async def test_page_is_served_to_anyone_and_holds_no_data(client, auth, tenant, pool):
    await _two_runs(client, auth, tenant)
    r = await client.get(OPS)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert "run-a" not in r.text and "delivery_id" not in r.text
    js = await client.get(f"{OPS}/static/ops.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert "sessionStorage" in js.text
    css = await client.get(f"{OPS}/static/ops.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert_problem(await client.get(f"{OPS}/static/..%2Fapp.py"), 404, "not_found")
    assert_problem(await client.get(f"{OPS}/static/ops.html"), 404, "not_found")


async def test_retry_wakes_dispatchers_through_the_notification_hub(
    client, auth, tenant, pool, database_url
):
    from ductor_streams.live.hub import NotificationHub
    from tests.temporal.polling import eventually

    admin = auth(tenant=tenant)
    await input_stream(client, admin, "run-w")
    await append(client, admin, "run-w", ["x"])
    (delivery,) = await delivery_ids(pool, tenant, "run-w", "in")
    await mark_dead(pool, [delivery], "gone")
    stream_pk = await pool.fetchval(
        "SELECT stream_pk FROM workflow_streams.input_deliveries WHERE delivery_id = $1", delivery
    )
    hub = NotificationHub(database_url)
    await hub.start()
    woken: list[int] = []
    undo = hub.subscribe_any(lambda pk, _latest: woken.append(pk))
    try:
        ops = auth(tenant=tenant, scopes=OPS_ONLY)
        r = await client.post(f"{OPS}/deliveries/{delivery}/retry", headers=ops)
        assert r.status_code == 200, r.text

        async def wakes() -> list[int]:
            return list(woken)

        await eventually(wakes, lambda w: stream_pk in w, timeout=10, what="the retry's wake")
        # a refused retry changes nothing and wakes nobody
        woken.clear()
        again = await client.post(f"{OPS}/deliveries/{delivery}/retry", headers=ops)
        assert_problem(again, 409, "delivery_not_dead")
        # notifications arrive in commit order: a wake from the refused retry would come
        # before this probe's
        await pool.execute("SELECT pg_notify('workflow_streams', 'r0')")
        await eventually(wakes, lambda w: 0 in w, timeout=10, what="the probe wake")
        assert stream_pk not in woken
    finally:
        undo()
        await hub.close()


async def test_concurrent_retries_of_one_dead_delivery_succeed_once(client, auth, tenant, pool):
    import asyncio

    admin = auth(tenant=tenant)
    await input_stream(client, admin, "run-r")
    await append(client, admin, "run-r", ["x"])
    (delivery,) = await delivery_ids(pool, tenant, "run-r", "in")
    await mark_dead(pool, [delivery], "gone")
    operators = [auth(tenant=tenant, scopes=OPS_ONLY, sub=f"op-{i}") for i in range(12)]
    answers = await asyncio.gather(
        *(client.post(f"{OPS}/deliveries/{delivery}/retry", headers=h) for h in operators)
    )
    codes = sorted(r.status_code for r in answers)
    assert codes == [200] + [409] * 11
    (winner,) = [r.json()["retried_by"] for r in answers if r.status_code == 200]
    row = await pool.fetchrow(
        "SELECT state, retried_by, attempts FROM workflow_streams.input_deliveries "
        "WHERE delivery_id = $1",
        delivery,
    )
    assert (row["state"], row["retried_by"], row["attempts"]) == ("pending", winner, 0)
