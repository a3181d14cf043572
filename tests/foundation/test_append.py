"""Append: sequences, batches, idempotency, the inline cap, close."""

from __future__ import annotations

import asyncio

import msgspec

from ductor_streams.errors import InvalidIdempotencyKey
from ductor_streams.store.encoding import check_idempotency_key
from tests.foundation.helpers import append, assert_problem, create, state, stream_url


async def test_batch_gets_consecutive_sequences_in_request_order(client, auth, run_id):
    h = auth()
    await create(client, h, run_id)
    r = await append(client, h, run_id, [{"n": 1}, "two", 3, None, [4], True])
    assert r.status_code == 201
    assert r.json() == {"first_sequence": 1, "last_sequence": 6}
    r = await append(client, h, run_id, ["seven"])
    assert r.json() == {"first_sequence": 7, "last_sequence": 7}
    page = (await client.get(stream_url(run_id, "s", "/records"), headers=h)).json()
    assert [rec["sequence"] for rec in page["records"]] == [1, 2, 3, 4, 5, 6, 7]
    assert [rec["payload"] for rec in page["records"]] == [
        {"n": 1},
        "two",
        3,
        None,
        [4],
        True,
        "seven",
    ]


async def test_payload_key_order_and_unicode_survive(client, auth, run_id):
    h = auth()
    await create(client, h, run_id)
    payload = {"z": 1, "a": {"é": "日本", "b": [1.5, -2, 1e-7]}}
    await append(client, h, run_id, [payload])
    r = await client.get(stream_url(run_id, "s", "/records"), headers=h)
    # Compare raw text: key order as sent, raw UTF-8, compact size.
    rec = r.json()["records"][0]
    assert list(rec["payload"]) == ["z", "a"]
    assert rec["payload"] == payload
    assert rec["size"] == len(msgspec.json.encode(payload))


async def test_sixteen_concurrent_writers_get_1_to_800_without_gaps(client, auth, run_id):
    h = auth()
    await create(client, h, run_id)
    writers, per_writer = 16, 50
    results: dict[int, list[int]] = {w: [] for w in range(writers)}

    async def writer(w: int) -> None:
        for i in range(per_writer):
            r = await append(client, h, run_id, [{"w": w, "i": i}])
            assert r.status_code == 201, r.text
            results[w].append(r.json()["first_sequence"])

    await asyncio.gather(*(writer(w) for w in range(writers)))
    all_sequences = sorted(s for seqs in results.values() for s in seqs)
    assert all_sequences == list(range(1, writers * per_writer + 1))
    records = []
    cursor = 0
    while True:
        page = (
            await client.get(
                stream_url(run_id, "s", f"/records?cursor={cursor}&limit=1000"), headers=h
            )
        ).json()
        records.extend(page["records"])
        if not page["records"]:
            break
        cursor = page["next_cursor"]
    assert [r["sequence"] for r in records] == list(range(1, 801))
    for w in range(writers):
        mine = [r["payload"]["i"] for r in records if r["payload"]["w"] == w]
        assert mine == list(range(per_writer)), f"writer {w} out of order"
        # The sequence each writer was told is the one its record holds.
        assert [r["sequence"] for r in records if r["payload"]["w"] == w] == results[w]
    st = await state(client, h, run_id)
    assert st["latest_sequence"] == 800 and st["total_items"] == 800


async def test_idempotent_replay_returns_original_and_adds_nothing(client, auth, run_id):
    h = auth()
    await create(client, h, run_id)
    first = await append(client, h, run_id, [1, 2], key="order-1")
    assert first.status_code == 201
    assert "idempotent-replayed" not in first.headers
    await append(client, h, run_id, [3])
    again = await append(client, h, run_id, [1, 2], key="order-1")
    assert again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == {"first_sequence": 1, "last_sequence": 2}
    st = await state(client, h, run_id)
    assert st["latest_sequence"] == 3 and st["total_items"] == 3


async def test_same_key_other_body_is_422_and_changes_nothing(client, auth, run_id):
    h = auth()
    await create(client, h, run_id)
    await append(client, h, run_id, [1], key="k")
    before = await state(client, h, run_id)
    r = await append(client, h, run_id, [2], key="k")
    assert_problem(r, 422, "idempotency_key_reused")
    assert await state(client, h, run_id) == before


async def test_concurrent_replays_of_one_key_append_once(client, auth, run_id):
    h = auth()
    await create(client, h, run_id)
    responses = await asyncio.gather(
        *(append(client, h, run_id, ["x"], key="same") for _ in range(20))
    )
    assert sorted(r.status_code for r in responses) == [200] * 19 + [201]
    assert {(r.json()["first_sequence"], r.json()["last_sequence"]) for r in responses} == {(1, 1)}
    assert (await state(client, h, run_id))["latest_sequence"] == 1


