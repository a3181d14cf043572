"""Tenant fairness: one tenant's one-record appends while another floods catch-up reads.

    python -m bench.fairness [--loops 120] [--seconds 15] [--attack mixed|records|ds]
                             [--server-cwd PATH] [--env NAME=VALUE ...] [--json out.json]

One isolated database and one real ``serve --no-workers`` with the shipped settings
(``--env`` adds server variables, ``--server-cwd`` runs the package of another checkout,
e.g. to measure a version before a change). Tenant ``attacker`` has a stream of 1,000
records of 8 KB: a catch-up of it is an 8 MB page, natively (``GET .../records?limit=1000``)
or by DS (``GET .../ds/v1/stream/s``). Tenant ``victim`` appends one record at a time to
its own stream (one client, each append sent when the last was answered), and ``/healthz``
is probed beside it.

Three phases back to back, in the same window: quiet (the victim alone), attack (the
victim while ``--loops`` attacker loops, in a process of their own, each read an 8 MB
page over and over on raw sockets, retrying at once after a 429 as a hostile client
would), quiet again. Printed: the victim's append p50/p99 quiet (both quiet phases) and
under attack, their ratio, ``/healthz`` p50/p99 alike, and what the attacker got
(answers by status, pages and MB/s). The target (the tenant-isolation issue): append
p99 under attack <= 250 ms on the shared 2-core machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench.environment import HTTP_LIMITS, host_loop_ms, isolated_database, postgres_server
from ductor_streams.auth import issue_token
from ductor_streams.config import Settings
from ductor_streams.schema.migrate import migrate
from tests.support.server import ServerProcess

API = "/api/workflow-streams"
RECORDS = 1000
PAYLOAD = "x" * 8000  # 1,000 of them: an 8 MB page


def _token(secret: str, tenant: str) -> str:
    return issue_token(
        secret,
        sub=tenant,
        tenant=tenant,
        scopes=["streams:read", "streams:write", "streams:admin"],
        runs=["*"],
        ttl_seconds=24 * 3600,
    )


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _setup(url: str, attacker: str, victim: str, run_id: str) -> None:
    with httpx.Client(base_url=url, timeout=120) as client:
        for token, payload in ((attacker, PAYLOAD), (victim, None)):
            headers = {"Authorization": f"Bearer {token}"}
            created = client.post(
                f"{API}/runs/{run_id}/streams",
                json={"stream_id": "s", "direction": "output"},
                headers=headers,
            )
            created.raise_for_status()
            if payload is not None:
                body = json.dumps({"records": [{"payload": payload} for _ in range(RECORDS)]})
                client.post(
                    f"{API}/runs/{run_id}/streams/s/records",
                    content=body,
                    headers={**headers, "Content-Type": "application/json"},
                ).raise_for_status()


async def _victim(
    url: str, token: str, run_id: str, seconds: float
) -> tuple[list[float], list[float]]:
    """One-record appends back to back, and /healthz probes beside them (ms each)."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    body = b'{"records":[{"payload":{"n":1}}]}'
    appends: list[float] = []
    probes: list[float] = []
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=HTTP_LIMITS) as client:

        async def append_loop() -> None:
            while time.monotonic() < deadline:
                started = time.perf_counter()
                answer = await client.post(
                    f"{API}/runs/{run_id}/streams/s/records", content=body, headers=headers
                )
                appends.append((time.perf_counter() - started) * 1000)
                if answer.status_code != 201:
                    raise RuntimeError(f"victim append answered {answer.status_code}")

        async def probe_loop() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=60, limits=HTTP_LIMITS) as probe:
                while time.monotonic() < deadline:
                    started = time.perf_counter()
                    (await probe.get("/healthz")).raise_for_status()
                    probes.append((time.perf_counter() - started) * 1000)
                    await asyncio.sleep(0.05)

        await asyncio.gather(append_loop(), probe_loop())
    return appends, probes


# -- the attacker (a process of its own) -----------------------------------------------


