"""Benchmark: records streamed from inside activities (``plugin.streaming.stream_writer``)
to SSE, beside the same load through the workflow's ``append`` helper and over HTTP,
all in one run.

    python -m bench.activity_streams [--streams 100] [--rate 50] [--seconds 10]
                                     [--single-tokens 30000] [--single-http-seconds 5]
                                     [--single-workflow-tokens 200] [--json out.json]

Everything is real: Postgres (a fresh database on $DUCTOR_STREAMS_BENCH_DATABASE_URL, else
$DUCTOR_STREAMS_TEST_DATABASE_URL, else an embedded one), a Temporal dev server, one
``ductor-streams serve --no-workers`` subprocess, one worker process
(``bench.activity_streams_worker``: the workflows and activities, with the StreamsPlugin,
on uvloop as docs/temporal.md advises, or on asyncio's own loop with ``--worker-loop
asyncio``) and the SSE followers in a process of their own (``bench.sse_followers``).
Each record's payload carries the wall time at which it was made (``t``); its latency
is the follower's receive time minus ``t`` (one host clock).

1. ``single``: one producer as fast as it can, one follower.
   - ``activity``: one activity writes ``--single-tokens`` single-token records with
     ``stream_writer`` (default settings); records/s = tokens / (first write -> flush).
   - ``workflow_append``: a workflow appends ``--single-workflow-tokens`` records, one
     ``append`` helper call (one activity) each; ``t`` is ``workflow.now()``.
   - ``http``: one keep-alive connection POSTs one-record appends back to back for
     ``--single-http-seconds``.
2. ``concurrent``: ``--streams`` streams each getting ``--rate`` records/s for
   ``--seconds``, one follower per stream.
   - ``floor`` (before ``activity``; ``--no-floor`` skips it): the same tokens, durable
     commits and followers with no product code in between (bench/token_floor.py: a
     producer process group-committing inserts with their NOTIFY, and a bare SSE
     server writing each notified record to its subscriber); its ``server`` and
     ``worker`` columns are that server and that producer.
   - ``sql_floor`` (after ``floor``, skipped with it): the same two bare processes with
     the product's Postgres side between them, in a database of its own (the appender's
     statement with keys, credit and counters; the product's wakes): ``sql_floor`` over
     ``floor`` is what the product's SQL costs the load, ``activity`` over ``sql_floor``
     what its processes cost it (bench/token_floor.py, ``--sql``).
   - ``activity``: one activity per stream writes them with ``stream_writer`` as it
     makes them.
   - ``answer``: one activity per stream makes them at the same pace and returns them
     all; the workflow then appends them with ``append_many`` (what activities had to
     do before ``stream_writer``: the UI sees nothing until the answer is complete).
   - ``http``: one raw keep-alive connection per stream POSTs each record as it is made.
   Server and worker CPU: user+system time of the process over the load (/proc), as
   cores (CPU seconds per wall second) and microseconds per record (for ``activity``
   also per append request: a writer's batch, counted by its receipts, since the batch
   size moves with the latency); also the followers'
   process, the Postgres backends serving the bench's database (``postgres``; not the
   shared WAL writer and checkpointer) and the whole machine (``machine``: busy cores
   of all, from /proc/stat, whoever used them: Postgres, Temporal, the load's own
   clients, anyone else).

``--hops`` adds, for the concurrent activity load, each hop's p50/p99 from timestamps
taken inside the worker and the server (bench/hops.py); ``--only`` picks parts and
``--repeat`` runs each concurrent load several times (the median run is shown).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from bench.activity_streams_worker import LOOP_ENV as WORKER_LOOP_ENV
from bench.activity_streams_workflows import (
    TASK_QUEUE,
    BenchTokensWorkflow,
    TokensReport,
    TokensRequest,
)
from bench.environment import (
    HTTP_LIMITS,
    bench_token,
    host_loop_ms,
    isolated_database,
    postgres_server,
    process_cpu_seconds,
)
from bench.hops import ENV as HOPS_ENV
from bench.hops import LOAD_STREAMS, hop_table, print_hops
from bench.pg_cpu import backends_of
from ductor_streams.config import Settings
from ductor_streams.schema.migrate import migrate
from tests.support import token_floor
from tests.support.server import ServerProcess, settings_env

API = "/api/workflow-streams"


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"n": len(ordered), "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": pick(1.0)}


class Bench:
    def __init__(
        self,
        server: ServerProcess,
        token: str,
        client: Client,
        worker_pid: int,
        hops_dir: Path | None = None,
        floor_dsn: str | None = None,
    ) -> None:
        self.server = server
        self.floor_dsn = floor_dsn  # the sql floor's database
        self.hops_dir = hops_dir
        self.last_results: list[dict[str, Any]] = []
        self.server_pool: asyncpg.Pool | None = None  # the bench's own queries
        self.token = token
        self.client = client
        self.worker_pid = worker_pid
        self.http = httpx.AsyncClient(
            base_url=server.url,
            headers={"Authorization": f"Bearer {token}"},
            limits=HTTP_LIMITS,
            timeout=60,
        )

    async def create_streams(self, run_ids: list[str]) -> None:
        """The streams the workflows create too (same definition: their create finds them),
        made first so that the followers are connected before the first record."""
        limit = asyncio.Semaphore(16)

        async def one(run_id: str) -> None:
            async with limit:
                answer = await self.http.post(
                    f"{API}/runs/{run_id}/streams",
                    json={
                        "stream_id": "output",
                        "direction": "output",
                        "content_class": "model_output",
                    },
                )
                assert answer.status_code in (200, 201), answer.text

        await asyncio.gather(*(one(r) for r in run_ids))

    def paths(self, run_ids: list[str]) -> list[str]:
        return [f"{API}/runs/{r}/streams/output/subscribe" for r in run_ids]

    async def follow(
        self, run_ids: list[str], *, paths: list[str] | None = None, port: int | None = None
    ) -> subprocess.Popen[str]:
        """The followers of the run IDs' output streams (or of ``paths`` on ``port``)."""
        config = {
            "host": "127.0.0.1",
            "port": port or self.server.port,
            "token": self.token,
            "paths": paths or self.paths(run_ids),
        }
        process = start_followers(config)
        assert process.stdout is not None
        line = await asyncio.to_thread(process.stdout.readline)
        assert line.strip() == "ready", line
        return process

    async def collected(
        self, followers: subprocess.Popen[str], expected: int
    ) -> tuple[list[float], dict[str, Any]]:
        """Stop the followers (after the last records had a moment to arrive)."""
        await asyncio.sleep(1.0)
        assert followers.stdin is not None and followers.stdout is not None
        followers.stdin.write("stop\n")
        followers.stdin.flush()
        line = await asyncio.to_thread(followers.stdout.readline)
        followers.wait(10)
        results = json.loads(line)
        self.last_results = results
        latencies = [v for r in results for v in r["latencies"]]
        in_store = [v for r in results for v in r["in_store"]]
        in_order = sum(r["sequences"] == list(range(1, len(r["sequences"]) + 1)) for r in results)
        check = {
            "received": len(latencies),
            "expected": expected,
            "streams_in_order_without_repeats": in_order,
            # made -> the appending transaction began (the rest is commit -> SSE)
            "made_to_transaction": percentiles(in_store),
        }
        return latencies, check

    async def start_floor(
        self, run_ids: list[str], tokens: int, rate: float, offsets: list[float], sql: bool
    ) -> tuple[subprocess.Popen[str], list[subprocess.Popen[str]], float, Any]:
        """bench/token_floor.py's server, followers of its streams and its producer:
        (followers, [server, producer], the load's start, the load to await). ``sql``:
        its ``--sql`` form, in ``floor_dsn``."""
        stream_pks: list[int] | None = None
        if sql:
            dsn = self.floor_dsn or ""
            stream_pks = await token_floor.setup_sql(dsn, len(run_ids))
            paths = [token_floor.path(pk) for pk in stream_pks]
        else:
            dsn = self.server.settings.database_url or ""
            await token_floor.setup(dsn)
            paths = [token_floor.path(i + 1) for i in range(len(run_ids))]
        server, port = await asyncio.to_thread(token_floor.start_server, dsn, sql)
        followers = await self.follow(run_ids, paths=paths, port=port)
        start_at = time.time() + 1.0
        producer = token_floor.start_producer(dsn, tokens, rate, start_at, offsets, stream_pks)
        load = asyncio.to_thread(token_floor.wait_produced, producer)
        return followers, [server, producer], start_at, load

    def postgres_cpu(self, dsn: str | None = None) -> dict[int, float]:
        """CPU seconds so far of each Postgres backend serving the bench's database (or
        ``dsn``'s)."""
        database = urlsplit(dsn or self.server.settings.database_url or "").path.lstrip("/")
        return backends_of(database) if database else {}

    async def start_workflows(
        self,
        mode: str,
        run_ids: list[str],
        tokens: int,
        rate: float,
        lead: float,
        spread: bool = False,
    ) -> tuple[list[Any], float]:
        """Start the workflows; their first tokens are made ``lead`` seconds from now
        (the wall time returned), once every workflow has started: a sandboxed
        workflow's first task costs the worker tens of milliseconds of CPU (holding the
        GIL), which must not land on the measured tokens. ``spread``: the workflows'
        tokens are made at phases spread evenly over one period (``phase_offsets``)."""
        start_at = time.time() + lead
        offsets = phase_offsets(len(run_ids), rate, spread)
        handles = [
            await self.client.start_workflow(
                BenchTokensWorkflow.run,
                TokensRequest(mode, tokens, rate, start_at + offset),
                id=run_id,
                task_queue=TASK_QUEUE,
            )
            for run_id, offset in zip(run_ids, offsets, strict=True)
        ]
        return handles, start_at

    async def workflows(self, mode: str, run_ids: list[str], tokens: int, rate: float) -> list[Any]:
        handles, _ = await self.start_workflows(mode, run_ids, tokens, rate, lead=1.0)
        return list(await asyncio.gather(*(h.result() for h in handles)))

    async def hops(self, run_ids: list[str]) -> dict[str, Any]:
        """Each hop's p50/p99 for the records of these runs (bench/hops.py)."""
        assert self.hops_dir is not None
        for path in self.hops_dir.glob("*.json"):
            path.unlink()
        pids = [self.worker_pid, self.server.process.pid]  # type: ignore[union-attr]
        for pid in pids:
            os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while len(list(self.hops_dir.glob("*.json"))) < len(pids):
            if time.monotonic() > deadline:
                raise TimeoutError("the worker or the server wrote no hop notes")
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)  # let the larger file be written whole
        pks = dict(
            await self.server_pool.fetch(  # type: ignore[union-attr]
                "SELECT run_id, stream_pk FROM workflow_streams.streams"
                " WHERE run_id = ANY($1) AND stream_id = 'output'",
                run_ids,
            )
        )
        received: dict[int, dict[int, float]] = {}
        for run_id, result in zip(run_ids, self.last_results, strict=True):
            received[pks[run_id]] = dict(zip(result["sequences"], result["received"], strict=True))
        table = hop_table(self.hops_dir, received, set(pks.values()))
        # For `python -m bench.hops statements`: which streams were this load's.
        (self.hops_dir / LOAD_STREAMS).write_text(json.dumps(sorted(pks.values())))
        table["notes"] = str(self.hops_dir)
        return table

    async def busiest_backends(
        self, before: dict[int, float], after: dict[int, float], elapsed: float
    ) -> list[tuple[float, str]]:
        """The four busiest backends of the bench's database over a load: cores, and the
        start of the statement each ran last (a pooled connection may have run others
        before it: the appender's statements move between two of them)."""
        used = sorted(
            ((cpu - before.get(pid, 0.0), pid) for pid, cpu in after.items()), reverse=True
        )[:4]
        assert self.server_pool is not None
        last = dict(
            await self.server_pool.fetch(
                "SELECT pid, left(regexp_replace(query, '\\s+', ' ', 'g'), 40)"
                " FROM pg_stat_activity WHERE pid = ANY($1)",
                [pid for _, pid in used],
            )
        )
        return [(round(cpu / elapsed, 3), last.get(pid, "?")) for cpu, pid in used if cpu > 0]

    async def batches(self, run_ids: list[str]) -> int:
        """The append requests (batches) the writers of these runs made: their receipts."""
        assert self.server_pool is not None
        return int(
            await self.server_pool.fetchval(
                "SELECT count(*) FROM workflow_streams.append_receipts a"
                "  JOIN workflow_streams.streams s USING (stream_pk)"
                " WHERE s.run_id = ANY($1) AND s.stream_id = 'output'",
                run_ids,
            )
        )

    # -- single ------------------------------------------------------------------------

    async def single_activity(self, tokens: int) -> dict[str, Any]:
        run_id = f"one-act-{uuid.uuid4().hex[:8]}"
        await self.create_streams([run_id])
        followers = await self.follow([run_id])
        (report,) = await self.workflows("activity", [run_id], tokens, 0.0)
        latencies, check = await self.collected(followers, tokens)
        assert isinstance(report, TokensReport)
        return {
            "records_per_s": round(report.records / report.seconds),
            "token_to_sse": percentiles(latencies),
            **check,
        }

    async def single_workflow(self, tokens: int) -> dict[str, Any]:
        run_id = f"one-wf-{uuid.uuid4().hex[:8]}"
        await self.create_streams([run_id])
        followers = await self.follow([run_id])
        (report,) = await self.workflows("each", [run_id], tokens, 0.0)
        latencies, check = await self.collected(followers, tokens)
        return {
            "records_per_s": round(report.records / report.seconds, 1),
            "token_to_sse": percentiles(latencies),
            **check,
        }

    async def single_http(self, seconds: float) -> dict[str, Any]:
        run_id = f"one-http-{uuid.uuid4().hex[:8]}"
        await self.create_streams([run_id])
        followers = await self.follow([run_id])
        connection = await RawAppender.open(self.server, self.token, run_id)
        count = 0
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            await connection.append(count)
            count += 1
        elapsed = time.monotonic() - started
        connection.close()
        latencies, check = await self.collected(followers, count)
        return {
            "records_per_s": round(count / elapsed),
            "token_to_sse": percentiles(latencies),
            **check,
        }

    # -- concurrent ----------------------------------------------------------------------

    async def concurrent(
        self, mode: str, streams: int, rate: float, seconds: float, spread: bool = False
    ) -> Any:
        host_before = host_loop_ms()
        run_ids = [f"{mode}-{uuid.uuid4().hex[:8]}" for _ in range(streams)]
        tokens = int(rate * seconds)
        # The processes whose CPU the ``server`` and ``worker`` columns show.
        server_pid, worker_pid = self.server.process.pid, self.worker_pid  # type: ignore[union-attr]
        floor: list[subprocess.Popen[str]] = []  # the floor's server and producer
        database = self.floor_dsn if mode == "sql_floor" else None  # whose backends
        if mode in ("floor", "sql_floor"):
            followers, floor, start_at, load = await self.start_floor(
                run_ids, tokens, rate, phase_offsets(streams, rate, spread), mode == "sql_floor"
            )
            server_pid, worker_pid = (process.pid for process in floor)
        else:
            await self.create_streams(run_ids)
            followers = await self.follow(run_ids)
            if mode == "http":
                connections = [await RawAppender.open(self.server, self.token, r) for r in run_ids]
                start_at = time.time() + 0.5
                offsets = phase_offsets(streams, rate, spread)

                async def write_load(connection: RawAppender, offset: float) -> None:
                    for i in range(tokens):
                        wait = start_at + offset + i / rate - time.time()
                        if wait > 0:
                            await asyncio.sleep(wait)
                        await connection.append(i)

                load = asyncio.gather(
                    *(write_load(c, o) for c, o in zip(connections, offsets, strict=True))
                )
            else:
                handles, start_at = await self.start_workflows(
                    mode, run_ids, tokens, rate, lead=2.0 + 0.05 * streams, spread=spread
                )
                load = asyncio.gather(*(h.result() for h in handles))
        await asyncio.sleep(max(0.0, start_at - time.time()))
        server0, worker0 = process_cpu_seconds(server_pid), process_cpu_seconds(worker_pid)
        followers0, machine0 = process_cpu_seconds(followers.pid), machine_busy_seconds()
        postgres0 = self.postgres_cpu(database)
        started = time.monotonic()
        during: list[float] = []
        probes = asyncio.get_running_loop().create_task(host_probes(during))
        await load
        probes.cancel()
        if mode == "http":
            for connection in connections:
                connection.close()
        elapsed = time.monotonic() - started
        server1, worker1 = process_cpu_seconds(server_pid), process_cpu_seconds(worker_pid)
        followers1, machine1 = process_cpu_seconds(followers.pid), machine_busy_seconds()
        postgres1 = self.postgres_cpu(database)
        postgres = sum(cpu - postgres0.get(pid, 0.0) for pid, cpu in postgres1.items())
        latencies, check = await self.collected(followers, tokens * streams)
        for process in floor:
            token_floor.stop(process)
        check["host_loop_ms"] = [host_before, host_loop_ms()]
        during.sort()
        check["host_loop_ms_during"] = (
            [during[len(during) // 2], during[-1]] if during else [None, None]
        )
        records = tokens * streams
        if mode == "activity":
            # Each of a writer's batches is one append request with its own key, so
            # its receipts count them: CPU per record moves with the batch size, which
            # moves with the latency (a starved machine makes larger batches).
            batches = await self.batches(run_ids)
            check["append_requests"] = batches
            check["records_per_request"] = round(records / batches, 2) if batches else None
            for side, used in (
                ("server", server1 - server0),
                ("worker", worker1 - worker0),
                ("postgres", postgres),
            ):
                check[f"{side}_us_per_request"] = (
                    round(used / batches * 1e6, 1) if batches else None
                )
        if self.hops_dir is not None and mode == "activity":
            check["hops"] = await self.hops(run_ids)
        return {
            "delivery": percentiles(latencies),
            "server_cores": round((server1 - server0) / elapsed, 3),
            "server_us_per_record": round((server1 - server0) / records * 1e6, 1),
            "worker_cores": round((worker1 - worker0) / elapsed, 3),
            "worker_us_per_record": round((worker1 - worker0) / records * 1e6, 1),
            "followers_cores": round((followers1 - followers0) / elapsed, 3),
            # The backends connected to the bench's database (bench/pg_cpu.py), when this
            # user can read their /proc entries.
            "postgres_cores": round(postgres / elapsed, 3),
            # Each backend's share, busiest first, with what it ran last.
            "postgres_backend_cores": await self.busiest_backends(postgres0, postgres1, elapsed),
            "postgres_us_per_record": round(postgres / records * 1e6, 1),
            "machine_busy_cores": round((machine1 - machine0) / elapsed, 2),
            "wall_s": round(elapsed, 2),
            **check,
        }


# A probe every HOST_PROBE_SECONDS during a load: ``host_loop_ms`` of a tenth of the
# steps (about 4 ms of one core on a quick host), times 10 to compare with the idle ones.
HOST_PROBE_SECONDS = 0.5


async def host_probes(into: list[float]) -> None:
    """Time the host's loop every HOST_PROBE_SECONDS while a load runs: the bench's own
    process is nearly idle then, so the loop's time is the speed a thread gets on the
    busy machine (CPU contention included), against the idle figure before and after."""
    while True:
        await asyncio.sleep(HOST_PROBE_SECONDS)
        into.append(round(host_loop_ms(100_000) * 10, 1))


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine spent not idle so far (/proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class RawAppender:
    """One keep-alive connection POSTing one-record appends ``{"i": n, "t": now}``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: str):
        self.reader = reader
        self.writer = writer
        self.head = head

    @classmethod
    async def open(cls, server: ServerProcess, token: str, run_id: str) -> RawAppender:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        head = (
            f"POST {API}/runs/{run_id}/streams/output/records HTTP/1.1\r\nHost: bench\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        )
        return cls(reader, writer, head)

    async def append(self, i: int) -> None:
        body = f'{{"records":[{{"payload":{{"i":{i},"t":{time.time()!r}}}}}]}}'.encode()
        self.writer.write(f"{self.head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = head[9:12]
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        await self.reader.readexactly(length)
        if status != b"201":
            raise RuntimeError(f"append answered {head!r}")

    def close(self) -> None:
        self.writer.close()


def start_followers(config: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.sse_followers", json.dumps(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run whose delivery p50 is the median of the runs'."""
    ordered = sorted(runs, key=lambda r: r["delivery"].get("p50_ms", 0.0))
    return dict(ordered[len(ordered) // 2])


def start_worker(
    settings: Settings, log_path: Path, extra_env: dict[str, str]
) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "bench.activity_streams_worker"],
            env={**os.environ, **settings_env(settings), **extra_env},
            stdout=log,
            stderr=log,
        )


def phase_offsets(streams: int, rate: float, spread: bool) -> list[float]:
    """Each stream's delay of its first token: 0 for all (``aligned``: every stream makes
    a token at the same instant, a burst of ``streams`` records each period), or evenly
    spread over one period of ``rate`` (``spread``: independent producers, such as model
    calls that did not start together, keep no common phase)."""
    if not spread or not rate:
        return [0.0] * streams
    return [i / streams / rate for i in range(streams)]


# The concurrent loads, in the order they run: the floors just before the activity load
# they are the floors of.
CONCURRENT_MODES = ("floor", "sql_floor", "activity", "answer", "http")


async def _run(args: argparse.Namespace, dsn: str, floor_dsn: str, workdir: Path) -> dict[str, Any]:
    await migrate(dsn)
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.executable).with_name("temporal")),
        dev_server_log_level="error",
    )
    secret = secrets.token_urlsafe(32)
    settings = Settings(
        database_url=dsn,
        jwt_secret=secret,
        region="local",
        tenant="bench",
        temporal_address=env.client.service_client.config.target_host,
    )
    hops_dir = workdir / "hops" if args.hops else None
    extra_env: dict[str, str] = {WORKER_LOOP_ENV: args.worker_loop}
    if hops_dir is not None:
        hops_dir.mkdir()
        extra_env[HOPS_ENV] = str(hops_dir)
    worker = start_worker(settings, workdir / "worker.log", extra_env)
    server_process = ServerProcess(
        settings,
        log_path=workdir / "serve.log",
        extra_env=extra_env,
        module="bench.hops" if hops_dir is not None else "ductor_streams.process.cli",
    )
    try:
        with server_process as server:
            while "polling" not in (workdir / "worker.log").read_text(errors="replace"):
                if worker.poll() is not None:
                    raise RuntimeError(f"the worker exited: see {workdir / 'worker.log'}")
                await asyncio.sleep(0.1)
            bench = Bench(server, bench_token(secret), env.client, worker.pid, hops_dir, floor_dsn)
            bench.server_pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
            only = set(args.only.split(",")) if args.only else None

            def wanted(name: str) -> bool:
                return only is None or name in only

            result: dict[str, Any] = {"single": {}, "concurrent": {}}
            if wanted("single-activity"):
                result["single"]["activity"] = await bench.single_activity(args.single_tokens)
            if wanted("single-workflow"):
                result["single"]["workflow_append"] = await bench.single_workflow(
                    args.single_workflow_tokens
                )
            if wanted("single-http"):
                result["single"]["http"] = await bench.single_http(args.single_http_seconds)

            def measured(mode: str) -> bool:
                if mode in ("floor", "sql_floor"):  # they come with the activity load
                    return args.floor and (wanted(mode) or wanted("floor") or wanted("activity"))
                return wanted(mode)

            for mode in CONCURRENT_MODES:
                for _ in range(args.repeat):
                    if measured(mode):
                        row = await bench.concurrent(
                            mode, args.streams, args.rate, args.seconds, args.phases == "spread"
                        )
                        result["concurrent"].setdefault(mode, row)
                        result["concurrent"].setdefault(f"{mode}_runs", []).append(row)
            for mode in CONCURRENT_MODES:
                runs = result["concurrent"].pop(f"{mode}_runs", [])
                if len(runs) > 1:
                    result["concurrent"][mode] = median_run(runs)
                    result["concurrent"][mode]["runs"] = [
                        {
                            k: r[k]
                            for k in ("delivery", "server_cores", "worker_cores", "postgres_cores")
                        }
                        for r in runs
                    ]
            await bench.server_pool.close()  # type: ignore[union-attr]
            await bench.http.aclose()
            return result
    finally:
        worker.kill()
        worker.wait(10)
        await env.shutdown()


