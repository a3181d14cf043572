"""Where a streamed record's time goes, hop by hop: timestamps taken inside the worker
and the server by wrapping a few of their functions (bench only: nothing in
``ductor_streams`` knows about it), joined per record afterwards.

``python -m bench.temporal_delivery --hops`` notes the input path instead (server:
``input_appended``, a local input append's commit reaching the dispatcher; ``claim``,
each claim's start, end and the records it leased; ``signal``, each signal's start and
end) and ``input_hop_table`` joins them with the POSTs and Temporal's signal events.

``python -m bench.activity_streams --hops`` turns it on: the worker
(``bench.activity_streams_worker``) and the server (``python -m bench.hops serve ...``,
the ``ductor-streams`` command with the wrappers installed) then note, in wall time
(one host clock), per append statement, per wake and per follower read and fan-out:

worker (``install_worker``)
    ``submit``: a batch reaches the appender (``Appender.submit``) - its records were
    made (``t`` in the payload) and lingered in the writer before that;
    ``sent`` / ``returned``: the append statement carrying it was sent / answered
    (committed); ``inline``: it carried its own NOTIFY (delivered at its commit);
    ``wakes``: each wake statement (``WakeSender``) with its start, end and payloads.
server (``install_server``)
    ``notify``: a wake reached the LISTEN connection (``NotificationHub._on_notify``);
    ``read``: a follower read, its start, end and the sequences it returned;
    ``fan_out``: a batch handed to the subscribers (the SSE write is synchronous in it).

Both also note each garbage collection (start, duration, generation: ``gc_pauses`` sums
them over the load), and at the dump the objects the collector tracks, how many are
frozen (ductor_streams/runtime/gc_tuning.py) and, by type, what a full collection then finds
unreachable (reference cycles).

Each process writes its notes as JSON to ``$BENCH_HOPS_DIR/<role>-<pid>.json`` when it
gets SIGUSR1 (or exits); ``hop_table`` joins them with the followers' receive times.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import signal
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ENV = "BENCH_HOPS_DIR"

_notes: dict[str, list[Any]] = defaultdict(list)
_role = "unknown"


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def dump() -> None:
    directory = os.environ.get(ENV)
    if not directory:
        return
    path = Path(directory) / f"{_role}-{os.getpid()}.json"
    _notes["gc_objects"] = [(len(gc.get_objects()), gc.get_freeze_count())]
    # What a full collection now finds unreachable (reference cycles), by type.
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        kinds = Counter(type(o).__qualname__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    _notes["gc_garbage"] = kinds.most_common(12)
    path.write_text(json.dumps(_notes))


def _on_dump_signal(*_: Any) -> None:
    dump()


def _install_dump(role: str) -> None:
    global _role
    _role = role
    atexit.register(dump)
    signal.signal(signal.SIGUSR1, _on_dump_signal)
    _note_collections()
    _watch_stalls()


# The event loop ticks every STALL_TICK seconds; a thread notes the main thread's stack
# when no tick came for STALL_SECONDS (one note per stall, at its first sighting).
STALL_TICK = 0.005
STALL_SECONDS = 0.015


def _watch_stalls() -> None:
    """Note the event loop's stalls: when, how long, and where the main thread was."""
    import asyncio
    import threading
    import traceback

    last = [time.monotonic()]
    noted: list[bool] = []  # the stall under way has its note (not dumped with the notes)
    main = threading.main_thread().ident

    def tick(loop: asyncio.AbstractEventLoop) -> None:
        now = time.monotonic()
        gap = now - last[0]
        if gap > STALL_SECONDS + STALL_TICK and noted:
            _notes["stalls"][-1][1] = gap  # the stall's length, once it ended
        noted.clear()
        last[0] = now
        loop.call_later(STALL_TICK, tick, loop)

    def watch() -> None:
        while True:
            time.sleep(0.003)
            if time.monotonic() - last[0] > STALL_SECONDS and not noted:
                frame = sys._current_frames().get(main or 0)
                stack = traceback.extract_stack(frame)[-8:] if frame is not None else []
                where = " <- ".join(
                    f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(stack)
                )
                _notes["stalls"].append([time.time(), None, where])
                noted.append(True)

    # asyncio.run, uvloop.run and uvicorn all make their loop in asyncio.Runner: the
    # watch starts with the first loop made there, whichever kind it is.
    original_init = asyncio.Runner._lazy_init  # type: ignore[attr-defined]
    started: list[bool] = []

    def lazy_init(self: asyncio.Runner) -> None:
        original_init(self)
        if not started:
            started.append(True)
            self._loop.call_soon(tick, self._loop)  # type: ignore[attr-defined]
            threading.Thread(target=watch, daemon=True).start()

    asyncio.Runner._lazy_init = lazy_init  # type: ignore[attr-defined]


