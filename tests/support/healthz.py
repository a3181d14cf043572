"""``/healthz`` probed from a process of its own while a test loads the server."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

# Runs in a process of its own, so that the test's own work (sending 80 MiB bodies) does
# not delay its measurements: /healthz every 100 ms on a keep-alive connection until its
# stdin closes, then the answers' times in ms as JSON. With "new" as its second argument
# each probe opens a connection of its own (the client is built once: building one costs
# tens of ms of its own, which a probe must not measure).
_PROBE = """
import json, select, sys, time
import httpx
times = []
keep = 0 if sys.argv[2] == "new" else None
limits = httpx.Limits(max_keepalive_connections=keep)
with httpx.Client(base_url=sys.argv[1], timeout=5, limits=limits) as client:
    print("ready", flush=True)
    while not select.select([sys.stdin], [], [], 0.1)[0]:  # pacing; stdin closes: stop
        started = time.monotonic()
        ok = client.get("/healthz").status_code == 200
        times.append((time.monotonic() - started) * 1000 if ok else float("inf"))
print(json.dumps(times))
"""


@contextmanager
def healthz_probe(url: str, *, new_connections: bool = False) -> Iterator[list[float]]:
    """Probe ``/healthz`` while the block runs; the list holds the answers' times (ms)
    once it ends. ``new_connections`` opens a connection per probe instead of keeping one
    alive (what a load balancer's health check does, and what a connection limit tests)."""
    times: list[float] = []
    probe = subprocess.Popen(
        [sys.executable, "-c", _PROBE, url, "new" if new_connections else "keep"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert probe.stdin is not None and probe.stdout is not None
    try:
        assert probe.stdout.readline().strip() == "ready"
        yield times
    finally:
        output, _ = probe.communicate(timeout=30)
    times.extend(json.loads(output))
