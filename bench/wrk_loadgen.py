"""The same closed-loop load as ``bench.loadgen``, driven by ``wrk`` (Debian's package).

    python -m bench.wrk_loadgen --port 8000 --spec spec.json

Same spec file and same JSON answer as ``bench.loadgen``, so ``bench.append`` can use
either; it uses this one when wrk is installed. On a 2-core machine the client's CPU is
taken from the server and Postgres, and with one client it is also on every request's
path: wrk costs a fraction of the Python client's CPU per request (docs/decisions.md,
"Measuring").

How the spec maps onto wrk (the script: tests/support/wrk_script.py): one wrk thread
per distinct request path, with the connections of that path (``-t paths -c
connections``), each thread sending its path's pre-built request again and again on
keep-alive connections, one at a time per connection; so "16 clients, 16 streams" is 16
threads of one connection and "16 clients, 1 stream" one thread of 16. A warm-up run of
``warmup`` seconds comes first; the measured run's figures come from a Lua ``done`` hook
that prints them as JSON. wrk counts answers with status 400 or above as errors and
nothing else, so the statuses are ``"2xx/3xx"`` and ``"error"``; the append API answers
no 3xx.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.loadgen import parse_command
from tests.support.wrk_script import parse, script


def available() -> bool:
    """Whether ``wrk`` is on the PATH."""
    return shutil.which("wrk") is not None


def _wrk(
    url: str, script_path: str, threads: int, connections: int, seconds: float
) -> dict[str, int]:
    out = subprocess.run(
        [
            "wrk",
            f"-t{threads}",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            "--timeout",
            "10s",
            "-s",
            script_path,
            url,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return parse(out.stdout)


def run(host: str, port: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Warm up, then measure; the answer has ``bench.loadgen``'s fields."""
    text, threads, connections = script(spec)
    url = f"http://{host}:{port}/"
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as folder:
        script_path = str(Path(folder) / "append.lua")
        Path(script_path).write_text(text)
        warm = {"requests": 0, "status": 0}
        if float(spec.get("warmup", 1.0)) > 0:
            warm = _wrk(url, script_path, threads, connections, float(spec.get("warmup", 1.0)))
        measured = _wrk(url, script_path, threads, connections, float(spec["seconds"]))
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    elapsed = measured["duration_us"] / 1e6
    socket_errors = sum(measured[k] for k in ("connect", "read", "write", "timeout"))
    ok = measured["requests"] - measured["status"]
    statuses = {"2xx/3xx": ok}
    if measured["status"]:
        statuses["error"] = measured["status"]
    if socket_errors:
        statuses["socket error"] = socket_errors
    return {
        "requests": measured["requests"],
        "ok": ok,
        "statuses": statuses,
        "elapsed": elapsed,
        "per_second": ok / elapsed if elapsed > 0 else 0.0,
        "p50_ms": measured["p50_us"] / 1000,
        "p99_ms": measured["p99_us"] / 1000,
        "all_ok": ok + warm["requests"] - warm["status"],
        "client_cpu_seconds": (cpu_after.ru_utime + cpu_after.ru_stime)
        - (cpu_before.ru_utime + cpu_before.ru_stime),
    }


def main(argv: list[str] | None = None) -> int:
    host, port, spec = parse_command("python -m bench.wrk_loadgen", __doc__, argv)
    json.dump(run(host, port, spec), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
