"""Failover of a real HA Postgres under load: how long writes stop, and how soon after the
new primary takes writes they are answered 2xx again.

Each run builds a pg_auto_failover cluster on loopback (a monitor, a primary and its
synchronous standby: tests/support/pg_cluster.py, fast health checks) and one ``serve``
on the multi-host URI ``pg_autoctl show uri`` prints, puts the load of
tests/support/failover_load.py on it (writers appending with ``Idempotency-Key``s and
retrying 503s after ``--retry-delay``, SSE subscribers resuming with ``Last-Event-ID``,
``/readyz`` every 50 ms, each node probed straight every 20 ms), and applies two faults:

- ``switchover``: ``pg_autoctl perform switchover``;
- ``kill``: the primary's keeper stopped, then its postmaster SIGKILLed; the monitor
  notices and promotes the standby.

Prints one JSON line per fault:

- ``outage_s``: the longest time without any append answered 2xx, around the fault;
- ``writes_2xx_after_writable_ms``: from the moment the new primary took a write (its
  probe; up to ~30 ms late) to the first append answered 2xx (negative: the server was
  there before the probe's next look);
- ``no_writable_primary_s``: how long no node took writes (the probes): what
  pg_auto_failover itself takes;
- the answers by status, the 5xx that are not 503 ``database_unavailable`` with
  ``Retry-After``, ``/readyz`` answered 200 while no node took writes, and whether every
  acknowledged append is stored exactly once and every subscriber saw every record once.

    python -m bench.failover [--runs 2] [--writers 4] [--subscribers 20]

tests/production/test_ha_failover.py runs both faults once (with a workflow taking input
records too) and asserts the same properties.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ductor_streams.auth import SCOPES, issue_token
from ductor_streams.config import Settings
from ductor_streams.schema.migrate import migrate
from tests.support.failover_load import FailoverLoad, WritableProbe
from tests.support.pg_cluster import AutoFailoverCluster
from tests.support.server import ServerProcess

SECRET = "bench-failover-secret-" + "x" * 32
# A readiness answer within this long of a probe's change may be about either side.
PROBE_MARGIN_SECONDS = 0.1


async def one_fault(
    cluster: AutoFailoverCluster, server: ServerProcess, fault: str, args: argparse.Namespace
) -> dict[str, Any]:
    await asyncio.to_thread(cluster.wait_stable)
    old, new = cluster.primary(), cluster.standby()
    token = issue_token(SECRET, sub="bench", tenant="bench", scopes=list(SCOPES), runs=["*"])
    load = FailoverLoad(
        server.url,
        {"Authorization": f"Bearer {token}"},
        f"failover-{fault}-{time.monotonic_ns()}",
        writers=args.writers,
        subscribers=args.subscribers,
        pace=args.pace,
        retry_delay=args.retry_delay,
    )
    probes = {node.name: WritableProbe(node.dsn()) for node in (old, new)}
    for probe in probes.values():
        probe.start()
    try:
        await load.start()
        await asyncio.sleep(args.before)
        fault_at = time.monotonic()
        if fault == "switchover":
            await asyncio.to_thread(cluster.switchover)
        else:
            cluster.kill_primary()
        deadline = time.monotonic() + 60
        while (writable_at := probes[new.name].first(True, after=fault_at)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError("the new primary never took writes")
            await asyncio.sleep(0.02)
        lost_at = probes[old.name].first(False, after=fault_at - 1) or fault_at
        await asyncio.sleep(max(0.0, writable_at + args.after - time.monotonic()))
        latest = await load.stop()
        records = await load.read_all()
    finally:
        for probe in probes.values():
            await probe.stop()
        await load.close()

    figures = load.figures(fault_at, writable_at)
    window = (lost_at + PROBE_MARGIN_SECONDS, writable_at - PROBE_MARGIN_SECONDS)
    ready = load.readyz()
    acked = {key: body["first_sequence"] for key, (_, body) in load.acked.items()}
    stored: Counter[str] = Counter()
    where: dict[str, int] = {}
    for record in records:
        key = f"w{record['payload']['w']}-{record['payload']['n']}"
        stored[key] += 1
        where[key] = record["sequence"]
    statuses = Counter(a.status for a in load.appends())
    return {
        "fault": fault,
        "outage_s": round(figures.outage, 3),
        "writes_2xx_after_writable_ms": round(figures.writes_again * 1000),
        "no_writable_primary_s": round(writable_at - lost_at, 3),
        "appends_by_status": {str(k): v for k, v in sorted(statuses.items(), key=str)},
        "5xx_not_503_database_unavailable": len(load.broken),
        "readyz_by_status": dict(Counter(str(a.status) for a in ready)),
        "readyz_200_while_no_writable_primary": sum(
            1 for a in ready if a.status == 200 and window[0] <= a.started and a.ended <= window[1]
        ),
        "appends_acknowledged": len(acked),
        "acknowledged_not_stored_once_at_its_sequence": sum(
            1 for key, seq in acked.items() if stored[key] != 1 or where[key] != seq
        ),
        "stored_unacknowledged": sum(1 for key in stored if key not in acked),
        "subscribers_not_seeing_every_record_once": sum(
            1 for s in load.subscribers if s.records != records
        ),
        "subscriber_responses": sum(s.responses for s in load.subscribers),
        "latest_sequence": latest,
    }


async def one_run(args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    cluster = AutoFailoverCluster()
    results = []
    try:
        await asyncio.to_thread(cluster.start)
        dsn = cluster.dsn()
        await migrate(dsn)
        settings = Settings(database_url=dsn, jwt_secret=SECRET, region="local", tenant="bench")
        with ServerProcess(settings, log_path=folder / "server.log") as server:
            for fault in ("switchover", "kill"):
                results.append(await one_fault(cluster, server, fault, args))
    finally:
        await asyncio.to_thread(cluster.destroy)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="clusters, each with both faults")
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--subscribers", type=int, default=20)
    parser.add_argument("--pace", type=float, default=0.01, help="writer pause between appends")
    parser.add_argument(
        "--retry-delay", type=float, default=0.05, help="writer pause before retrying a 503"
    )
    parser.add_argument("--before", type=float, default=3.0, help="seconds of load before")
    parser.add_argument(
        "--after", type=float, default=3.0, help="seconds of load after the new primary"
    )
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    failed = False
    for run in range(1, args.runs + 1):
        for result in asyncio.run(one_run(args, folder)):
            print(json.dumps({"run": run, **result}), flush=True)
            failed = failed or bool(
                result["5xx_not_503_database_unavailable"]
                or "500" in result["appends_by_status"]
                or result["readyz_200_while_no_writable_primary"]
                or result["acknowledged_not_stored_once_at_its_sequence"]
                or result["stored_unacknowledged"]
                or result["subscribers_not_seeing_every_record_once"]
            )
    print(f"server log: {folder / 'server.log'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