def print_tables(result: dict[str, Any], args: argparse.Namespace) -> None:
    single = result["single"]
    print("\none producer as fast as it can, one SSE follower")
    print(f"{'path':<18}{'records/s':>12}{'p50 ms':>10}{'p99 ms':>10}{'received':>10}")
    for path, row in single.items():
        lat = row["token_to_sse"]
        print(
            f"{path:<18}{row['records_per_s']:>12}{lat.get('p50_ms', '-'):>10}"
            f"{lat.get('p99_ms', '-'):>10}{row['received']:>10}"
        )
    if "http" in single and "activity" in single:
        base = single["http"]["records_per_s"]
        print(f"activity / http records/s: {single['activity']['records_per_s'] / base:.2f}")
    print(
        f"\n{args.streams} streams x {args.rate:g} records/s ({args.phases}, worker on"
        f" {args.worker_loop}) for"
        f" {args.seconds:g} s, one SSE follower each"
    )
    print(
        f"{'path':<10}{'p50 ms':>10}{'p99 ms':>10}{'server cores':>14}{'us/rec':>8}"
        f"{'worker cores':>14}{'us/rec':>8}{'pg cores':>10}{'us/rec':>8}{'machine':>9}"
        f"{'received':>10}{'in order':>10}"
    )
    for path, row in result["concurrent"].items():
        lat = row["delivery"]
        print(
            f"{path:<10}{lat.get('p50_ms', '-'):>10}{lat.get('p99_ms', '-'):>10}"
            f"{row['server_cores']:>14}{row['server_us_per_record']:>8}"
            f"{row['worker_cores']:>14}{row['worker_us_per_record']:>8}"
            f"{row['postgres_cores']:>10}{row['postgres_us_per_record']:>8}"
            f"{row['machine_busy_cores']:>9}{row['received']:>10}{row['streams_in_order_without_repeats']:>10}"
        )
    for path, row in result["concurrent"].items():
        backends = "; ".join(f"{cores} ({query})" for cores, query in row["postgres_backend_cores"])
        print(
            f"{path}: followers {row['followers_cores']} cores; Postgres backends,"
            f" busiest first: {backends or '-'}"
        )
    for path, row in result["concurrent"].items():
        before, after = row["host_loop_ms"]
        median, slowest = row["host_loop_ms_during"]
        print(
            f"{path}: a 1,000,000-step Python loop took {before} ms before the load, {median}"
            f" (median; slowest {slowest}) during it and {after} after (bench/environment.py,"
            " host_loop_ms: a thread's speed on this host at that moment)"
        )
    concurrent = result["concurrent"]
    for upper, lower in (("activity", "floor"), ("sql_floor", "floor"), ("activity", "sql_floor")):
        if upper in concurrent and lower in concurrent:
            print(
                f"{upper} / {lower}: "
                + ", ".join(latency_ratios(concurrent[upper], concurrent[lower]))
            )
    if "floor" in concurrent:
        print(
            "(floor: the same tokens, commits and followers with no product code in between;"
            " sql_floor: the same with the product's SQL and wakes; bench/token_floor.py."
            " Their server and worker columns are their SSE server and their producer.)"
        )
    activity = concurrent.get("activity")
    if activity and activity.get("append_requests"):
        print(
            f"activity: {activity['append_requests']} append requests,"
            f" {activity['records_per_request']} records each; CPU per request: server"
            f" {activity['server_us_per_request']} us, worker {activity['worker_us_per_request']}"
            f" us, Postgres {activity['postgres_us_per_request']} us"
        )
    hops = result["concurrent"].get("activity", {}).get("hops")
    if hops:
        print(f"\nwhere an activity's record's time goes ({args.streams} streams, bench/hops.py)")
        print_hops(hops)
        print(
            f"the notes are kept in {hops['notes']}: `python -m bench.hops statements"
            f" {hops['notes']} [FROM_MS TO_MS]` lists the append statements"
        )


