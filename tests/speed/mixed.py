"""A mixed append workload and two judges of its answers.

``serial_answers`` computes what each request gets when the requests are decided one
at a time, in order, exactly as the contract says (the reference model). ``check_answers``
judges answers of a run whose order is unknown (separate transactions, HTTP): every
answer must be one some serial order could give, and the stored log must match.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ductor_streams.store import encode_batch

Answer = tuple[str, int | None, int | None]  # outcome, first, last


@dataclass(frozen=True)
class Request:
    payloads: list[Any]
    key: str | None = None

    @property
    def sizes(self) -> list[int]:
        return encode_batch(self.payloads).sizes

    @property
    def body_hash(self) -> str:
        return encode_batch(self.payloads, idempotency_key=self.key).request_hash


@dataclass
class Ceilings:
    max_unread_bytes: int | None = None
    max_total_items: int | None = None


@dataclass
class Model:
    """The stream as the contract defines it, with no acks (everything stays unread)."""

    ceilings: Ceilings
    latest: int = 0
    total_bytes: int = 0
    closed: bool = False
    receipts: dict[str, tuple[str, int, int]] = field(default_factory=dict)

    def decide(self, request: Request) -> Answer:
        n, size = len(request.payloads), sum(request.sizes)
        if request.key is not None and request.key in self.receipts:
            body_hash, first, last = self.receipts[request.key]
            if body_hash == request.body_hash:
                return ("replayed", first, last)
            return ("key_reused", None, None)
        c = self.ceilings
        if self.closed:
            return ("stream_closed", None, None)
        if c.max_total_items is not None and self.latest + n > c.max_total_items:
            return ("quota_exhausted", None, None)
        if c.max_unread_bytes is not None and self.total_bytes + size > c.max_unread_bytes:
            return ("credit_exhausted", None, None)
        first, last = self.latest + 1, self.latest + n
        self.latest, self.total_bytes = last, self.total_bytes + size
        if request.key is not None:
            self.receipts[request.key] = (request.body_hash, first, last)
        return ("appended", first, last)


def serial_answers(model: Model, requests: list[Request]) -> list[Answer]:
    return [model.decide(r) for r in requests]


def workload(tag: str) -> list[Request]:
    """Replays, key reuse, requests past credit (bytes) and quota (items), batches."""
    big = "x" * 300
    requests: list[Request] = []
    for i in range(80):
        kind = i % 10
        if kind == 0:
            requests.append(Request([f"{tag}-{i}"], key=f"{tag}-k{i}"))
        elif kind == 1:
            requests.append(Request([f"{tag}-{i - 1}"], key=f"{tag}-k{i - 1}"))  # replay
        elif kind == 2:
            requests.append(Request(["other body"], key=f"{tag}-k{i - 2}"))  # key reused
        elif kind == 3:
            requests.append(Request([i, i + 1, i + 2]))  # a batch of 3
        elif kind == 4:
            requests.append(Request([big]))  # 302 bytes: soon past the bytes credit
        elif kind == 5:
            requests.append(Request([i], key="pre-existing"))  # key used before the run
        else:
            requests.append(Request([i]))
    return requests


def check_answers(
    requests: list[Request],
    answers: list[Answer],
    stored: dict[int, str],
    ceilings: Ceilings,
    pre_receipts: dict[str, tuple[Request, int, int]],
) -> None:
    """Judge answers given in an unknown order against the stored log ``stored``."""
    latest = max(stored, default=0)
    assert sorted(stored) == list(range(1, latest + 1)), "sequences must be 1..N gap-free"
    covered: list[int] = []
    appended_by_key: dict[str, tuple[Request, int, int]] = dict(pre_receipts)
    pre_count = sum(last - first + 1 for _, first, last in pre_receipts.values())
    for request, (outcome, first, last) in zip(requests, answers, strict=True):
        if outcome != "appended":
            continue
        assert first is not None and last is not None
        assert last - first + 1 == len(request.payloads)
        texts = [stored[s] for s in range(first, last + 1)]
        assert texts == encode_batch(request.payloads).payloads, "a request's own records"
        covered.extend(range(first, last + 1))
        if request.key is not None:
            assert request.key not in appended_by_key, "a key appended twice"
            appended_by_key[request.key] = (request, first, last)
    assert len(covered) == len(set(covered))
    assert len(covered) + pre_count == latest, "every stored record belongs to one answer"

    total_bytes = sum(len(t.encode()) for t in stored.values())
    if ceilings.max_total_items is not None:
        assert latest <= ceilings.max_total_items, "over-admitted past the quota"
    if ceilings.max_unread_bytes is not None:
        assert total_bytes <= ceilings.max_unread_bytes, "over-admitted past the credit"
    for request, (outcome, first, last) in zip(requests, answers, strict=True):
        n, size = len(request.payloads), sum(request.sizes)
        known = appended_by_key.get(request.key) if request.key is not None else None
        if outcome == "replayed":
            assert known is not None and known[0].body_hash == request.body_hash
            assert (first, last) == known[1:]
        elif outcome == "key_reused":
            assert known is not None and known[0].body_hash != request.body_hash
        elif outcome in ("quota_exhausted", "credit_exhausted"):
            # Without acks the log only grows: a refusal must hold against the end state.
            if outcome == "quota_exhausted":
                assert ceilings.max_total_items is not None
                assert latest + n > ceilings.max_total_items
            else:
                assert ceilings.max_unread_bytes is not None
                assert total_bytes + size > ceilings.max_unread_bytes
        elif outcome == "appended":
            pass
        else:
            assert outcome == "stream_closed", outcome
