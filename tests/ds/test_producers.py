"""Idempotent producers and Stream-Seq under concurrency: the checks are decided under
the stream's row lock in the appending transaction (``workflow_streams.ds_append``)."""

from __future__ import annotations

import asyncio

import httpx
import msgspec

from tests.ds.conftest import Ds

ROUNDS = 20


def _producer(ds: Ds, epoch: int, seq: int) -> dict[str, str]:
    return {
        **ds.headers,
        "Content-Type": "application/json",
        "Producer-Id": "writer",
        "Producer-Epoch": str(epoch),
        "Producer-Seq": str(seq),
    }


async def test_two_epochs_racing_exactly_one_wins_each_sequence(ds: Ds) -> None:
    """Producer "writer" runs as epoch 0 (a zombie) and epoch 1 (its successor) at once;
    each sends seq 0..19 in order, and every request twice at the same time (a retry
    race). Each (epoch, seq) is appended at most once, exactly once unless fenced; once
    epoch 1 has written, epoch 0 only gets 403; the stream holds exactly the winners."""
    put = await ds.http.put(ds.url("p"), headers={**ds.headers, "Content-Type": "application/json"})
    assert put.status_code == 201
    outcomes: dict[tuple[int, int], list[httpx.Response]] = {}

    async def run(epoch: int) -> None:
        for seq in range(ROUNDS):
            body = msgspec.json.encode({"epoch": epoch, "seq": seq})
            pair = await asyncio.gather(
                *(
                    ds.http.post(ds.url("p"), headers=_producer(ds, epoch, seq), content=body)
                    for _ in range(2)
                )
            )
            outcomes[(epoch, seq)] = list(pair)
            if all(r.status_code == 403 for r in pair):
                return  # fenced: its later requests would be refused as well

    await asyncio.gather(run(0), run(1))

    records = msgspec.json.decode(
        (await ds.http.get(ds.url("p") + "?offset=-1", headers=ds.headers)).content
    )
    winners = []
    fenced_from = None
    for (epoch, seq), pair in sorted(outcomes.items()):
        codes = sorted(r.status_code for r in pair)
        assert set(codes) <= {200, 204, 403}, (epoch, seq, codes)
        assert codes.count(200) <= 1, (epoch, seq, codes)
        if 200 in codes:
            winners.append({"epoch": epoch, "seq": seq})
            ok = next(r for r in pair if r.status_code == 200)
            assert ok.headers["producer-epoch"] == str(epoch)
            assert ok.headers["producer-seq"] == str(seq)
        for r in pair:
            if r.status_code == 204:
                assert r.headers["producer-seq"] == str(seq)  # a duplicate of the winner
            if r.status_code == 403:
                assert epoch == 0 and r.headers["producer-epoch"] == "1"
                assert r.json()["code"] == "producer_fenced"
        if epoch == 1:
            assert codes == [200, 204], (seq, codes)  # the newest epoch is never fenced
        elif 200 not in codes:
            fenced_from = seq if fenced_from is None else min(fenced_from, seq)
    if fenced_from is not None:  # nothing of epoch 0 won after it was first fenced
        assert all(w["seq"] < fenced_from for w in winners if w["epoch"] == 0)
    # Exactly the winners, each once; epoch 0's records all come before epoch 1's.
    assert sorted(records, key=lambda r: (r["epoch"], r["seq"])) == winners
    epochs = [r["epoch"] for r in records]
    assert epochs == sorted(epochs)
    assert [r["seq"] for r in records if r["epoch"] == 1] == list(range(ROUNDS))


async def test_producer_errors_and_close_dedup(ds: Ds) -> None:
    json_headers = {**ds.headers, "Content-Type": "application/json"}
    assert (await ds.http.put(ds.url("q"), headers=json_headers)).status_code == 201
    url = ds.url("q")
    assert (await ds.http.post(url, headers=_producer(ds, 0, 0), content=b"[0]")).status_code == 200
    gap = await ds.http.post(url, headers=_producer(ds, 0, 2), content=b"[2]")
    assert gap.status_code == 409 and gap.json()["code"] == "producer_seq_gap"
    assert gap.headers["producer-expected-seq"] == "1"
    assert gap.headers["producer-received-seq"] == "2"
    bad_epoch = await ds.http.post(url, headers=_producer(ds, 1, 1), content=b"[1]")
    assert bad_epoch.status_code == 400 and bad_epoch.json()["code"] == "invalid_producer"
    partial = {**json_headers, "Producer-Id": "writer"}
    assert (await ds.http.post(url, headers=partial, content=b"[1]")).status_code == 400
    # Stream-Seq: strictly increasing, byte-wise.
    for seq, status in (("b", 204), ("a", 409), ("b", 409), ("ba", 204)):
        r = await ds.http.post(url, headers={**json_headers, "Stream-Seq": seq}, content=b"[9]")
        assert r.status_code == status, (seq, r.text)
    # Append-and-close by a producer; its retry is a duplicate, anything else 409.
    close = {**_producer(ds, 0, 1), "Stream-Closed": "true"}
    r = await ds.http.post(url, headers=close, content=b'["last"]')
    assert r.status_code == 200 and r.headers["stream-closed"] == "true"
    retry = await ds.http.post(url, headers=close, content=b'["other body"]')
    assert retry.status_code == 204 and retry.headers["stream-closed"] == "true"
    late = await ds.http.post(url, headers=json_headers, content=b"[1]")
    assert late.status_code == 409 and late.headers["stream-closed"] == "true"
    assert late.headers["stream-next-offset"] == "00000000000000000004"
    records = msgspec.json.decode(
        (await ds.http.get(url + "?offset=-1", headers=ds.headers)).content
    )
    assert records == [0, 9, 9, "last"]