async def test_bad_idempotency_keys_are_rejected(client, auth, run_id):
    h = auth()
    await create(client, h, run_id)
    for key in [b"", b"x" * 256, b"tab\tkey", "ünï".encode()]:
        r = await client.post(
            stream_url(run_id, "s", "/records"),
            json={"records": [{"payload": 1}]},
            headers={**h, "Idempotency-Key": key},
        )
        assert_problem(r, 400, "invalid_idempotency_key")
    r = await append(client, h, run_id, [1], key="x" * 255)
    assert r.status_code == 201
    assert (await state(client, h, run_id))["latest_sequence"] == 1


def _payload_of_size(size: int) -> str:
    # A JSON string of n ASCII characters encodes to n + 2 bytes.
    return "a" * (size - 2)


async def test_inline_cap_is_65536_bytes_exactly(client, auth, run_id):
    h = auth()
    await create(client, h, run_id)
    ok = await append(client, h, run_id, [_payload_of_size(65_536)])
    assert ok.status_code == 201, ok.text
    too_big = await append(client, h, run_id, ["small", _payload_of_size(65_537)])
    body = assert_problem(too_big, 413, "record_too_large")
    assert "65537" in body["detail"] or "65,537" in body["detail"]
    st = await state(client, h, run_id)
    assert st["latest_sequence"] == 1  # the whole batch was refused
    assert st["total_bytes"] == 65_536


async def test_multibyte_payload_size_counts_utf8_bytes(client, auth, run_id):
    h = auth()
    await create(client, h, run_id)
    # "é" is 2 bytes raw: 32,767 of them + 2 quotes = 65,536 bytes.
    assert (await append(client, h, run_id, ["é" * 32_767])).status_code == 201
    assert_problem(await append(client, h, run_id, ["é" * 32_768]), 413, "record_too_large")


async def test_batch_size_limits(client, auth, run_id):
    h = auth()
    await create(client, h, run_id)
    assert_problem(await append(client, h, run_id, []), 400, "invalid_batch")
    assert_problem(await append(client, h, run_id, list(range(1001))), 400, "invalid_batch")
    r = await append(client, h, run_id, list(range(1000)))
    assert r.json() == {"first_sequence": 1, "last_sequence": 1000}


async def test_malformed_bodies_are_400_and_change_nothing(client, auth, run_id):
    h = auth()
    await create(client, h, run_id)
    url = stream_url(run_id, "s", "/records")
    for content in [
        b"",
        b"{",
        b"[]",
        b'{"records": {}}',
        b'{"records": [{}]}',
        b'{"records": [{"payload": 1, "extra": 2}]}',
        b'{"records": [1]}',
        b'{"recs": []}',
    ]:
        r = await client.post(
            url, content=content, headers={**h, "Content-Type": "application/json"}
        )
        assert_problem(r, 400, "invalid_body")
    assert (await state(client, h, run_id))["latest_sequence"] == 0


async def test_closed_stream_rejects_appends_and_close_is_idempotent(client, auth, run_id):
    h = auth()
    await create(client, h, run_id)
    await append(client, h, run_id, [1, 2])
    r = await client.post(stream_url(run_id, "s", "/close"), headers=h)
    assert r.status_code == 200 and r.json() == {"closed": True, "last_sequence": 2}
    r = await client.post(stream_url(run_id, "s", "/close"), headers=h)
    assert r.status_code == 200 and r.json() == {"closed": True, "last_sequence": 2}
    assert_problem(await append(client, h, run_id, [3]), 409, "stream_closed")
    st = await state(client, h, run_id)
    assert st["closed"] is True and st["latest_sequence"] == 2
    page = (await client.get(stream_url(run_id, "s", "/records"), headers=h)).json()
    assert page["closed"] is True and [r["payload"] for r in page["records"]] == [1, 2]


async def test_replay_of_a_key_still_answers_after_close(client, auth, run_id):
    h = auth()
    await create(client, h, run_id)
    await append(client, h, run_id, [1], key="k1")
    await client.post(stream_url(run_id, "s", "/close"), headers=h)
    r = await append(client, h, run_id, [1], key="k1")
    assert r.status_code == 200 and r.json() == {"first_sequence": 1, "last_sequence": 1}


def _accepted(key: str) -> bool:
    try:
        return check_idempotency_key(key) == key
    except InvalidIdempotencyKey:
        return False


def test_an_idempotency_key_is_printable_ascii_exactly() -> None:
    # check_idempotency_key tests the characters in C (str.isascii, str.isprintable):
    # the same set as 0x20-0x7E. Every code point up to 0x2FF, and printable and
    # unprintable ones beyond (any non-ASCII one fails str.isascii).
    codes = [*range(0x300), 0x2028, 0x3000, 0x4E2D, 0xD800, 0xFEFF, 0xFFFF, 0x1F600, 0x10FFFF]
    accepted = [code for code in codes if _accepted(f"k{chr(code)}")]
    assert accepted == list(range(0x20, 0x7F))
    assert check_idempotency_key(None) is None
