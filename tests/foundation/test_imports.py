"""Each entry point and package imports on its own, in a fresh interpreter: an import
cycle that only bites in one order (``workers`` importing ``live.hub`` first) fails here
instead of in production."""

from __future__ import annotations

import subprocess
import sys

import pytest

MODULES = [
    "ductor_streams.cli",
    "ductor_streams.serve",
    "ductor_streams.worker_process",
    "ductor_streams.workers",
    "ductor_streams.dev",
    "ductor_streams.config",
    "ductor_streams.live",
    "ductor_streams.live.hub",
    "ductor_streams.live.followers",
    "ductor_streams.store",
    "ductor_streams.store.db",
    "ductor_streams.http",
    "ductor_streams.http.connection_guard",
    "ductor_streams.plugin",
    "ductor_streams.plugin.workflow",
    "ductor_streams.client",
    "ductor_streams.activities",
    "ductor_streams.delivery.service",
    "ductor_streams.maintenance",
    "ductor_streams.ops",
    "ductor_streams.schema.migrate",
    "ductor_streams.temporal_connection",
]


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_alone(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
