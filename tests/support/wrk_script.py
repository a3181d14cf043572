"""The Lua script that drives ``wrk`` with a closed-loop append load, and the reading of
its answer: one wrk thread per distinct request path, with that path's connections,
each sending its path's pre-built request again and again on keep-alive connections.

``bench.wrk_loadgen`` runs wrk with it; tests/speed/test_wrk_script.py checks the
mapping and the parse without running wrk.
"""

from __future__ import annotations

import json
from typing import Any

# One thread state each: ``setup`` (main state) gives every thread its path; ``init``
# (the thread's state) builds its request once; ``request`` hands it out every time.
SCRIPT = """
local paths = %(paths)s
local body = %(body)s
local headers = %(headers)s
local given = 0

function setup(thread)
  given = given + 1
  thread:set("path", paths[given])
end

function init(args)
  for name, value in pairs(headers) do wrk.headers[name] = value end
  wrk.headers["Content-Type"] = "application/json"
  req = wrk.format("POST", path, nil, body)
end

function request()
  return req
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK-RESULT {"requests": %%d, "duration_us": %%d, "p50_us": %%d, "p99_us": %%d, '
    .. '"status": %%d, "connect": %%d, "read": %%d, "write": %%d, "timeout": %%d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect, e.read, e.write, e.timeout))
end
"""


def _lua_string(value: str) -> str:
    # Lua's long brackets take the text as it is; JSON bodies and tokens hold no "]==]".
    assert "]==]" not in value
    return f"[==[{value}]==]"


def script(spec: dict[str, Any]) -> tuple[str, int, int]:
    """The Lua script for ``spec``, its thread count and its connection count.

    Connections are grouped by path; every path must have as many connections (as
    ``bench.append``'s shapes do: connection i appends to stream i % streams)."""
    by_path: dict[str, int] = {}
    for c in spec["connections"]:
        by_path[c["path"]] = by_path.get(c["path"], 0) + 1
    if len(set(by_path.values())) != 1:
        raise ValueError("wrk needs as many connections on every path")
    first = spec["connections"][0]
    if any(
        c["body"] != first["body"] or c["headers"] != first["headers"] for c in spec["connections"]
    ):
        raise ValueError("wrk sends one body and one set of headers")
    body = json.dumps(first["body"], separators=(",", ":"))
    headers = ", ".join(
        f"[ {_lua_string(k)} ] = {_lua_string(v)}" for k, v in first["headers"].items()
    )
    text = SCRIPT % {
        "paths": "{" + ", ".join(_lua_string(p) for p in by_path) + "}",
        "body": _lua_string(body),
        "headers": "{" + headers + "}",
    }
    return text, len(by_path), len(spec["connections"])


def parse(stdout: str) -> dict[str, int]:
    """The figures the ``done`` hook printed."""
    for line in stdout.splitlines():
        if line.startswith("WRK-RESULT "):
            figures: dict[str, int] = json.loads(line.removeprefix("WRK-RESULT "))
            return figures
    raise RuntimeError(f"wrk printed no result:\n{stdout}")
