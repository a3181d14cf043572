"""The app image that the pytest-xdist workers of one test run share (built by the
first deploy test that needs it, tests/deploy/conftest.py), and its removal by the
controller once every worker is done (tests/conftest.py)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path


def run_image(run: str) -> str:
    """The app image the workers of test run ``run`` (pytest-xdist's run id) share."""
    return f"localhost/ductor-streams:test-{run[:12]}"


def run_lock(run: str) -> Path:
    """The lock file under which one worker of test run ``run`` builds its image."""
    return Path(tempfile.gettempdir()) / f"ductor-streams-image-{run[:12]}.lock"


def remove_run_image(run: str) -> None:
    """After every worker of test run ``run`` is done: its shared image and lock file,
    if a worker made them."""
    lock = run_lock(run)
    if not lock.exists():
        return
    for tool in ("podman", "docker"):
        if shutil.which(tool):
            subprocess.run(
                [tool, "rmi", "-f", run_image(run)], capture_output=True, timeout=120, check=False
            )
    lock.unlink(missing_ok=True)
