"""tests/support/wrk_script.py (run by bench/wrk_loadgen.py) maps bench.append's load
spec onto wrk: one thread per path.

Unit tests of the mapping and of reading wrk's answer; the benchmark itself runs wrk.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.wrk_script import parse, script

BODY = {"records": [{"payload": {"n": 1}}]}
HEADERS = {"Authorization": "Bearer t0k"}


def spec(paths: list[str]) -> dict[str, Any]:
    return {"connections": [{"path": p, "body": BODY, "headers": HEADERS} for p in paths]}


def test_one_thread_per_path_with_its_connections() -> None:
    text, threads, connections = script(spec(["/s0", "/s1", "/s0", "/s1"]))
    assert (threads, connections) == (2, 4)
    assert "local paths = {[==[/s0]==], [==[/s1]==]}" in text
    assert 'local body = [==[{"records":[{"payload":{"n":1}}]}]==]' in text
    # "[[" would open a Lua long string: the key's brackets keep a space.
    assert "local headers = {[ [==[Authorization]==] ] = [==[Bearer t0k]==]}" in text


def test_uneven_paths_and_differing_bodies_are_refused() -> None:
    with pytest.raises(ValueError, match="as many connections"):
        script(spec(["/s0", "/s0", "/s1"]))
    odd = spec(["/s0", "/s1"])
    odd["connections"][1]["body"] = {"records": []}
    with pytest.raises(ValueError, match="one body"):
        script(odd)


def test_the_done_hook_line_is_read_and_its_absence_is_an_error() -> None:
    out = (
        "Running 1s test @ http://127.0.0.1:1/\n"
        'WRK-RESULT {"requests": 7, "duration_us": 1000, "p50_us": 12, "p99_us": 40, '
        '"status": 1, "connect": 0, "read": 0, "write": 0, "timeout": 0}\n'
    )
    assert parse(out) == {
        "requests": 7,
        "duration_us": 1000,
        "p50_us": 12,
        "p99_us": 40,
        "status": 1,
        "connect": 0,
        "read": 0,
        "write": 0,
        "timeout": 0,
    }
    # A script error leaves wrk's exit status 0 and no result line.
    with pytest.raises(RuntimeError, match="no result"):
        parse("append.lua:4: '}' expected near '='\n")
