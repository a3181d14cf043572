"""Failover of a real HA Postgres (pg_auto_failover: a monitor, a primary and its
synchronous standby on loopback; tests/support/pg_cluster.py) under load, with
``DUCTOR_STREAMS_DATABASE_URL`` the multi-host URI ``pg_autoctl show uri`` prints
(``postgresql://h1:p1,h2:p2/db?target_session_attrs=read-write``).

Every process takes that URI: ``migrate`` (the CLI), ``serve --no-workers``, a
``workers`` process (the dispatcher), the Temporal worker's plugin (this process), and
after the switchover ``prune`` and ``outbox``. The load (tests/support/failover_load.py):
4 writers appending with ``Idempotency-Key``s, retrying 503 and dropped connections; 20
SSE subscribers following with ``Last-Event-ID``, 10 of which drop their response once
the outage has begun and resume with ``Last-Event-ID`` through it; an input record
every 100 ms to a running workflow; ``/readyz`` every 50 ms; each node probed straight
every 20 ms.

Two faults, in this order, on one cluster: a planned switchover (``pg_autoctl perform
switchover``), then an unplanned failover (the primary's keeper stopped, its postmaster
SIGKILLed: the monitor promotes the standby). Required of each:

- no 500 and no 5xx other than 503 ``database_unavailable`` with ``Retry-After``,
  including while no host takes writes (asyncpg's ``TargetServerAttributeNotMatched``);
- every append answered 2xx is stored exactly once, at the sequence it was given, and
  its key replays the same answer;
- every subscriber received every record exactly once, in order, with the content a
  final read gives (no sequence ever served with two contents), the 10 that dropped
  their response in the gap included, across their resume;
- every input record reached the workflow exactly once, in order;
- ``/readyz`` answered 503 while no node took writes and never 200 then, and 200 after;
- ``serve`` and ``workers`` lived through it; writes answered 2xx again within 5 s of
  the new primary taking a write (bench/failover.py measures it; bounded loosely here);
- ``serve`` counted the promotion in ``ductor_streams_database_identity_changes_total``
  (the promoted standby has the cluster's system identifier and a new timeline).

Between the two, a provider's failover endpoint (``test_a_failover_endpoint_that_moves``):
a second ``serve`` whose ``DUCTOR_STREAMS_DATABASE_URL`` names one address, a TCP proxy
in front of the primary (tests/support/tcp_proxy.py), through another switchover; the
proxy keeps sending connections to the old primary (now a standby) until the test moves
it to the new one and resets every connection it had, as a DNS name or virtual IP moves.

``pytest -s`` prints each fault's figures.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from litestar.testing import AsyncTestClient
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from ductor_streams.auth import SCOPES, issue_token
from ductor_streams.config import Settings
from ductor_streams.http import create_app
from ductor_streams.plugin import StreamsPlugin
from tests.conftest import JWT_SECRET
from tests.production.ha_workflows import Followed, FollowInputWorkflow
from tests.support.failover_load import API, FailoverLoad, WritableProbe, stream_path
from tests.support.live import eventually
from tests.support.pg_cluster import DATABASE, AutoFailoverCluster
from tests.support.server import ServerProcess, settings_env
from tests.support.tcp_proxy import TcpProxy
from tests.temporal.conftest import TEMPORAL_BIN, strict_runner
from tests.temporal.support import WorkersProcess

TENANT = "t-ha"
TASK_QUEUE = "ha-failover"
# The product's bound: writes answer 2xx again within this long of the moment the new
# primary takes writes (bench/failover.py measures it; asserted loosely here).
WRITES_AGAIN_SECONDS = 5.0
# A readiness answer within this long of a probe's change may be about either side.
PROBE_MARGIN_SECONDS = 0.1
# Of the 20 subscribers, how many drop their response in the outage and resume.
RESUMING = 10
IDENTITY_CHANGES = "ductor_streams_database_identity_changes_total"

pytestmark = pytest.mark.timeout(300)


@dataclass
class HA:
    cluster: AutoFailoverCluster
    dsn: str
    settings: Settings
    server: ServerProcess
    workers: WorkersProcess
    client: Client
    headers: dict[str, str]
    folder: Path


def _cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DUCTOR_STREAMS_DATABASE_URL": dsn}
    return subprocess.run(
        [sys.executable, "-m", "ductor_streams.process.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
async def ha(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[HA]:
    cluster = AutoFailoverCluster()
    temporal: WorkflowEnvironment | None = None
    server: ServerProcess | None = None
    workers: WorkersProcess | None = None
    try:
        start = asyncio.create_task(asyncio.to_thread(cluster.start))
        temporal = await WorkflowEnvironment.start_local(
            dev_server_existing_path=str(TEMPORAL_BIN),
            dev_server_database_filename=None,
            dev_server_log_level="error",
        )
        await start
        dsn = cluster.dsn()
        migrated = _cli(dsn, "migrate")
        assert migrated.returncode == 0, migrated.stderr
        folder = tmp_path_factory.mktemp("ha")
        address = temporal.client.service_client.config.target_host
        settings = Settings(
            database_url=dsn,
            jwt_secret=JWT_SECRET,
            region="local",
            tenant=TENANT,
            object_stores={"local": (folder / "objects").as_uri()},
            temporal_address=address,
        )
        server = ServerProcess(settings, log_path=folder / "serve.log").start()
        workers = WorkersProcess(settings_env(settings), folder / "workers.log").start()
        await workers.started()
        client = await Client.connect(address, plugins=[StreamsPlugin(settings, tune_gc=False)])
        token = issue_token(
            JWT_SECRET, sub="ha", tenant=TENANT, scopes=list(SCOPES), runs=["*"], ttl_seconds=3600
        )
        worker = Worker(
            client,
            task_queue=TASK_QUEUE,
            workflows=[FollowInputWorkflow],
            workflow_runner=strict_runner(),
        )
        async with worker:
            yield HA(
                cluster, dsn, settings, server, workers, client,
                {"Authorization": f"Bearer {token}"}, folder,
            )  # fmt: skip
    finally:
        if workers is not None:
            workers.stop()
        if server is not None:
            server.stop()
        if temporal is not None:
            await temporal.shutdown()
        await asyncio.to_thread(cluster.destroy)


async def test_the_cluster_has_a_synchronous_standby(ha: HA) -> None:
    # What docs/deploy.md ("Failover and lost commits") says of this cluster: with one
    # standby, number_sync_standbys is 0 and the healthy standby is synchronous (the
    # primary waits for its flush before it acknowledges a commit).
    settings = ha.cluster.settings()
    assert settings["number_sync_standbys"] == "0"
    primary = ha.cluster.primary()
    standby = {"node1": 2, "node2": 1}[primary.name]
    assert settings["synchronous_standby_names"] == f"'ANY 1 (pgautofailover_standby_{standby})'"
    conn = await asyncpg.connect(primary.dsn())
    try:
        assert await conn.fetchval("SHOW synchronous_commit") == "on"
        sync_state = await conn.fetchval(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = $1",
            f"pgautofailover_standby_{standby}",
        )
        assert sync_state == "quorum"  # ANY 1 (...): a quorum of one
    finally:
        await conn.close()
    hosts = ",".join(f"127.0.0.1:{n.port}" for n in ha.cluster.nodes)
    assert ha.dsn.startswith(f"postgres://postgres@{hosts}/{DATABASE}?")
    assert "target_session_attrs=read-write" in ha.dsn


async def test_no_host_taking_writes_is_503_never_500(ha: HA) -> None:
    # Only the standby in the list: asyncpg finds no host that takes writes
    # (TargetServerAttributeNotMatched), as while a failover is under way. The app still
    # starts (its pool empty), and every request that needs Postgres answers 503.
    run = await _a_stream(ha)
    standby = ha.cluster.standby()
    dsn = f"{standby.dsn()}?target_session_attrs=read-write"
    app = create_app(ha.settings.with_overrides(database_url=dsn, pool_min_size=1))
    async with AsyncTestClient(app=app, timeout=30) as client:
        await _answers_only_503(client, ha.headers, run, reads_work=False)


async def test_an_endpoint_on_a_standby_is_503_for_writes(ha: HA) -> None:
    # One host, the standby (a provider's endpoint that has not moved yet): reads work,
    # writes fail with 25006 (the pools then replace their connections) and answer 503;
    # /readyz is 503, for the database takes no writes.
    run = await _a_stream(ha)
    standby = ha.cluster.standby()
    app = create_app(ha.settings.with_overrides(database_url=standby.dsn(), pool_min_size=1))
    async with AsyncTestClient(app=app, timeout=30) as client:

        async def replicated() -> bool:
            r = await client.get(stream_path(run, "s") + "/records", headers=ha.headers)
            return r.status_code == 200 and r.json()["latest_sequence"] == 1

        await eventually(replicated, what="the record on the standby")
        await _answers_only_503(client, ha.headers, run, reads_work=True)


async def _a_stream(ha: HA) -> str:
    """A run with stream ``s`` holding one record, made through the real server."""
    run = f"ro-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=ha.server.url, headers=ha.headers) as http:
        created = await http.post(
            f"{API}/runs/{run}/streams", json={"stream_id": "s", "direction": "output"}
        )
        assert created.status_code == 201, created.text
        appended = await http.post(
            stream_path(run, "s") + "/records", json={"records": [{"payload": 0}]}
        )
        assert appended.status_code == 201, appended.text
    return run


async def _answers_only_503(
    client: AsyncTestClient[Any], headers: dict[str, str], run: str, *, reads_work: bool
) -> None:
    answers = [
        await client.post(
            f"{API}/runs/{run}/streams",
            json={"stream_id": "t", "direction": "output"},
            headers=headers,
        ),
        await client.post(
            stream_path(run, "s") + "/records",
            json={"records": [{"payload": 1}]},
            headers={**headers, "Idempotency-Key": "k"},
        ),
    ]
    for response in answers:
        assert response.status_code == 503, response.text
        assert response.json()["code"] == "database_unavailable"
        assert int(response.headers["retry-after"]) >= 1
    read = await client.get(stream_path(run, "s") + "/records", headers=headers)
    if reads_work:
        assert read.status_code == 200, read.text
        assert [r["payload"] for r in read.json()["records"]] == [0]
    else:
        assert read.status_code == 503 and read.json()["code"] == "database_unavailable"
    ready = await client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["code"] == "not_ready", ready.text
    assert (await client.get("/healthz")).status_code == 200


@dataclass
class Outcome:
    load: FailoverLoad
    fault_at: float
    writable_at: float
    lost_at: float
    records: list[dict[str, Any]]
    replay_differences: list[str]
    followed: Followed
    inputs: list[dict[str, Any]]
    identity_changes: tuple[float, float]  # serve's count before the fault and after


async def _identity_changes(http: httpx.AsyncClient) -> float:
    """``serve``'s count of database identity changes (a scrape also checks the
    identity, store/identity.py)."""
    scrape = await http.get("/metrics")
    assert scrape.status_code == 200, scrape.text
    for line in scrape.text.splitlines():
        if line.startswith(IDENTITY_CHANGES + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {IDENTITY_CHANGES} in /metrics")


async def _fault_under_load(ha: HA, fault: str) -> Outcome:
    await asyncio.to_thread(ha.cluster.wait_stable)
    old, new = ha.cluster.primary(), ha.cluster.standby()
    run_id = f"ha-{fault}-{uuid.uuid4().hex[:8]}"
    handle = await ha.client.start_workflow(
        FollowInputWorkflow.run, "input", id=run_id, task_queue=TASK_QUEUE
    )
    load = FailoverLoad(ha.server.url, ha.headers, run_id, input_stream="input", resuming=RESUMING)

    async def input_stream_exists() -> bool:
        r = await load.http.get(stream_path(run_id, "input"))
        return r.status_code == 200

    await eventually(input_stream_exists, what="the workflow's input stream")
    probes = {node.name: WritableProbe(node.dsn()) for node in (old, new)}
    for probe in probes.values():
        probe.start()
    try:
        await load.start()
        await eventually(
            lambda: (
                len(load.acked) >= 100
                and len(load.inputs_acked) >= 5
                and all(s.records for s in load.subscribers)
            ),
            what="steady load before the fault",
        )
        identity_before = await _identity_changes(load.http)
        fault_at = time.monotonic()
        if fault == "switchover":
            await asyncio.to_thread(ha.cluster.switchover)
        else:
            ha.cluster.kill_primary()

        await eventually(
            lambda: probes[new.name].first(True, after=fault_at) is not None,
            timeout=60,
            what="the new primary taking writes",
        )
        writable_at = probes[new.name].first(True, after=fault_at)
        assert writable_at is not None
        lost_at = probes[old.name].first(False, after=fault_at - 1) or fault_at

        def recovered() -> bool:
            after = Counter(
                a.kind for a in load.answers if a.ended > writable_at and a.status == 201
            )
            return after["append"] >= 100 and after["input"] >= 10

        await eventually(recovered, timeout=60, what="appends after the fault")
        await load.stop()
        stop_marker = max(load.inputs_acked) + 1
        await load.send_input(-stop_marker)  # the workflow's last record: "stop"
        followed = await asyncio.wait_for(handle.result(), timeout=60)
        records = await load.read_all()
        replay_differences = await load.replays()
        inputs = await load.read_all("input")
        identity = (identity_before, await _identity_changes(load.http))
        return Outcome(
            load, fault_at, writable_at, lost_at, records, replay_differences, followed,
            inputs, identity,
        )  # fmt: skip
    finally:
        for probe in probes.values():
            await probe.stop()
        await load.close()


def _check(ha: HA, outcome: Outcome, fault: str) -> None:
    load = outcome.load
    figures = load.figures(outcome.fault_at, outcome.writable_at)
    statuses = Counter(a.status for a in load.answers if a.kind in ("append", "input"))
    ready = load.readyz()
    print(
        f"\n{fault}: outage {figures.outage:.2f} s, writes 2xx again "
        f"{figures.writes_again * 1000:.0f} ms after the new primary took a write; "
        f"append/input answers {dict(statuses)}, transport errors "
        f"{dict(load.transport_errors)}, readyz {dict(Counter(a.status for a in ready))}, "
        f"subscriber responses {sum(s.responses for s in load.subscribers)}"
    )
    # No 500, and every 5xx the outage's 503 (subscribes included).
    assert load.broken == []
    assert 500 not in statuses
    _stored_once_and_followed(load, outcome.records, outcome.replay_differences)
    assert load.outage_seen_at is not None and load.outage_seen_at >= outcome.fault_at

    # Every input once, in order, to the workflow; none stored twice.
    numbers = list(range(len(load.inputs_acked)))
    assert load.inputs_acked == numbers
    assert outcome.followed.numbers == numbers
    assert outcome.followed.sequences == list(range(1, len(numbers) + 1))
    assert [r["payload"]["n"] for r in outcome.inputs] == [*numbers, -len(numbers)]

    # /readyz: never 200 while no node took writes; 503 then; 200 at the end.
    window = (outcome.lost_at + PROBE_MARGIN_SECONDS, outcome.writable_at - PROBE_MARGIN_SECONDS)
    inside = [a for a in ready if a.started >= window[0] and a.ended <= window[1]]
    assert [a for a in inside if a.status == 200] == []
    assert any(a.status == 503 for a in inside) or window[1] - window[0] < 0.2
    assert ready[-1].status == 200
    # Writes came back soon after the new primary took them (a loose, product bound).
    assert figures.writes_again < WRITES_AGAIN_SECONDS

    # The processes lived through it.
    assert ha.server.process is not None and ha.server.process.poll() is None
    assert ha.workers.process.poll() is None
    # And serve counted the promotion (a new timeline of the same cluster).
    before, after = outcome.identity_changes
    assert after > before, outcome.identity_changes


def _stored_once_and_followed(
    load: FailoverLoad, records: list[dict[str, Any]], replay_differences: list[str]
) -> None:
    """Every acked append stored exactly once at its sequence, nothing else stored,
    every key replaying its answer; every subscriber got every record once, in order,
    as ``records`` (the final read) has it, and the resuming ones did resume, with
    ``Last-Event-ID``, after dropping their response in the outage."""
    by_key = {(r["payload"]["w"], r["payload"]["n"]): r["sequence"] for r in records}
    assert len(by_key) == len(records)  # no payload twice
    acked = {
        (int(key[1:].split("-")[0]), int(key.split("-")[1])): body["first_sequence"]
        for key, (_, body) in load.acked.items()
    }
    assert by_key == acked
    assert [r["sequence"] for r in records] == list(range(1, len(records) + 1))
    assert replay_differences == []

    for subscriber in load.subscribers:
        assert subscriber.records == records
    resuming = [s for s in load.subscribers if s.drop is not None]
    assert resuming
    for subscriber in resuming:
        # Dropped in the gap, after records of its own; its first resume asked for
        # what came after them (a resume that ignored Last-Event-ID would have given
        # those records twice, and the equality above would fail).
        assert subscriber.dropped_after is not None and subscriber.dropped_after > 0
        assert subscriber.resumed_from[:1] == [subscriber.dropped_after]
        assert subscriber.responses >= 2


async def test_planned_switchover_under_load(ha: HA) -> None:
    outcome = await _fault_under_load(ha, "switchover")
    _check(ha, outcome, "switchover")


async def test_the_commands_follow_the_primary(ha: HA) -> None:
    # After the switchover the first host of the URI is the standby: each command
    # connects past it to the primary.
    await asyncio.to_thread(ha.cluster.wait_stable)
    assert ha.cluster.standby().name == "node1"
    for args in (("migrate",), ("prune",), ("outbox", "summary")):
        done = _cli(ha.dsn, *args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    assert "migrations are current" in _cli(ha.dsn, "migrate").stdout


async def test_a_failover_endpoint_that_moves(ha: HA, tmp_path: Path) -> None:
    """One address in front of the primary (a provider's DNS name or virtual IP), a
    switchover behind it, then the address moved to the new primary with every old
    connection reset. Until the move only 503s; after it, 2xx again; nothing
    acknowledged lost; two of four subscribers resume across the gap."""
    await asyncio.to_thread(ha.cluster.wait_stable)
    old, new = ha.cluster.primary(), ha.cluster.standby()
    run_id = f"ha-endpoint-{uuid.uuid4().hex[:8]}"
    with TcpProxy(("127.0.0.1", old.port)) as endpoint:
        settings = ha.settings.with_overrides(database_url=endpoint.dsn(DATABASE))
        with ServerProcess(settings, log_path=tmp_path / "serve.log") as server:
            load = FailoverLoad(
                server.url, ha.headers, run_id, writers=2, subscribers=4, resuming=2
            )
            try:
                await load.start()
                await eventually(
                    lambda: len(load.acked) >= 30 and all(s.records for s in load.subscribers),
                    what="steady load before the switchover",
                )
                identity_before = await _identity_changes(load.http)
                switch_began = time.monotonic()
                await asyncio.to_thread(ha.cluster.switchover)
                switched_at = time.monotonic()
                # The endpoint still names the old primary, a standby now: writes
                # through it answer 503 (25006, or refused while it restarted).
                await eventually(
                    lambda: any(
                        a.started > switched_at and a.status == 503 for a in load.appends()
                    ),
                    what="a 503 from the endpoint on the old primary",
                )
                moved_at = time.monotonic()
                reset = endpoint.move(("127.0.0.1", new.port))
                await eventually(
                    lambda: (
                        sum(1 for a in load.appends() if a.started > moved_at and a.status == 201)
                        >= 30
                    ),
                    timeout=60,
                    what="appends after the endpoint moved",
                )
                await load.stop()
                records = await load.read_all()
                replay_differences = await load.replays()
                identity_after = await _identity_changes(load.http)
            finally:
                await load.close()
            alive = server.process is not None and server.process.poll() is None
    statuses = Counter(a.status for a in load.appends())
    print(
        f"\nendpoint moved: append answers {dict(statuses)}, transport errors "
        f"{dict(load.transport_errors)}, connections reset by the move {reset}, "
        f"subscriber responses {sum(s.responses for s in load.subscribers)}"
    )
    # Only the outage's 503 (with Retry-After), never a 500, subscribes included.
    assert load.broken == []
    assert 500 not in statuses and statuses[503] > 0
    # Nothing was written through the endpoint while it named the old primary.
    stale = [a for a in load.appends() if a.started > switched_at and a.ended < moved_at]
    assert [a for a in stale if a.status is not None and a.status < 300] == []
    # The gap began with the switchover, and the resuming followers dropped in it.
    assert load.outage_seen_at is not None and load.outage_seen_at > switch_began
    _stored_once_and_followed(load, records, replay_differences)
    assert load.readyz()[-1].status == 200
    assert identity_after > identity_before
    assert alive
    text = (tmp_path / "serve.log").read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    entries = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert not [e for e in entries if e["level"] in ("ERROR", "CRITICAL")], text[-3000:]


async def test_primary_killed_under_load(ha: HA) -> None:
    outcome = await _fault_under_load(ha, "kill")
    _check(ha, outcome, "kill -9")


def test_the_processes_logged_no_error(ha: HA) -> None:
    for log in ("serve.log", "workers.log"):
        text = (ha.folder / log).read_text(errors="replace")
        assert "Traceback" not in text, text[-3000:]
        entries = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        assert not [e for e in entries if e["level"] in ("ERROR", "CRITICAL")], text[-3000:]