def _note_collections() -> None:
    """Note each garbage collection of this process: wall start, seconds, generation
    (a collection holds the event loop; ``gc_pauses`` sums them over the load)."""
    started: list[float] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[:] = [time.time()]
        elif started:
            at = started[0]
            _notes["gc"].append((at, time.time() - at, info.get("generation", -1)))

    gc.callbacks.append(on_gc)


# -- the worker ---------------------------------------------------------------------------


class _Timed:
    """The wake sender's connection (or pool), noting each wake statement's start, end
    and payloads."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def fetch(self, query: str, *args: Any) -> Any:
        started = time.time()
        try:
            return await self._inner.fetch(query, *args)
        finally:
            _notes["wakes"].append((started, time.time(), list(args[0])))

    async def fetchval(self, query: str, *args: Any) -> Any:
        started = time.time()
        try:
            return await self._inner.fetchval(query, *args)
        finally:
            _notes["wakes"].append((started, time.time(), list(args[0])))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def install_worker() -> None:
    """Wrap the appender and the wake sender of this process."""
    from ductor_streams.store import append as append_module
    from ductor_streams.store.wakes import WakeSender

    _install_dump("worker")
    Appender = append_module.Appender
    submitted: dict[int, float] = {}  # id(batch) -> submit time
    sent: dict[int, float] = {}  # id(batch) -> statement sent
    inline: dict[int, bool] = {}

    original_init = Appender.__init__
    original_submit = Appender.submit
    original_send = Appender._send
    original_settle = Appender._settle_group
    original_wakes_init = WakeSender.__init__

    def wakes_init(self: Any, pool: Any, **kwargs: Any) -> None:
        original_wakes_init(self, pool, **kwargs)
        if hasattr(self, "_connection"):
            self._connection = _Timed(self._connection)
        else:  # older: the wakes go through the pool
            self._pool = _Timed(self._pool)

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)

    async def submit(self: Any, stream_pk: int, batch: Any, **kwargs: Any) -> Any:
        submitted[id(batch)] = time.time()
        return await original_submit(self, stream_pk, batch, **kwargs)

    async def send(
        self: Any, name: str, head: Any, batches: list[Any], notify_inline: bool, *tail: Any
    ) -> Any:
        now = time.time()
        for batch in batches:
            sent[id(batch)] = now
            inline[id(batch)] = notify_inline
        return await original_send(self, name, head, batches, notify_inline, *tail)

    def settle(
        self: Any,
        stream_pk: int,
        group: list[Any],
        outcomes: list[Any],
        notify_inline: bool,
        appended_at: Any,
    ) -> None:
        now = time.time()
        for (batch, _), (name, first, _last) in zip(group, outcomes, strict=True):
            key = id(batch)
            if name == "appended" and key in submitted:
                _notes["batches"].append(
                    {
                        "pk": stream_pk,
                        "first": first,
                        "made": [_made(p) for p in batch.payloads],
                        "submit": submitted.pop(key),
                        "sent": sent.pop(key, now),
                        "begun": appended_at.timestamp(),
                        "returned": now,
                        "inline": inline.pop(key, False),
                    }
                )
            else:
                submitted.pop(key, None)
                sent.pop(key, None)
                inline.pop(key, None)
        original_settle(self, stream_pk, group, outcomes, notify_inline, appended_at)

    Appender.__init__ = init  # type: ignore[method-assign]
    Appender.submit = submit  # type: ignore[method-assign]
    Appender._send = send  # type: ignore[method-assign]
    Appender._settle_group = settle  # type: ignore[method-assign]
    WakeSender.__init__ = wakes_init  # type: ignore[method-assign]


def _made(payload: str) -> float | None:
    try:
        value = json.loads(payload).get("t")
    except (ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) else None


# -- the server -----------------------------------------------------------------------------


def install_server() -> None:
    """Wrap the hub, the followers' reads and their fan-outs in this process."""
    from ductor_streams.live import hub as hub_module
    from ductor_streams.live import stream_follower as follower_module

    _install_dump("server")
    Hub = hub_module.NotificationHub
    Follower = follower_module.StreamFollower
    original_notify = Hub._on_notify
    original_offer = Follower._offer

    def on_notify(self: Any, conn: object, pid: int, channel: str, payload: str) -> None:
        wake = hub_module.parse_wake(payload)
        if wake is not None and payload[:1] in ("r", "R"):
            _notes["notify"].append((wake[0], wake[1], time.time()))
        original_notify(self, conn, pid, channel, payload)

    def offer(self: Any, batch: Any, subscribers: Any, lag: bool = True) -> None:
        # Every fan-out, from the task or within a feed, hands out its first slice here.
        started = time.time()
        original_offer(self, batch, subscribers, lag)
        if batch.records and lag:
            _notes["fan_out"].append(
                (self.stream_pk, batch.records[0].sequence, batch.records[-1].sequence, started)
            )

    def wrap_read(follower: Any) -> None:
        read = follower._read

        async def timed(stream_pk: int, after: int, limit: int) -> Any:
            started = time.time()
            page = await read(stream_pk, after, limit)
            last = page.records[-1].sequence if page.records else after
            _notes["read"].append((stream_pk, after, last, started, time.time()))
            return page

        follower._read = timed

    original_follower_init = Follower.__init__

    def follower_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_follower_init(self, *args, **kwargs)
        wrap_read(self)

    Hub._on_notify = on_notify  # type: ignore[method-assign,assignment]
    Follower._offer = offer  # type: ignore[method-assign]
    Follower.__init__ = follower_init  # type: ignore[method-assign]
    _install_dispatcher()


