"""``/metrics``: Prometheus text with exact increments from real appends, credit
rejections, and delivery states read from Postgres at scrape time."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import API
from tests.ops.helpers import OPS, append, delivery_ids, input_stream, mark_dead
from tests.temporal.polling import eventually


async def scrape(client: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = await client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_appends_bytes_and_credit_rejections_count_exactly(client, auth, tenant, run_id):
    headers = auth(tenant=tenant)
    before = await scrape(client)
    await input_stream(client, headers, run_id)
    await append(client, headers, run_id, [{"a": 1}, "xy"])  # 7 + 4 bytes
    r = await client.post(
        f"{API}/runs/{run_id}/streams",
        json={
            "stream_id": "tight",
            "direction": "output",
            "consumers": ["c"],
            "credit": {"max_unread_items": 1, "max_total_items": 3},
        },
        headers=headers,
    )
    assert r.status_code == 201, r.text
    await append(client, headers, run_id, [1], stream_id="tight")
    url = f"{API}/runs/{run_id}/streams/tight/records"
    refused = await client.post(url, json={"records": [{"payload": 2}]}, headers=headers)
    assert refused.status_code == 429
    # an idempotent replay commits nothing and is not counted
    keyed = {**headers, "Idempotency-Key": "k1"}
    first = await client.post(
        f"{API}/runs/{run_id}/streams/in/records",
        json={"records": [{"payload": 0}]},
        headers=keyed,
    )
    again = await client.post(
        f"{API}/runs/{run_id}/streams/in/records",
        json={"records": [{"payload": 0}]},
        headers=keyed,
    )
    assert (first.status_code, again.status_code) == (201, 200)

    after = await scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("ductor_streams_appends_total", direction="input") == 2
    assert delta("ductor_streams_appended_records_total", direction="input") == 3
    assert delta("ductor_streams_appended_bytes_total", direction="input") == 7 + 4 + 1
    assert delta("ductor_streams_appends_total", direction="output") == 1
    assert delta("ductor_streams_appended_bytes_total", direction="output") == 1
    assert delta("ductor_streams_credit_rejections_total", reason="credit") == 1
    assert delta("ductor_streams_credit_rejections_total", reason="quota") == 0


async def test_delivery_states_come_from_postgres_and_retries_are_counted(
    client, auth, tenant, run_id, pool
):
    headers = auth(tenant=tenant)
    await input_stream(client, headers, run_id)
    await append(client, headers, run_id, ["a", "b", "c"])
    ids = await delivery_ids(pool, tenant, run_id, "in")
    before = await scrape(client)
    await mark_dead(pool, ids[1:], "gone")
    ops = auth(tenant=tenant, scopes=["streams:ops"])
    assert (await client.post(f"{OPS}/deliveries/{ids[2]}/retry", headers=ops)).status_code == 200

    # Other tests' rows (and any dispatcher still at work) live in the same database:
    # the gauges must agree with Postgres itself, read right after the scrape.
    async def scrape_and_count() -> tuple[dict[Any, float], dict[str, int]]:
        samples = await scrape(client)
        rows = await pool.fetch(
            "SELECT state, count(*) AS n FROM workflow_streams.input_deliveries GROUP BY state"
        )
        return samples, {r["state"]: r["n"] for r in rows}

    def agree(pair: tuple[dict[Any, float], dict[str, int]]) -> bool:
        samples, counts = pair
        return all(
            value(samples, "ductor_streams_deliveries", state=state) == counts.get(state, 0)
            for state in ("pending", "retrying", "delivered", "dead")
        )

    after, counts = await eventually(scrape_and_count, agree, timeout=10, what="gauges = rows")
    assert counts["dead"] >= 1 and counts["pending"] >= 2
    assert (
        value(after, "ductor_streams_delivery_operator_retries_total")
        - value(before, "ductor_streams_delivery_operator_retries_total")
        == 1
    )
    assert value(after, "ductor_streams_delivery_oldest_owed_age_seconds") >= 0


async def test_every_promised_metric_is_exposed_without_tenant_data(client, auth, tenant, run_id):
    headers = auth(tenant=tenant)
    await input_stream(client, headers, run_id)
    await append(client, headers, run_id, [{"secret": "do-not-leak"}])
    text = (await client.get("/metrics")).text
    for name in [
        "ductor_streams_appends_total",
        "ductor_streams_appended_bytes_total",
        "ductor_streams_credit_rejections_total",
        "ductor_streams_deliveries",
        "ductor_streams_delivery_latency_seconds_bucket",
        "ductor_streams_delivery_attempts_total",
        "ductor_streams_subscribers",
        "ductor_streams_gap_repairs_total",
        "ductor_streams_pruned_records_total",
        "ductor_streams_object_deletions_total",
        "process_cpu_seconds_total",
    ]:
        assert f"\n{name}" in text, name
    assert run_id not in text and tenant not in text and "do-not-leak" not in text


async def test_upkeep_counts_what_it_pruned_expired_and_deleted(
    client, auth, tenant, run_id, pool, settings
):
    from ductor_streams.maintenance.upkeep import run_pass
    from ductor_streams.objects.stores import BlobStores

    headers = auth(tenant=tenant)
    r = await client.post(
        f"{API}/runs/{run_id}/streams",
        json={"stream_id": "short", "direction": "output", "retention": {"max_records": 1}},
        headers=headers,
    )
    assert r.status_code == 201, r.text
    await append(client, headers, run_id, [1, 2, 3], stream_id="short")
    before = await scrape(client)
    report = await run_pass(pool, BlobStores(settings.object_stores), sweep_orphans_now=False)
    after = await scrape(client)
    assert report.retention.records >= 2  # this test's two, perhaps others' too

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("ductor_streams_pruned_records_total") == report.retention.records
    assert delta("ductor_streams_expired_object_intents_total") == report.expired_intents
    assert delta("ductor_streams_object_deletions_total", outcome="done") == (
        report.deletions.deleted
    )
    assert delta("ductor_streams_object_deletions_total", outcome="failed") == (
        report.deletions.failed
    )


async def test_sse_subscribers_gauge_follows_open_subscriptions(server, auth, tenant, run_id):
    import httpx

    from tests.temporal.polling import eventually

    headers = auth(tenant=tenant)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        r = await http.post(
            f"{API}/runs/{run_id}/streams",
            json={"stream_id": "out", "direction": "output"},
            headers=headers,
        )
        assert r.status_code == 201, r.text

        async def subscribers() -> float:
            return value(await scrape(http), "ductor_streams_subscribers")

        base = await subscribers()
        url = f"{API}/runs/{run_id}/streams/out/subscribe"
        async with http.stream("GET", url, headers=headers) as one:
            assert one.status_code == 200
            async with http.stream("GET", url, headers=headers) as two:
                assert two.status_code == 200
                await eventually(subscribers, lambda n: n == base + 2, what="two subscribers")
            await eventually(subscribers, lambda n: n == base + 1, what="one left")
        await eventually(subscribers, lambda n: n == base, what="none left")


async def test_a_repaired_live_gap_is_counted_and_shown_to_operators(
    client, auth, tenant, run_id, pool, store, database_url
):
    from ductor_streams.config import LiveSettings
    from ductor_streams.live.events import LiveBatch
    from ductor_streams.live.followers import Followers
    from ductor_streams.live.hub import NotificationHub
    from ductor_streams.store import StreamKey
    from ductor_streams.store.read import read_page

    headers = auth(tenant=tenant)
    r = await client.post(
        f"{API}/runs/{run_id}/streams",
        json={"stream_id": "out", "direction": "output"},
        headers=headers,
    )
    assert r.status_code == 201, r.text
    await append(client, headers, run_id, list(range(1, 4)), stream_id="out")
    ref = await store.get_stream(StreamKey(tenant, run_id, "out"))
    # A hub that never LISTENs: only the batch offered by hand reaches the subscriber.
    followers = Followers(pool, NotificationHub(database_url), LiveSettings(page_records=10))
    sub = await followers.subscribe(ref.stream_pk, 3)
    try:
        await append(client, headers, run_id, list(range(4, 10)), stream_id="out")
        page = await read_page(pool, ref.stream_pk, 0, 9)
        before = await scrape(client)
        sub.offer(LiveBatch([r for r in page.records if r.sequence >= 7], 9, False))  # 4-6 lost
        item = await sub.next(5.0)
        assert isinstance(item, list)
        assert [r.sequence for b in item for r in b.records] == [4, 5, 6]
        after = await scrape(client)
    finally:
        followers.release(ref.stream_pk, sub)
    assert (
        value(after, "ductor_streams_gap_repairs_total")
        - value(before, "ductor_streams_gap_repairs_total")
        == 1
    )
    assert (
        value(after, "ductor_streams_gap_repaired_records_total")
        - value(before, "ductor_streams_gap_repaired_records_total")
        == 3
    )
    ops = auth(tenant=tenant, scopes=["streams:ops"])
    gaps = (await client.get(f"{OPS}/gaps", params={"run": run_id}, headers=ops)).json()["gaps"]
    assert [
        (
            g["stream_id"],
            g["expected_sequence"],
            g["received_sequence"],
            g["repaired_records"],
            g["detected_by"],
        )
        for g in gaps
    ] == [("out", 4, 7, 3, followers.detected_by)]


async def test_an_object_commit_counts_as_one_appended_record(client, auth, tenant, run_id):
    import hashlib

    headers = auth(tenant=tenant)
    base = f"{API}/runs/{run_id}/streams/files"
    r = await client.post(
        f"{API}/runs/{run_id}/streams",
        json={
            "stream_id": "files",
            "direction": "output",
            "placement": {"object_regions": ["local"]},
        },
        headers=headers,
    )
    assert r.status_code == 201, r.text
    data = b"object bytes"
    r = await client.post(
        f"{base}/objects",
        json={
            "idempotency_key": "o1",
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
            "content_type": "text/plain",
            "schema": None,
            "region": "local",
            "metadata": {"name": "a.txt"},
        },
        headers=headers,
    )
    assert r.status_code == 201, r.text
    object_id = r.json()["object_id"]
    r = await client.put(f"{base}/objects/{object_id}/content", content=data, headers=headers)
    assert r.status_code == 200, r.text
    before = await scrape(client)
    r = await client.post(f"{base}/objects/{object_id}/commit", headers=headers)
    assert r.status_code == 201, r.text
    again = await client.post(f"{base}/objects/{object_id}/commit", headers=headers)
    assert again.status_code == 200
    after = await scrape(client)

    def delta(name: str) -> float:
        return value(after, name, direction="output") - value(before, name, direction="output")

    assert delta("ductor_streams_appends_total") == 1
    assert delta("ductor_streams_appended_records_total") == 1
    assert delta("ductor_streams_appended_bytes_total") == len(b'{"name":"a.txt"}')
