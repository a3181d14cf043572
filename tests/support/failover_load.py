"""Load across a database failover, over real HTTP against a ``serve`` process, and what
it saw: for tests/production/test_ha_failover.py and bench/failover.py.

- writers append one record at a time, each with its own ``Idempotency-Key``, and retry
  the same key (after ``retry_delay``) on a 503 or a dropped connection until it is
  answered 2xx;
- subscribers follow the stream over SSE from its start and, whenever a response ends
  or fails, resume with ``Last-Event-ID``; the first ``resuming`` of them also drop
  their response themselves once the outage has begun (the first append answered 503),
  as a client whose connection broke in the gap, and resume with ``Last-Event-ID``
  through the outage (its 503s included) to the end;
- an optional input feeder appends one record to a workflow's input stream every
  ``input_every`` seconds (keyed and retried likewise);
- ``/readyz`` is polled every 50 ms;
- a ``WritableProbe`` per database node tells, independently of the server, when each
  node took writes (a fresh connection every 20 ms: not read-only, and
  ``txid_current()``, which a standby refuses).

Every answer keeps its start and end time (``time.monotonic``), so that a fault's
figures (``FaultFigures``) can be read off afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
from httpx_sse import EventSource, aconnect_sse

API = "/api/workflow-streams"


def stream_path(run_id: str, stream_id: str) -> str:
    return f"{API}/runs/{run_id}/streams/{stream_id}"


@dataclass(frozen=True)
class Answer:
    """One HTTP answer (``status`` None: the connection failed) and when it was asked
    and answered."""

    kind: str
    started: float
    ended: float
    status: int | None


def contract_break(response: httpx.Response) -> str | None:
    """Why a 5xx breaks the outage contract (503 ``database_unavailable`` as a problem
    with ``Retry-After`` >= 1), or None when it does not."""
    if response.status_code < 500:
        return None
    retry_after = response.headers.get("retry-after", "")
    try:
        code = response.json().get("code")
    except ValueError:
        code = None
    if (
        response.status_code == 503
        and response.headers.get("content-type", "").startswith("application/problem+json")
        and code == "database_unavailable"
        and retry_after.isdigit()
        and int(retry_after) >= 1
    ):
        return None
    return f"{response.status_code} {response.text[:300]!r} retry-after={retry_after!r}"


@dataclass
class Subscriber:
    """One SSE follower: every record event it got, in order, over all its responses."""

    records: list[dict[str, Any]] = field(default_factory=list)
    responses: int = 0
    refused: Counter[int] = field(default_factory=Counter)  # subscribe answered non-200
    failures: Counter[str] = field(default_factory=Counter)  # responses that broke off
    # Set for a follower that drops its response once the outage begins (``resuming``).
    drop: asyncio.Event | None = None
    dropped_after: int | None = None  # the sequence it had when it dropped its response
    resumed_from: list[int] = field(default_factory=list)  # Last-Event-ID of each resume

    @property
    def last(self) -> int:
        return self.records[-1]["sequence"] if self.records else 0


# A session that may write (not read-only, as on a standby or a primary kept read-only)
# and gets a transaction id (which a standby refuses).
_TAKES_WRITES = """
SELECT CASE WHEN current_setting('transaction_read_only') = 'off'
            THEN txid_current() IS NOT NULL ELSE false END
