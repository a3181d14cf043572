"""A native page of records (``GET .../records``) as a response body: whole when one piece
holds it, else a piece at a time (http/middleware/write_budget.py).

The page's first query reads its first piece: the records within ``piece_bytes`` of
payload of the first (``store.read.read_page_text``, or ``read_page`` for a reader with
redaction or a page with object references). A page that fits is answered from it
alone, byte for byte as before. A larger one is sent as ``PAGE_HEAD``, the pieces'
records joined with commas, then the page's tail, each piece read only when the last
one has been written. The tail's bounds are those of the first query's snapshot; the
pieces hold exactly the records of that page (records are immutable and sequences
dense), unless retention removes them meanwhile: then the response is cut short
(``PageGone``), never answered with a gap.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from ductor_streams.http.codecs.json_bodies import (
    PAGE_HEAD,
    encode_json,
    encode_record,
    page_json,
    page_tail,
    page_text_json,
)
from ductor_streams.store import Store, StreamRef
from ductor_streams.store.models import Record


class PageGone(Exception):
    """Records of a page being sent were removed (retention) before they were read."""


async def page_body(
    store: Store,
    ref: StreamRef,
    redaction: list[str],
    after: int,
    count: int,
    piece_bytes: int,
    fingerprint: str | None = None,
) -> tuple[bytes, AsyncIterator[bytes] | None]:
    """The page of at most ``count`` records after ``after``: ``(body, None)`` when its
    first piece holds it all, else ``(b"", pieces)``. With ``fingerprint`` (of the record
    the reader saw at ``after``), HistoryDiverged when the stream's record there differs:
    the text read checks it in its own statement, the record-by-record read looks first."""
    if not redaction:
        text = await store.read_text(ref, after, count, piece_bytes, fingerprint)
        if text is not None:
            if text.complete:
                return page_text_json(text), None
            tail = page_tail(
                text.next_cursor, text.earliest_sequence, text.latest_sequence, text.closed
            )
            head = PAGE_HEAD + text.records_json.encode()
            return b"", _pieces(
                store,
                ref,
                redaction,
                head,
                after,
                text.last_sequence,
                text.next_cursor,
                tail,
                piece_bytes,
            )
    elif fingerprint is not None:
        await store.verify_fingerprint(ref, after, fingerprint)
    page = await store.read(ref, after, count, piece_bytes)
    # Sequences are dense: the page is after+1 .. after+count, up to the latest.
    page_last = min(after + count, page.latest_sequence) if page.records else after
    if page.next_cursor >= page_last:
        return encode_json(page_json(page, redaction)), None
    tail = page_tail(page_last, page.earliest_sequence, page.latest_sequence, page.closed)
    head = PAGE_HEAD + _joined(page.records, redaction)
    return b"", _pieces(
        store, ref, redaction, head, after, page.next_cursor, page_last, tail, piece_bytes
    )


async def _pieces(
    store: Store,
    ref: StreamRef,
    redaction: list[str],
    head: bytes,
    after: int,
    last: int,
    page_last: int,
    tail: bytes,
    piece_bytes: int,
) -> AsyncIterator[bytes]:
    """``head`` (the page's start and its first piece, the records after ``after`` up to
    ``last``), each later piece up to ``page_last`` with its leading comma, ``tail``.

    No piece stays referenced here once yielded (the values are yielded, never kept in
    a local): a stalled reader holds only what its connection's send buffer holds."""
    state = _Progress(last, last - after)
    first = [head]
    del head
    yield first.pop()
    while state.last < page_last:
        yield await _piece(store, ref, redaction, state, page_last, piece_bytes)
    yield tail


class _Progress:
    """How far a page's pieces got: the last sequence sent, and the last piece's records."""

    __slots__ = ("last", "span")

    def __init__(self, last: int, span: int) -> None:
        self.last = last
        self.span = span


async def _piece(
    store: Store,
    ref: StreamRef,
    redaction: list[str],
    state: _Progress,
    page_last: int,
    piece_bytes: int,
) -> bytes:
    """The records after ``state.last`` within ``piece_bytes``, encoded with a leading
    comma; ``state`` moves on past them."""
    after = state.last
    # The query's range ends two pieces' worth of records on (at the last piece's rate):
    # its scan stops there, and its byte budget ends the piece.
    end = min(page_last, after + 2 * state.span)
    if not redaction:
        text = await store.read_range_text(ref, after, end, piece_bytes)
        if text is not None:
            check_dense(after, text.count, text.last_sequence)
            state.last, state.span = text.last_sequence, text.count
            return b"," + text.records_json.encode()
    records = await store.read_range(ref, after, end, piece_bytes)
    check_dense(after, len(records), records[-1].sequence if records else after)
    state.last, state.span = records[-1].sequence, len(records)
    return b"," + _joined(records, redaction)


def _joined(records: Sequence[Record], redaction: list[str]) -> bytes:
    return b",".join([encode_record(r, redaction) for r in records])


def check_dense(after: int, count: int, last: int) -> None:
    """PageGone unless the piece holds the records right after ``after``, each once."""
    if count == 0 or last - after != count:
        raise PageGone(f"records after {after} were removed while their page was sent")