def _install_dispatcher() -> None:
    """Wrap the input path of this process: a local input append's commit reaching the
    dispatcher, its claims and its signals."""
    from ductor_streams.delivery import dispatcher as dispatcher_module
    from ductor_streams.process import dispatcher as service_module

    Dispatcher = dispatcher_module.Dispatcher
    Wakes = service_module._InputWakes
    original_local = Wakes.local
    original_claim = Dispatcher._claim
    original_send = Dispatcher._send
    original_adopt = Dispatcher.adopt

    def local(self: Any, ref: Any, last_sequence: int) -> None:
        _notes["input_appended"].append((ref.stream_pk, last_sequence, time.time()))
        original_local(self, ref, last_sequence)

    async def claim(self: Any, max_streams: int, named: int | None = None) -> Any:
        started = time.time()
        streams = await original_claim(self, max_streams, named)
        claimed = [(d.stream_pk, d.event.sequence) for s in streams for d in s.deliveries]
        _notes["claim"].append((started, time.time(), claimed))
        return streams

    async def send(self: Any, stream: Any, delivery: Any) -> bool:
        started = time.time()
        sent: bool = await original_send(self, stream, delivery)
        _notes["signal"].append((delivery.stream_pk, delivery.event.sequence, started, time.time()))
        return sent

    def adopt(self: Any, deliveries: list[Any], started: float) -> None:
        leased = [(d.stream_pk, d.event.sequence) for d in deliveries]
        _notes["adopt"].append((time.time(), leased))
        original_adopt(self, deliveries, started)

    Wakes.local = local  # type: ignore[method-assign]
    Dispatcher._claim = claim  # type: ignore[method-assign]
    Dispatcher._send = send  # type: ignore[method-assign]
    Dispatcher.adopt = adopt  # type: ignore[method-assign]