async def _attack(
    port: int, token: str, paths: list[str], loops: int, seconds: float
) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    received = 0
    deadline = time.monotonic() + seconds

    async def loop(path: str) -> None:
        nonlocal received
        request = (
            f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        while time.monotonic() < deadline:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(request)
                first = await reader.read(1 << 16)
                status = first[9:12].decode() if first else "none"
                got = len(first)
                while data := await reader.read(1 << 20):
                    got += len(data)
                writer.close()
            except OSError:
                status, got = "error", 0
            statuses[status] = statuses.get(status, 0) + 1
            received += got

    await asyncio.gather(*(loop(paths[i % len(paths)]) for i in range(loops)))
    return {"statuses": statuses, "bytes": received, "seconds": seconds}


def _attacker_main(argv: list[str]) -> int:
    port, token, paths, loops, seconds = (
        int(argv[0]),
        argv[1],
        argv[2].split(","),
        int(argv[3]),
        float(argv[4]),
    )
    print(json.dumps(asyncio.run(_attack(port, token, paths, loops, seconds))), flush=True)
    return 0


# -- the run -----------------------------------------------------------------------------


def _summary(appends: list[float], probes: list[float]) -> dict[str, float]:
    return {
        "appends": len(appends),
        "append_p50_ms": round(_percentile(appends, 0.5), 1),
        "append_p99_ms": round(_percentile(appends, 0.99), 1),
        "healthz_p50_ms": round(_percentile(probes, 0.5), 1),
        "healthz_p99_ms": round(_percentile(probes, 0.99), 1),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    secret = secrets.token_hex(24)
    attacker, victim = _token(secret, "attacker"), _token(secret, "victim")
    run_id = f"fair-{uuid.uuid4().hex[:8]}"
    extra_env = dict(item.split("=", 1) for item in args.env)
    with postgres_server() as server_dsn, isolated_database(server_dsn) as dsn:
        asyncio.run(migrate(dsn))
        settings = Settings(database_url=dsn, jwt_secret=secret, region="local")
        with tempfile.NamedTemporaryFile(prefix="ds-bench-fair-", suffix=".log") as log:
            with ServerProcess(
                settings,
                extra_env=extra_env,
                log_path=Path(log.name),
                cwd=Path(args.server_cwd) if args.server_cwd else None,
            ) as server:
                _setup(server.url, attacker, victim, run_id)
                paths = {
                    "records": [f"{API}/runs/{run_id}/streams/s/records?limit={RECORDS}"],
                    "ds": [f"{API}/runs/{run_id}/ds/v1/stream/s"],
                }
                paths["mixed"] = paths["records"] + paths["ds"]
                host_ms = host_loop_ms()
                quiet = asyncio.run(_victim(server.url, victim, run_id, args.seconds))
                attack = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "bench.fairness",
                        "--attacker",
                        str(server.port),
                        attacker,
                        ",".join(paths[args.attack]),
                        str(args.loops),
                        str(args.seconds + 4),
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                time.sleep(2)  # the attack under way before the victim measures
                attacked = asyncio.run(_victim(server.url, victim, run_id, args.seconds))
                out, _ = attack.communicate(timeout=args.seconds + 120)
                got = json.loads(out.strip().splitlines()[-1])
                quiet_after = asyncio.run(_victim(server.url, victim, run_id, args.seconds))
    quiet_all = (quiet[0] + quiet_after[0], quiet[1] + quiet_after[1])
    result = {
        "loops": args.loops,
        "attack": args.attack,
        "seconds": args.seconds,
        "host_loop_ms": host_ms,
        "env": extra_env,
        "server_cwd": args.server_cwd,
        "quiet": _summary(*quiet_all),
        "attacked": _summary(*attacked),
        "attacker": {
            **got["statuses"],
            "pages_per_s": round(got["statuses"].get("200", 0) / got["seconds"], 1),
            "mb_per_s": round(got["bytes"] / got["seconds"] / 1e6, 1),
        },
    }
    q, a = result["quiet"], result["attacked"]
    result["ratio_p50"] = round(a["append_p50_ms"] / q["append_p50_ms"], 1)
    result["ratio_p99"] = round(a["append_p99_ms"] / q["append_p99_ms"], 1)
    return result


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--attacker":
        return _attacker_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m bench.fairness",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--loops", type=int, default=120, help="attacker loops at once")
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds per phase")
    parser.add_argument("--attack", choices=["mixed", "records", "ds"], default="mixed")
    parser.add_argument("--server-cwd", help="run the server from this checkout's package")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    result = run(args)
    q, a = result["quiet"], result["attacked"]
    print(
        f"victim append, quiet:    p50 {q['append_p50_ms']:7.1f} ms  "
        f"p99 {q['append_p99_ms']:7.1f} ms"
        f"  ({q['appends']} appends)"
    )
    print(
        f"victim append, attacked: p50 {a['append_p50_ms']:7.1f} ms  "
        f"p99 {a['append_p99_ms']:7.1f} ms"
        f"  ({a['appends']} appends; target p99 <= 250 ms)"
    )
    print(f"ratio attacked/quiet:    p50 {result['ratio_p50']}x  p99 {result['ratio_p99']}x")
    print(
        f"/healthz quiet p50/p99 {q['healthz_p50_ms']}/{q['healthz_p99_ms']} ms; attacked "
        f"{a['healthz_p50_ms']}/{a['healthz_p99_ms']} ms"
    )
    print(f"attacker ({result['loops']} loops, {result['attack']}): {result['attacker']}")
    print(f"host loop {result['host_loop_ms']} ms; load {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