def latency_ratios(upper: dict[str, Any], lower: dict[str, Any]) -> list[str]:
    """``p50 <ratio>``, ``p99 <ratio>`` of two concurrent rows' delivery latencies."""
    return [
        f"{key[:3]} {upper['delivery'][key] / lower['delivery'][key]:.2f}"
        for key in ("p50_ms", "p99_ms")
        if upper["delivery"].get(key) and lower["delivery"].get(key)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.activity_streams", description=__doc__)
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--single-tokens", type=int, default=30_000)
    parser.add_argument("--single-workflow-tokens", type=int, default=200)
    parser.add_argument("--single-http-seconds", type=float, default=5.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--hops",
        action="store_true",
        help="note timestamps in the worker and the server and print where a record's "
        "time goes at the concurrent activity load (bench/hops.py)",
    )
    parser.add_argument(
        "--only",
        help="comma-separated parts to run: single-activity, single-workflow, single-http, "
        "floor, sql_floor, activity, answer, http (the concurrent loads; floor also "
        "runs sql_floor, and both come with activity); default all",
    )
    parser.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="skip the floors (bench/token_floor.py, bare and --sql) that run before the "
        "activity load",
    )
    parser.add_argument(
        "--phases",
        choices=("aligned", "spread"),
        default="aligned",
        help="the concurrent loads' token times: every stream at the same instant "
        "(aligned, a burst each period: the worst case) or spread evenly over one period",
    )
    parser.add_argument(
        "--worker-loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="the Temporal worker's event loop: uvloop (as docs/temporal.md advises) or "
        "asyncio's own",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs of each concurrent load (median shown)"
    )
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-activity-streams-"))
    with (
        postgres_server() as server_dsn,
        isolated_database(server_dsn) as dsn,
        isolated_database(server_dsn) as floor_dsn,
    ):
        result = asyncio.run(_run(args, dsn, floor_dsn, workdir))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    print_tables(result, args)
    sys.stdout.flush()
    # temporalio's core may crash the interpreter at exit (sdk-python#300): keep rc 0.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
