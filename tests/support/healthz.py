"""``/healthz`` probed from a process of its own while a test loads the server."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

# Runs in a process of its own, so that the test's own work (sending 80 MiB bodies) does
# not delay its measurements: /healthz every 100 ms on a keep-alive connection until its
# stdin closes, then the answers' times in ms as JSON.
_PROBE = """
import json, select, sys, time
import httpx
times = []
with httpx.Client(base_url=sys.argv[1], timeout=5) as client:
    print("ready", flush=True)
    while not select.select([sys.stdin], [], [], 0.1)[0]:  # pacing; stdin closes: stop
        started = time.monotonic()
        ok = client.get("/healthz").status_code == 200
        times.append((time.monotonic() - started) * 1000 if ok else float("inf"))
print(json.dumps(times))
"""


@contextmanager
def healthz_probe(url: str) -> Iterator[list[float]]:
    """Probe ``/healthz`` while the block runs; the list holds the answers' times (ms)
    once it ends."""
    times: list[float] = []
    probe = subprocess.Popen(
        [sys.executable, "-c", _PROBE, url],
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