INPUT_HOPS = (
    ("POST sent -> append committed (in serve)", "sent", "committed"),
    ("committed -> claim sent", "committed", "claim_start"),
    ("claim statement", "claim_start", "claim_end"),
    ("claim answered -> signal sent", "claim_end", "signal_start"),
    ("committed -> leased rows handed over (no claim)", "committed", "adopted"),
    ("handed over -> signal sent", "adopted", "signal_start"),
    ("signal sent -> Temporal recorded it", "signal_start", "recorded"),
    ("total: POST sent -> Temporal recorded it", "sent", "recorded"),
)


def input_hop_table(
    directory: Path, stream_pk: int, sent: dict[int, float], recorded: dict[int, float]
) -> dict[str, Any]:
    """Each input hop's p50/p99 over the records of one input stream: ``sent`` and
    ``recorded`` are sequence -> wall time of the POST's write and of Temporal's signal
    event; the server's notes give the rest."""
    _, server = load(directory)
    per: dict[int, dict[str, float]] = {
        seq: {"sent": at, "recorded": recorded[seq]} for seq, at in sent.items() if seq in recorded
    }
    commits = sorted(
        (at, last) for pk, last, at in server.get("input_appended", []) if pk == stream_pk
    )
    for seq, times in per.items():
        for at, last in commits:
            if last >= seq and at >= times["sent"]:
                times["committed"] = at
                break
    for start, end, claimed in sorted(server.get("claim", [])):
        for pk, seq in claimed:
            if pk == stream_pk and seq in per and "claim_start" not in per[seq]:
                per[seq]["claim_start"], per[seq]["claim_end"] = start, end
    for at, leased in sorted(server.get("adopt", []), key=lambda n: n[0]):
        for pk, seq in leased:
            if pk == stream_pk and seq in per and "adopted" not in per[seq]:
                per[seq]["adopted"] = at
    for pk, seq, start, _end in sorted(server.get("signal", []), key=lambda n: n[2]):
        if pk == stream_pk and seq in per and "signal_start" not in per[seq]:
            per[seq]["signal_start"] = start
    table: dict[str, Any] = {
        label: _percentiles(
            [(t[end] - t[start]) * 1000 for t in per.values() if start in t and end in t]
        )
        for label, start, end in INPUT_HOPS
    }
    table["records"] = len(per)
    return table


def print_input_hops(table: dict[str, Any]) -> None:
    _print_table(table, INPUT_HOPS, ("records",))


# -- the join --------------------------------------------------------------------------------


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"n": len(ordered), "p50_ms": pick(0.5), "p90_ms": pick(0.9), "p99_ms": pick(0.99)}


def load(directory: Path) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    """The worker's and the server's notes (one process each)."""
    worker: dict[str, list[Any]] = {}
    server: dict[str, list[Any]] = {}
    for path in directory.glob("*.json"):
        notes = json.loads(path.read_text())
        target = worker if path.name.startswith("worker-") else server
        for key, values in notes.items():
            target.setdefault(key, []).extend(values)
    return worker, server


HOPS = (
    ("made -> appender (writer linger)", "made", "submit"),
    ("appender -> statement sent (group-commit queue)", "submit", "sent"),
    ("sent -> transaction begun", "sent", "begun"),
    ("begun -> committed, answer back", "begun", "returned"),
    ("answer -> wake sent (NOTIFY statement start)", "returned", "wake_start"),
    ("wake sent -> LISTEN hub in serve", "wake_start", "hub"),
    ("hub -> fan-out, records from the wake (no read)", "hub_fed", "fan_out"),
    ("hub -> follower read begins", "hub", "read_start"),
    ("follower read", "read_start", "read_end"),
    ("read -> fan-out (SSE write)", "read_end", "fan_out"),
    ("SSE write -> client has it", "fan_out", "received"),
    ("total: made -> client", "made", "received"),
)


