"""Imports each of the package's modules on its own, cheaply: one process loads the
third-party libraries the package builds on (and none of the package), then forks a
child per module, which imports it into an interpreter that holds none of the package.

A fresh interpreter per module costs a second of CPU each, nearly all of it loading
Litestar, Temporal, pydantic and the like, which an import order inside the package
cannot change. What the test is about, that a module of ours imports whatever of ours
was imported before it, is kept: each child starts with no module of ours loaded.

Run as ``python -m tests.support.import_probe``: it reads module names, one a line, and
answers each with one JSON line, ``{"module": ..., "error": "" or the traceback}``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import traceback

# The libraries the package's modules start from. Only what the package itself imports
# by name: preloading a submodule it never imports could hide a missing import.
PRELOAD = (
    "asyncpg",
    "httpx",
    "jwt",
    "litestar",
    "msgspec",
    "prometheus_client",
    "pydantic",
    "temporalio.client",
    "temporalio.worker",
    "temporalio.workflow",
    "uvicorn",
)


def _import_in_child(module: str) -> str:
    """The traceback of importing ``module`` in a forked child, or ''."""
    with tempfile.TemporaryFile() as report:
        pid = os.fork()
        if pid == 0:  # the child: import, report, and leave without running atexit
            code = 0
            try:
                importlib.import_module(module)
            except BaseException:
                report.write(traceback.format_exc().encode())
                report.flush()
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        report.seek(0)
        error = report.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0 and not error:
        error = f"the child exited with status {os.waitstatus_to_exitcode(status)}"
    return error


def main() -> None:
    loaded = [name for name in sys.modules if name.startswith("ductor_streams")]
    assert not loaded, loaded
    for name in PRELOAD:
        importlib.import_module(name)
    for line in sys.stdin:
        module = line.strip()
        if module:
            print(json.dumps({"module": module, "error": _import_in_child(module)}), flush=True)


if __name__ == "__main__":
    main()