"""


class WritableProbe:
    """Polls one node straight (not through the server) and keeps each change of whether
    it takes writes: ``changes`` is ``[(time, writable), ...]``."""

    def __init__(self, dsn: str, every: float = 0.02) -> None:
        self.dsn = dsn
        self.every = every
        self.changes: list[tuple[float, bool]] = []
        self._task: asyncio.Task[None] | None = None

    async def _writable(self) -> bool:
        try:
            conn = await asyncpg.connect(self.dsn, timeout=0.5)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return False
        try:
            # txid_current() alone also succeeds in a read-only session of a primary (as
            # pg_auto_failover keeps a promoted node for a moment): that takes no writes.
            return bool(await conn.fetchval(_TAKES_WRITES))
        except (
            OSError,
            asyncpg.PostgresError,
            asyncpg.InterfaceError,
            # the connection broken under the query (the node going down mid-switchover)
            asyncpg.InternalClientError,
        ):
            return False
        finally:
            conn.terminate()

    async def _run(self) -> None:
        while True:
            writable = await self._writable()
            if not self.changes or self.changes[-1][1] != writable:
                self.changes.append((time.monotonic(), writable))
            await asyncio.sleep(self.every)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def first(self, writable: bool, after: float) -> float | None:
        """When it was first seen (not) taking writes at or after ``after``."""
        return next((at for at, w in self.changes if w == writable and at >= after), None)


@dataclass
class FaultFigures:
    """A fault's timeline, from the load's answers and the node probes."""

    fault_at: float
    writable_at: float  # the new primary took a write (its probe)
    last_2xx_before: float  # the last append answered 2xx before the gap
    first_2xx_after: float  # the first append answered 2xx after it

    @property
    def outage(self) -> float:
        """The longest time without any append answered 2xx, around the fault."""
        return self.first_2xx_after - self.last_2xx_before

    @property
    def writes_again(self) -> float:
        """From the moment the new primary took a write to the first append answered
        2xx (negative when the server got there before the probe's next look)."""
        return self.first_2xx_after - self.writable_at


class FailoverLoad:
    """``await start()``, the fault, ``await stop()``; then the answers and records."""

    def __init__(
        self,
        base_url: str,
        headers: dict[str, str],
        run_id: str,
        *,
        writers: int = 4,
        subscribers: int = 20,
        resuming: int = 0,
        input_stream: str | None = None,
        input_every: float = 0.1,
        pace: float = 0.01,
        retry_delay: float = 0.05,
    ) -> None:
        self.base_url = base_url
        self.headers = headers
        self.run_id = run_id
        self.stream = "out"
        self.writers = writers
        self.input_stream = input_stream
        self.input_every = input_every
        self.pace = pace
        self.retry_delay = retry_delay
        self.answers: list[Answer] = []
        self.broken: list[str] = []  # answers that break the contract
        self.transport_errors: Counter[str] = Counter()
        self.acked: dict[str, tuple[int, dict[str, Any]]] = {}  # key -> (status, body)
        self.bodies: dict[str, dict[str, Any]] = {}  # key -> the body sent
        self.inputs_acked: list[int] = []  # input numbers, in the order they were acked
        self.subscribers = [Subscriber() for _ in range(subscribers)]
        for subscriber in self.subscribers[:resuming]:
            subscriber.drop = asyncio.Event()
        self.outage_seen_at: float | None = None  # the first append answered 503
        self._stop = asyncio.Event()
        self._stop_inputs = asyncio.Event()
        self._follow_until: int | None = None
        self._followed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._followers: list[asyncio.Task[None]] = []
        self.http = httpx.AsyncClient(
            base_url=base_url,
            headers=headers,
            timeout=httpx.Timeout(30),
            limits=httpx.Limits(max_connections=writers + 16, max_keepalive_connections=32),
        )

    # -- running ----------------------------------------------------------------------

    async def start(self) -> None:
        created = await self.http.post(
            f"{API}/runs/{self.run_id}/streams",
            json={"stream_id": self.stream, "direction": "output"},
        )
        assert created.status_code == 201, created.text
        loop = asyncio.get_running_loop()
        self._followers = [loop.create_task(self._subscriber(s)) for s in self.subscribers]
        self._tasks = [loop.create_task(self._writer(w)) for w in range(self.writers)]
        self._tasks.append(loop.create_task(self._readyz()))
        if self.input_stream is not None:
            self._tasks.append(loop.create_task(self._inputs()))

    async def stop(self, timeout: float = 60.0) -> int:  # noqa: ASYNC109
        """Stop writing (each writer finishes its key), then wait until every subscriber
        has the stream's last record; returns that sequence."""
        self._stop.set()
        self._stop_inputs.set()
        await asyncio.gather(*self._tasks)
        latest = max((body["last_sequence"] for _, body in self.acked.values()), default=0)
        self._follow_until = latest
        self._followed.set()  # followers that have it already, waiting for more, are done
        done, pending = await asyncio.wait(self._followers, timeout=timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            task.result()
        return latest

    async def close(self) -> None:
        for task in [*self._tasks, *self._followers]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._followers, return_exceptions=True)
        await self.http.aclose()

    def stop_inputs(self) -> None:
        self._stop_inputs.set()

    async def _post(self, kind: str, path: str, **kwargs: Any) -> httpx.Response | None:
        started = time.monotonic()
        try:
            response = await self.http.post(path, **kwargs)
        except httpx.TransportError as exc:
            self.transport_errors[f"{kind}:{type(exc).__name__}"] += 1
            self.answers.append(Answer(kind, started, time.monotonic(), None))
            return None
        self.answers.append(Answer(kind, started, time.monotonic(), response.status_code))
        if response.status_code == 503 and kind == "append" and self.outage_seen_at is None:
            # The outage has begun: the resuming followers drop their responses now.
            self.outage_seen_at = time.monotonic()
            for subscriber in self.subscribers:
                if subscriber.drop is not None:
                    subscriber.drop.set()
        broken = contract_break(response)
        if broken is not None:
            self.broken.append(f"{kind}: {broken}")
        return response

    async def _append_until_acked(
        self, kind: str, stream: str, key: str, payload: Any
    ) -> tuple[int, dict[str, Any]]:
        body = {"records": [{"payload": payload}]}
        self.bodies[key] = body
        path = stream_path(self.run_id, stream) + "/records"
        while True:
            response = await self._post(kind, path, json=body, headers={"Idempotency-Key": key})
            if response is not None and response.status_code < 300:
                return response.status_code, response.json()
            if response is not None and response.status_code != 503:
                # Anything but the outage's answer is a failure of the test's own making
                # (or a contract break, already noted): stop this key.
                raise AssertionError(f"{kind} {key}: {response.status_code} {response.text}")
            await asyncio.sleep(self.retry_delay)

    async def _writer(self, w: int) -> None:
        n = 0
        while not self._stop.is_set():
            key = f"w{w}-{n}"
            self.acked[key] = await self._append_until_acked(
                "append", self.stream, key, {"w": w, "n": n}
            )
            n += 1
            await asyncio.sleep(self.pace)

    async def _inputs(self) -> None:
        assert self.input_stream is not None
        n = 0
        while not self._stop_inputs.is_set():
            began = time.monotonic()
            await self._append_until_acked("input", self.input_stream, f"in-{n}", {"n": n})
            self.inputs_acked.append(n)
            n += 1
            await asyncio.sleep(max(0.0, self.input_every - (time.monotonic() - began)))

    async def send_input(self, n: int) -> None:
        """One more input record (e.g. the workflow's stop marker), retried until acked."""
        assert self.input_stream is not None
        await self._append_until_acked("input", self.input_stream, f"in-{n}", {"n": n})

    async def _readyz(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                status: int | None = (await self.http.get("/readyz")).status_code
            except httpx.TransportError:
                status = None
            self.answers.append(Answer("readyz", started, time.monotonic(), status))
            await asyncio.sleep(0.05)

    async def _subscriber(self, got: Subscriber) -> None:
        path = stream_path(self.run_id, self.stream) + "/subscribe"
        async with httpx.AsyncClient(
            base_url=self.base_url, timeout=httpx.Timeout(30, read=60)
        ) as client:
            while self._follow_until is None or got.last < self._follow_until:
                headers = dict(self.headers)
                if got.records:
                    headers["Last-Event-ID"] = str(got.last)
                    if got.dropped_after is not None:
                        got.resumed_from.append(got.last)
                try:
                    async with aconnect_sse(client, "GET", path, headers=headers) as source:
                        if source.response.status_code != 200:
                            await source.response.aread()
                            got.refused[source.response.status_code] += 1
                            broken = contract_break(source.response)
                            if broken is not None:
                                self.broken.append(f"subscribe: {broken}")
                            await asyncio.sleep(self.retry_delay)
                            continue
                        got.responses += 1
                        if await self._read_events(source, got):
                            return
                except httpx.HTTPError as exc:
                    got.failures[type(exc).__name__] += 1
                await asyncio.sleep(self.retry_delay)

    async def _read_events(self, source: EventSource, got: Subscriber) -> bool:
        """Take one response's records until it ends (False) or the follower has the
        load's last record (True: also when it had it already as ``stop`` named it, for
        no event may come after it). A resuming follower leaves the response once the
        outage has begun (its connection closed on the way out): False."""

        async def read() -> bool:
            async for event in source.aiter_sse():
                if event.event == "record":
                    got.records.append(json.loads(event.data))
                if self._follow_until is not None and got.last >= self._follow_until:
                    return True
            return False

        reading = asyncio.ensure_future(read())
        try:
            while True:
                waits: list[asyncio.Future[Any]] = []
                if got.drop is not None and got.dropped_after is None:
                    waits.append(asyncio.ensure_future(got.drop.wait()))
                if not self._followed.is_set():
                    waits.append(asyncio.ensure_future(self._followed.wait()))
                try:
                    await asyncio.wait({reading, *waits}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for wait in waits:
                        wait.cancel()
                if reading.done():
                    return reading.result()
                if self._follow_until is not None and got.last >= self._follow_until:
                    return True
                if got.drop is not None and got.drop.is_set() and got.dropped_after is None:
                    got.dropped_after = got.last
                    return False
        finally:
            if not reading.done():
                reading.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reading

    # -- reading ----------------------------------------------------------------------

    async def read_all(self, stream: str | None = None) -> list[dict[str, Any]]:
        """Every record of the stream, paged from the start (once the load is over)."""
        records: list[dict[str, Any]] = []
        cursor = 0
        path = stream_path(self.run_id, stream or self.stream) + "/records"
        while True:
            response = await self.http.get(path, params={"cursor": cursor, "limit": 1000})
            assert response.status_code == 200, response.text
            page = response.json()
            records.extend(page["records"])
            if page["next_cursor"] >= page["latest_sequence"]:
                return records
            cursor = page["next_cursor"]

    async def replays(self) -> list[str]:
        """Every acked key appended again with its body: the differences from the
        answer it got first (none when each replays the same answer)."""
        path = stream_path(self.run_id, self.stream) + "/records"
        differences: list[str] = []
        gate = asyncio.Semaphore(8)

        async def replay(key: str, first: dict[str, Any]) -> None:
            async with gate:
                response = await self.http.post(
                    path, json=self.bodies[key], headers={"Idempotency-Key": key}
                )
            replayed = response.headers.get("idempotent-replayed")
            if response.status_code != 200 or replayed != "true" or response.json() != first:
                differences.append(f"{key}: {response.status_code} {replayed} {response.text}")

        await asyncio.gather(*(replay(k, body) for k, (_, body) in self.acked.items()))
        return differences

    def appends(self) -> list[Answer]:
        return [a for a in self.answers if a.kind == "append"]

    def readyz(self) -> list[Answer]:
        return [a for a in self.answers if a.kind == "readyz"]

    def figures(self, fault_at: float, writable_at: float) -> FaultFigures:
        """The gap in 2xx appends that holds the fault (the longest one from a second
        before the fault on)."""
        ok = sorted(a.ended for a in self.appends() if a.status is not None and a.status < 300)
        around = [t for t in ok if t >= fault_at - 1.0]
        before = [t for t in ok if t < fault_at - 1.0]
        points = ([before[-1]] if before else []) + around
        assert len(points) >= 2, "no appends answered around the fault"
        gaps = [(b - a, a, b) for a, b in itertools.pairwise(points)]
        _, last_before, first_after = max(gaps)
        return FaultFigures(fault_at, writable_at, last_before, first_after)