def hop_table(
    directory: Path, received: dict[int, dict[int, float]], streams: set[int]
) -> dict[str, Any]:
    """Each hop's p50/p99 over the records of ``streams`` (stream_pk -> sequence ->
    the follower's receive wall time in ``received``)."""
    worker, server = load(directory)
    per: dict[tuple[int, int], dict[str, float]] = {}
    for batch in worker.get("batches", []):
        if batch["pk"] not in streams:
            continue
        for offset, made in enumerate(batch["made"]):
            times = {k: batch[k] for k in ("submit", "sent", "begun", "returned")}
            if made is not None:
                times["made"] = made
            if batch["inline"]:
                # The statement's own NOTIFY went at its commit.
                times["wake_start"] = batch["returned"]
            per[(batch["pk"], batch["first"] + offset)] = times
    # Wake statements: the first that carried r<pk>:<latest >= seq> after the commit.
    wakes_by_pk: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
    for start, end, payloads in worker.get("wakes", []):
        for payload in payloads:
            if payload[:1] in ("r", "R"):
                pk_text, _, rest = payload[1:].partition(":")
                latest = rest.partition(":")[0]
                if latest:
                    wakes_by_pk[int(pk_text)].append((start, end, int(latest)))
    notify_by_pk: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for pk, latest, at in server.get("notify", []):
        if latest is not None:
            notify_by_pk[pk].append((at, latest))
    reads_by_pk: dict[int, list[tuple[float, float, int, int]]] = defaultdict(list)
    for pk, after, last, start, end in server.get("read", []):
        reads_by_pk[pk].append((start, end, after, last))
    fan_by_pk: dict[int, list[tuple[float, int, int]]] = defaultdict(list)
    for pk, first, last, at in server.get("fan_out", []):
        fan_by_pk[pk].append((at, first, last))
    for lists in (wakes_by_pk, notify_by_pk, reads_by_pk, fan_by_pk):
        for values in lists.values():
            values.sort()
    for (pk, seq), times in per.items():
        returned = times["returned"]
        if "wake_start" not in times:
            for start, _end, latest in wakes_by_pk.get(pk, ()):
                if latest >= seq and start >= returned - 0.0005:
                    times["wake_start"] = start
                    break
        for at, latest in notify_by_pk.get(pk, ()):
            if latest >= seq and at >= times["begun"] - 0.001:
                times["hub"] = at
                break
        for start, end, after, last in reads_by_pk.get(pk, ()):
            if after < seq <= last:
                times["read_start"], times["read_end"] = start, end
                break
        for at, first, last in fan_by_pk.get(pk, ()):
            if first <= seq <= last:
                times["fan_out"] = at
                break
        if "hub" in times and "read_end" not in times:
            times["hub_fed"] = times["hub"]
        got = received.get(pk, {}).get(seq)
        if got is not None:
            times["received"] = got
    table: dict[str, Any] = {}
    # The slowest 1% of records (made -> client at or above its p99): each hop's median
    # among them says which hop the tail is made of.
    totals = sorted(
        t["received"] - t["made"] for t in per.values() if "made" in t and "received" in t
    )
    tail = totals[min(len(totals) - 1, int(0.99 * len(totals)))] if totals else None
    slow = [
        t
        for t in per.values()
        if tail is not None
        and "made" in t
        and "received" in t
        and t["received"] - t["made"] >= tail
    ]
    for label, start, end in HOPS:
        table[label] = _percentiles(
            [(t[end] - t[start]) * 1000 for t in per.values() if start in t and end in t]
        )
        in_slow = sorted((t[end] - t[start]) * 1000 for t in slow if start in t and end in t)
        if in_slow:
            table[label]["slowest_1pc_p50_ms"] = round(in_slow[len(in_slow) // 2], 2)
    table["late_windows"] = late_windows(per)
    fed = sum(1 for t in per.values() if "fan_out" in t and "read_end" not in t)
    made = [t["made"] for t in per.values() if "made" in t]
    if made:
        window = (min(made), max(t.get("received", t["made"]) for t in per.values() if "made" in t))
        table["gc_pauses"] = {
            role: gc_pauses(notes.get("gc", []), window)
            for role, notes in (("worker", worker), ("server", server))
        }
        table["loop_stalls"] = {
            role: sorted(
                (
                    [round((length or 0) * 1000, 1), where]
                    for at, length, where in notes.get("stalls", [])
                    if window[0] <= at <= window[1]
                ),
                reverse=True,
            )
            for role, notes in (("worker", worker), ("server", server))
            if "stalls" in notes
        }
        # At the notes' dump, after the load: objects the collector tracks and frozen,
        # and what a full collection then found unreachable.
        for key in ("gc_objects", "gc_garbage"):
            table[key] = {
                role: notes[key][-1] if key == "gc_objects" else notes[key]
                for role, notes in (("worker", worker), ("server", server))
                if notes.get(key)
            }
    table["records"] = len(per)
    table["records_read_by_serve"] = sum(1 for t in per.values() if "read_end" in t)
    table["records_fed_without_read"] = fed
    table["records_with_inline_notify"] = sum(
        1 for t in per.values() if t.get("wake_start") == t["returned"]
    )
    return table


# A record later than this (made -> client) is "late": the p99 target.
LATE_SECONDS = 0.020
# Late records are grouped by the window of made time they fall in.
LATE_WINDOW_SECONDS = 0.1


def late_windows(per: dict[tuple[int, int], dict[str, float]]) -> dict[str, Any]:
    """Whether the late records come together (a stall of everything) or one by one:
    how many there are, in how many windows of made time, and the worst windows, each
    with its late records, their longest total and the hop that took longest in it."""
    done = [t for t in per.values() if "made" in t and "received" in t]
    if not done:
        return {"late": 0, "windows": 0, "worst": []}
    start = min(t["made"] for t in done)
    windows: dict[int, list[dict[str, float]]] = defaultdict(list)
    for t in done:
        if t["received"] - t["made"] > LATE_SECONDS:
            windows[int((t["made"] - start) / LATE_WINDOW_SECONDS)].append(t)
    worst = []
    for index, late in sorted(windows.items(), key=lambda kv: -len(kv[1]))[:5]:
        slowest = max(late, key=lambda t: t["received"] - t["made"])
        hops = [
            ((slowest[end] - slowest[begin]) * 1000, label)
            for label, begin, end in HOPS[:-1]
            if begin in slowest and end in slowest
        ]
        longest_ms, longest = max(hops) if hops else (0.0, "-")
        worst.append(
            {
                "at_s": round(index * LATE_WINDOW_SECONDS, 1),
                "late": len(late),
                "max_ms": round((slowest["received"] - slowest["made"]) * 1000, 1),
                "longest_hop": longest,
                "longest_hop_ms": round(longest_ms, 1),
            }
        )
    per_second: dict[int, int] = defaultdict(int)
    for index, late in windows.items():
        per_second[int(index * LATE_WINDOW_SECONDS)] += len(late)
    seconds = int(max(t["made"] for t in done) - start) + 1
    # The same totals without the load's first second (start-up: first statements on
    # fresh connections, every writer's first batch at once).
    after_first = [(t["received"] - t["made"]) * 1000 for t in done if t["made"] - start >= 1.0]
    late = [t for records in windows.values() for t in records]
    return {
        # Which hops the late records' time went to: the first second's and the rest's.
        "late_hops": {
            "first_second": _hop_medians([t for t in late if t["made"] - start < 1.0]),
            "after": _hop_medians([t for t in late if t["made"] - start >= 1.0]),
        },
        "after_first_second": _percentiles(after_first),
        "per_second": [per_second.get(second, 0) for second in range(seconds)],
        "late": sum(len(v) for v in windows.values()),
        "windows": len(windows),
        "of_windows": int((max(t["made"] for t in done) - start) / LATE_WINDOW_SECONDS) + 1,
        "worst": worst,
    }


def _hop_medians(records: list[dict[str, float]]) -> dict[str, Any]:
    """How many records, and each hop's median over them (ms), longest first."""
    medians = []
    for label, begin, end in HOPS[:-1]:
        spans = sorted((t[end] - t[begin]) * 1000 for t in records if begin in t and end in t)
        if spans:
            medians.append((round(spans[len(spans) // 2], 2), label))
    return {"n": len(records), "hops": sorted(medians, reverse=True)}


def gc_pauses(notes: list[Any], window: tuple[float, float]) -> dict[str, Any]:
    """The collections of one process within the load's ``window``: per generation,
    how many, their total and their longest pause in milliseconds."""
    by_generation: dict[str, dict[str, float]] = {}
    for at, seconds, generation in notes:
        if window[0] <= at <= window[1]:
            row = by_generation.setdefault(
                f"gen{generation}", {"count": 0, "total_ms": 0.0, "max_ms": 0.0}
            )
            row["count"] += 1
            row["total_ms"] = round(row["total_ms"] + seconds * 1000, 2)
            row["max_ms"] = round(max(row["max_ms"], seconds * 1000), 2)
    return dict(sorted(by_generation.items()))


def print_hops(table: dict[str, Any]) -> None:
    _print_table(
        table,
        HOPS,
        (
            "records",
            "records_read_by_serve",
            "records_fed_without_read",
            "records_with_inline_notify",
        ),
    )
    for role, generations in table.get("gc_pauses", {}).items():
        text = ", ".join(
            f"{name} {row['count']} ({row['total_ms']} ms, longest {row['max_ms']})"
            for name, row in generations.items()
        )
        print(f"garbage collections in the {role} during the load: {text or 'none'}")
        if role in table.get("gc_objects", {}):
            tracked, frozen = table["gc_objects"][role]
            garbage = ", ".join(f"{kind} {n}" for kind, n in table["gc_garbage"].get(role, []))
            print(
                f"  after the load: {tracked:,} objects tracked, {frozen:,} frozen;"
                f" unreachable: {garbage or 'none'}"
            )
    _print_stalls(table)
    _print_late(table)


def _print_late(table: dict[str, Any]) -> None:
    late = table.get("late_windows")
    if not late or not late["late"]:
        return
    print(
        f"records over {LATE_SECONDS * 1000:g} ms: {late['late']}, made in {late['windows']}"
        f" of {late['of_windows']} windows of {LATE_WINDOW_SECONDS * 1000:g} ms;"
        f" per second of the load: {late['per_second']}; the worst windows:"
    )
    rest = late["after_first_second"]
    if rest["n"]:
        print(
            f"  made -> client from the load's second second on: p50 {rest['p50_ms']} ms,"
            f" p90 {rest['p90_ms']} ms, p99 {rest['p99_ms']} ms ({rest['n']} records)"
        )
    for part, hops in late.get("late_hops", {}).items():
        if hops["n"]:
            spent = "; ".join(f"{label} {ms}" for ms, label in hops["hops"][:4])
            print(
                f"  late records made in the {part.replace('_', ' ')} ({hops['n']}),"
                f" hop medians (ms), longest first: {spent}"
            )
    for w in late["worst"]:
        print(
            f"  at {w['at_s']:>5} s: {w['late']:>4} late, up to {w['max_ms']} ms;"
            f" its slowest record's longest hop: {w['longest_hop']} ({w['longest_hop_ms']} ms)"
        )


def _print_stalls(table: dict[str, Any]) -> None:
    for role, stalls in table.get("loop_stalls", {}).items():
        total = sum(length for length, _ in stalls)
        print(
            f"event loop stalls over {STALL_SECONDS * 1000:g} ms in the {role}: {len(stalls)}"
            f" ({total:.0f} ms); the longest, with where the main thread was at"
            f" {STALL_SECONDS * 1000:g} ms:"
        )
        for length, where in stalls[:6]:
            print(f"  {length:>7} ms  {where}")


def _print_table(
    table: dict[str, Any], hops: tuple[tuple[str, str, str], ...], counts: tuple[str, ...]
) -> None:
    """Each hop's p50/p99 and count, then the named counts."""
    print(
        f"{'hop':<52}{'p50 ms':>10}{'p90 ms':>10}{'p99 ms':>10}{'n':>8}{'slowest 1%: p50 ms':>20}"
    )
    for label, _, _ in hops:
        row = table[label]
        print(
            f"{label:<52}{row.get('p50_ms', '-'):>10}{row.get('p90_ms', '-'):>10}"
            f"{row.get('p99_ms', '-'):>10}{row['n']:>8}"
            f"{row.get('slowest_1pc_p50_ms', '-'):>20}"
        )
    for key in counts:
        print(f"{key}: {table[key]}")


def serve_main() -> None:
    """``python -m bench.hops serve ...``: ``ductor-streams`` with the server's wrappers."""
    install_server()
    from ductor_streams.process.cli import main

    sys.exit(main(sys.argv[1:]))


# The stream_pks of the load whose notes a hops directory keeps (JSON), beside the notes.
LOAD_STREAMS = "load-streams.txt"


def statement_lines(
    worker: dict[str, list[Any]], start_ms: float, end_ms: float, streams: set[int] | None
) -> list[str]:
    """The worker's append statements sent between ``start_ms`` and ``end_ms`` after the
    load's first record was made (the load: the batches of ``streams``, or all): when
    each was sent, its transaction's start and its answer after that, its streams'
    groups, and the oldest record it carried and the first submit, all in ms from the
    first record made."""
    batches = [b for b in worker.get("batches", []) if streams is None or b["pk"] in streams]
    made = [m for batch in batches for m in batch["made"] if m is not None]
    if not made:
        return []
    origin = min(made)
    statements: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for batch in batches:
        statements[batch["sent"]].append(batch)
    lines = []
    for sent, group in sorted(statements.items()):
        if not start_ms <= (sent - origin) * 1000 <= end_ms:
            continue
        oldest = min((m for b in group for m in b["made"] if m is not None), default=sent)
        lines.append(
            f"sent {(sent - origin) * 1000:8.1f}  begun +{(group[0]['begun'] - sent) * 1000:5.1f}"
            f"  answered +{(max(b['returned'] for b in group) - group[0]['begun']) * 1000:5.1f}"
            f"  groups {len(group):3}  oldest record made {(oldest - origin) * 1000:8.1f}"
            f"  first submit {(min(b['submit'] for b in group) - origin) * 1000:8.1f}"
        )
    return lines


def statements_main(argv: list[str]) -> None:
    """``python -m bench.hops statements DIR [FROM_MS TO_MS]``: the append statements of
    a ``--hops`` run whose notes are in DIR (``bench.activity_streams`` prints it),
    by default those of the load's first 300 ms."""
    directory = Path(argv[0])
    start_ms, end_ms = (float(argv[1]), float(argv[2])) if len(argv) >= 3 else (0.0, 300.0)
    worker, _ = load(directory)
    listed = directory / LOAD_STREAMS
    streams = set(json.loads(listed.read_text())) if listed.exists() else None
    for line in statement_lines(worker, start_ms, end_ms, streams):
        print(line)


if __name__ == "__main__":
    if sys.argv[1:2] == ["statements"]:
        statements_main(sys.argv[2:])
    else:
        serve_main()
