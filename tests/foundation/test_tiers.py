"""The test tiers (tests/support/tiers.py, given in tests/conftest.py): the fixtures that
start processes are read as such, no ``fast`` test uses one, and a ``fast`` test that
starts a process anyway fails."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.support.tiers import FAST, TIERS, ProcessInFastTest, Reader, forbid_processes

# The shared fixtures that start processes, and the tier of every test using one.
PROCESS_FIXTURES = {
    "server": "server",
    "ds_server": "server",
    "live_server": "server",
    "temporal_env": "temporal",
    "browser": "browser",
    "engine": "image",
    "app_image": "image",
}


def fixture_functions(item: pytest.Item) -> dict[str, list[Any]]:
    """Every fixture function a collected test uses, by name."""
    info = item._fixtureinfo  # type: ignore[attr-defined]
    return {name: [d.func for d in defs] for name, defs in info.name2fixturedefs.items()}


def test_the_fixtures_that_start_processes_are_read_as_their_tiers() -> None:
    import tests.conftest
    import tests.console.conftest
    import tests.deploy.conftest
    import tests.ds.conftest
    import tests.live.conftest
    import tests.temporal.conftest

    reader = Reader()
    read = {
        "server": reader.tiers(tests.conftest.server),
        "ds_server": reader.tiers(tests.ds.conftest.ds_server),
        "live_server": reader.tiers(tests.live.conftest.live_server),
        "temporal_env": reader.tiers(tests.temporal.conftest.temporal_env),
        "browser": reader.tiers(tests.console.conftest.browser),
        "engine": reader.tiers(tests.deploy.conftest.engine),
    }
    assert {name: sorted(tiers) for name, tiers in read.items()} == {
        name: [PROCESS_FIXTURES[name]] for name in read
    }


def test_every_test_using_one_is_in_its_tier(request: pytest.FixtureRequest) -> None:
    wrong = [
        (item.nodeid, name)
        for item in request.session.items
        for name, tier in PROCESS_FIXTURES.items()
        if name in item.fixturenames and not item.get_closest_marker(tier)  # type: ignore[attr-defined]
    ]
    assert wrong == []


def test_no_fast_test_uses_a_fixture_that_starts_a_process(request: pytest.FixtureRequest) -> None:
    reader = Reader()
    fast = [item for item in request.session.items if item.get_closest_marker(FAST)]
    assert fast, "this test is itself fast"
    offenders = {
        item.nodeid: sorted(
            name
            for name, funcs in fixture_functions(item).items()
            if name in PROCESS_FIXTURES or any(reader.tiers(f) for f in funcs)
        )
        for item in fast
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_every_test_has_a_tier(request: pytest.FixtureRequest) -> None:
    tiers = {FAST, *TIERS}
    untiered = [
        item.nodeid
        for item in request.session.items
        if not any(item.get_closest_marker(t) for t in tiers)
    ]
    assert untiered == []
    # A fast test is fast alone: no tier beside it.
    assert [
        item.nodeid
        for item in request.session.items
        if item.get_closest_marker(FAST) and any(item.get_closest_marker(t) for t in TIERS)
    ] == []


# Samples for the reader, looked up by name (a test naming them would be read as
# starting what they start).
def _sample_pure() -> int:
    return len(os.sep)


def _sample_subprocess() -> None:
    subprocess.run(["true"], check=True)


def _sample_server(settings: Any) -> None:
    from tests.support.server import ServerProcess

    with ServerProcess(settings):
        pass


def _sample_through_a_helper() -> None:
    _sample_subprocess()


async def _sample_asyncio() -> None:
    await asyncio.create_subprocess_exec("true")


class _SampleClass:
    def start(self) -> None:
        os.system("true")


def _sample(name: str) -> Any:
    return vars(sys.modules[__name__])["_sample_" + name]


@pytest.mark.parametrize(
    ("name", "tiers"),
    [
        ("pure", []),
        ("subprocess", ["process"]),
        ("server", ["server"]),
        ("through_a_helper", ["process"]),
        ("asyncio", ["process"]),
    ],
)
def test_the_reader_finds_what_a_function_starts(name: str, tiers: list[str]) -> None:
    assert sorted(Reader().tiers(_sample(name))) == tiers


def test_the_reader_reads_a_class_by_its_methods() -> None:
    cls = vars(sys.modules[__name__])["_SampleClass"]
    assert sorted(Reader().tiers(cls)) == ["process"]


def test_this_module_is_fast(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker(FAST) is not None


async def test_the_guard_refuses_every_way_of_starting_a_process() -> None:
    # Called by name: read as calls, they would put this test in the process tier.
    def call(module: Any, name: str, *args: Any) -> Any:
        return getattr(module, name)(*args)

    before = subprocess.Popen._execute_child  # type: ignore[attr-defined]
    with forbid_processes("the test"):
        with pytest.raises(ProcessInFastTest, match="the test is in the fast tier"):
            call(subprocess, "run", ["true"])
        with pytest.raises(ProcessInFastTest):
            await call(asyncio, "create_subprocess_exec", "true")
        with pytest.raises(ProcessInFastTest):
            call(os, "system", "true")
        with pytest.raises(ProcessInFastTest):
            call(os, "fork")
    assert subprocess.Popen._execute_child is before  # type: ignore[attr-defined]
