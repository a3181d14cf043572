"""Each entry point and package imports on its own, into an interpreter that holds none
of the package (tests/support/import_probe.py): an import cycle that only bites in one
order (``workers`` importing ``live.hub`` first) fails here instead of in production.
The command's own entry (``python -m ductor_streams``) runs in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.conftest import repo_root

MODULES = [
    "ductor_streams.process.cli",
    "ductor_streams.process.serve",
    "ductor_streams.process.workers",
    "ductor_streams.process.services",
    "ductor_streams.process.dev",
    "ductor_streams.config",
    "ductor_streams.live",
    "ductor_streams.live.hub",
    "ductor_streams.live.followers",
    "ductor_streams.store",
    "ductor_streams.store.db",
    "ductor_streams.http",
    "ductor_streams.compat.uvicorn_protocol",
    "ductor_streams.plugin",
    "ductor_streams.plugin.workflow",
    "ductor_streams.client",
    "ductor_streams.activities",
    "ductor_streams.process.dispatcher",
    "ductor_streams.maintenance",
    "ductor_streams.ops",
    "ductor_streams.schema.migrate",
    "ductor_streams.temporal_connection",
    "ductor_streams.runtime",
    "ductor_streams",
    "ductor_streams.__main__",
    "ductor_streams.foundation.metrics",
    "ductor_streams.foundation.tracing",
    "ductor_streams.compat.asyncio_tasks",
    "ductor_streams.compat.litestar",
    "ductor_streams.compat.uvicorn_server",
    "ductor_streams.objects.deletions",
    "ductor_streams.http.codecs.append_child",
    "ductor_streams.http.fronts.ds.front",
    "ductor_streams.process.doctor",
    "ductor_streams.plugin.activity",
    "ductor_streams.plugin.streaming",
]


@pytest.fixture(scope="module")
def probe() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.import_probe"],
        cwd=repo_root(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        assert process.stdin is not None
        process.stdin.close()
        assert process.wait(timeout=60) == 0


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_alone(probe: subprocess.Popen[str], module: str) -> None:
    assert probe.stdin is not None and probe.stdout is not None
    probe.stdin.write(module + "\n")
    probe.stdin.flush()
    answer = json.loads(probe.stdout.readline())
    assert answer["module"] == module
    assert answer["error"] == "", answer["error"][-2000:]


def test_the_workflow_helpers_load_no_database_driver() -> None:
    """Workflow code imports plugin.workflow (and through it the activities' models and
    error types) in Temporal's sandbox: none of that may load asyncpg or the store."""
    probe = (
        "import sys\n"
        "import ductor_streams.plugin.workflow, ductor_streams.activities\n"
        "from ductor_streams.activities import error_types, models\n"
        "import ductor_streams.foundation.signals\n"
        "loaded = sorted(m for m in sys.modules if m == 'asyncpg' or m.startswith(("
        "'asyncpg.', 'ductor_streams.store', 'ductor_streams.live')))\n"
        "print(','.join(loaded))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "", f"loaded in the sandbox's reach: {done.stdout}"


def test_the_activities_package_still_gives_its_activities() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from ductor_streams.activities import StreamsActivities, domain_errors, "
            "to_application_error; print(StreamsActivities.__name__)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == "StreamsActivities", done.stderr


def test_the_package_names_what_apps_use_and_loads_it_on_first_use() -> None:
    probe = (
        "import sys, ductor_streams\n"
        "print(len([m for m in sys.modules if m.startswith('ductor_streams.')]))\n"
        "from ductor_streams import Settings, StreamsClient, StreamsPlugin, issue_token\n"
        "print(sorted(ductor_streams.__all__))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "0",
        "['Settings', 'StreamsClient', 'StreamsPlugin', '__version__', 'issue_token']",
    ]


def test_python_dash_m_runs_the_command() -> None:
    command = [sys.executable, "-m", "ductor_streams", "--help"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: ductor-streams ")
