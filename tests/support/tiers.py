"""Test tiers: what a test needs beyond the in-process app and Postgres.

Every test gets one or more tier markers at collection (tests/conftest.py): ``fast``
when it starts no process, otherwise the kinds of process it starts. The tier is read
from the code, so a new test lands in the right one without a hand-written marker:
the test function, every fixture it uses, and every function or class of this test
tree they name (followed through), are searched for the calls that start a process.
A marker written by hand on a test, class or module adds its tier to what is found.

What the reading misses, the guard catches: while a ``fast`` test runs, starting a
process fails it (``forbid_processes``), naming the marker it needs.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import subprocess
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

# The tiers, as registered in pyproject.toml's pytest markers; ``fast`` is the absence
# of every other one.
FAST = "fast"
TIERS: dict[str, str] = {
    "server": "a ductor-streams server or worker subprocess (uvicorn)",
    "temporal": "a Temporal dev server",
    "browser": "chromium, node or npm",
    "image": "podman: image builds and containers",
    "cluster": "Postgres instances of its own, pg_auto_failover, PgBouncer or nginx",
    "process": "any other subprocess (the CLI, scripts, tools)",
}

# The packages whose functions are followed: the tests' own and the benchmarks' (some
# tests drive a benchmark's scenario). The product's are not: that the app starts
# workers of its own is marked by hand where a test makes it.
ROOTS = ("tests", "bench")

# Names that start a process wherever they are called from.
_SPAWNING_NAMES = {
    "create_subprocess_exec": "process",
    "create_subprocess_shell": "process",
    "start_local": "temporal",
    "start_time_skipping": "temporal",
}
# subprocess's and os's functions that start one (``subprocess.PIPE`` and the like
# do not).
_SUBPROCESS_CALLS = {"Popen", "run", "call", "check_call", "check_output", "getoutput"}
_OS_CALLS = {"fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "spawnv"}

# The test tree's own process starters, by qualified name, each with its tier (more
# precise than the ``process`` their subprocess calls would give).
_STARTERS = {
    "tests.support.server.ServerProcess": "server",
    "tests.support.browser.launched_chromium": "browser",
    "tests.deploy.engine.Engine": "image",
    "tests.deploy.engine.find_engine": "image",
    "tests.support.pg_cluster.AutoFailoverCluster": "cluster",
    "tests.support.pgbouncer.PgBouncer": "cluster",
    "tests.support.load_balancer.NginxBalancer": "cluster",
    "tests.support.cluster.PrivateCluster": "cluster",
    "tests.support.temporal_tls.NginxGrpcTls": "cluster",
    # The product's own: the append body's decode hands large bodies to worker
    # processes (http/append_worker.py).
    "ductor_streams.http.codecs.append_worker.encode_in_worker": "process",
    "ductor_streams.http.codecs.append_body.decode_append_body": "process",
}
# The session's Postgres: the one process every tier may start.
_ALLOWED = {
    "tests.support.postgres.start_test_database",
    "tests.support.postgres.TestDatabase",
}


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """A code object and every one nested in it (inner functions, lambdas, classes)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


class Reader:
    """Reads the tiers of functions and classes, remembering each answer."""

    def __init__(self, roots: tuple[str, ...] = ROOTS) -> None:
        self.roots = roots
        self._known: dict[int, frozenset[str]] = {}

    def _ours(self, obj: Any) -> bool:
        return self._ours_name(getattr(obj, "__module__", None) or "")

    def _ours_name(self, module: str) -> bool:
        return any(module == root or module.startswith(root + ".") for root in self.roots)

    def tiers(self, obj: Any) -> frozenset[str]:
        """The tiers of one function, fixture function or class of the test tree."""
        obj = inspect.unwrap(obj) if callable(obj) else obj
        key = id(obj)
        if key in self._known:
            return self._known[key]
        self._known[key] = frozenset()  # a cycle adds nothing
        name = _qualname(obj)
        if name in _ALLOWED:
            found: frozenset[str] = frozenset()
        elif name in _STARTERS:
            found = frozenset({_STARTERS[name]})
        elif inspect.isclass(obj):
            found = frozenset().union(
                *(self.tiers(member) for member in _class_functions(obj) if self._ours(member))
            )
        else:
            found = self._function_tiers(obj)
        self._known[key] = found
        return found

    def _function_tiers(self, func: Any) -> frozenset[str]:
        code = getattr(func, "__code__", None)
        if code is None:
            return frozenset()
        scope: dict[str, Any] = getattr(func, "__globals__", {})
        found: set[str] = set()
        for inner in _codes(code):
            names = set(inner.co_names)
            found.update(_SPAWNING_NAMES[n] for n in names & _SPAWNING_NAMES.keys())
            # ``from tests.x import y`` inside the function (y is read from tests.x), and
            # ``x.y`` with x one of our modules in scope.
            imported = [m for n in names if self._ours_name(n) and (m := _module(n))]
            imported += [
                v
                for n in names
                if isinstance(v := scope.get(n), types.ModuleType) and self._ours_name(v.__name__)
            ]
            for name in names:
                value = scope.get(name)
                if value is None:
                    value = next((vars(m)[name] for m in imported if name in vars(m)), None)
                if value is subprocess and names & _SUBPROCESS_CALLS:
                    found.add("process")
                elif value is os and names & _OS_CALLS:
                    found.add("process")
                elif _is_spawner(value):
                    found.add("process")
                elif _qualname(value) in _STARTERS:
                    found.add(_STARTERS[_qualname(value)])
                elif value is not None and self._ours(value):
                    found.update(self.tiers(value))
        return frozenset(found)


def _module(name: str) -> types.ModuleType | None:
    """The module of that dotted name (imported when it is not yet), or None."""
    try:
        return sys.modules.get(name) or importlib.import_module(name)
    except ImportError:
        return None


def _class_functions(cls: type) -> Iterable[Any]:
    for value in vars(cls).values():
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, property):
            value = value.fget
        if inspect.isfunction(value):
            yield value


def _is_spawner(value: Any) -> bool:
    """``from subprocess import run`` and the like: the function itself in scope."""
    if value is None or isinstance(value, types.ModuleType):
        return False
    for module, names in ((subprocess, _SUBPROCESS_CALLS), (os, _OS_CALLS)):
        if any(value is getattr(module, name, None) for name in names):
            return True
    return False


# Forbidding processes while a fast test runs: every way Python starts one.
_ENTRY_POINTS: tuple[tuple[Any, str], ...] = (
    (subprocess.Popen, "_execute_child"),
    (os, "fork"),
    (os, "forkpty"),
    (os, "system"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "execv"),
    (os, "execve"),
)


class ProcessInFastTest(AssertionError):
    """A test in the ``fast`` tier started a process."""


@contextlib.contextmanager
def forbid_processes(test: str) -> Iterator[None]:
    """While this runs, starting a process raises ``ProcessInFastTest``."""

    def refuse(what: str) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            raise ProcessInFastTest(
                f"{test} is in the fast tier but started a process ({what}): give it "
                f"the marker of what it starts ({', '.join(TIERS)}; pyproject.toml)"
            )

        return refused

    import _posixsubprocess  # multiprocessing's spawn calls it directly

    saved: list[tuple[Any, str, Any]] = []
    points = (*_ENTRY_POINTS, (_posixsubprocess, "fork_exec"))
    try:
        for owner, name in points:
            if hasattr(owner, name):
                saved.append((owner, name, getattr(owner, name)))
                setattr(owner, name, refuse(f"{getattr(owner, '__name__', owner)}.{name}"))
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
