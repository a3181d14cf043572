"""The images that the pytest-xdist workers of one test run share, and their builds.

On a fresh machine the builds (two Debian bases made with mmdebstrap, the app image,
the compose file's Postgres and Temporal images) take minutes. Waiting for them in the
deploy tests' fixtures would hold a worker, and every other worker that needs an image
too, doing nothing all that time. So the first worker to finish collecting, when the
run has tests that use the images, starts the builds in one process of their own
(``start_prebuild``) that goes on beside the rest of the suite; the deploy tests run
last (tests/conftest.py) and, by then, find them built (``wait_built``). The
controller stops a build still running and removes the run's app image once every
worker is done (``remove_run_image``).

Run as ``python -m tests.support.run_image RUN_ID [stack]``: that builder process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
# The compose file's Postgres and Temporal images: content fixed by deploy/ and uv.lock,
# so one tag per machine (rebuilt from the layer cache in seconds).
POSTGRES_IMAGE = "localhost/ductor-streams-postgres:latest"
TEMPORAL_IMAGE = "localhost/ductor-streams-temporal:latest"
# What the builder builds, in order: the app image (every image test needs it), then
# what only the compose test needs.
APP, STACK = "app", "stack"


def run_image(run: str) -> str:
    """The app image the workers of test run ``run`` (pytest-xdist's run id) share."""
    return f"localhost/ductor-streams:test-{run[:12]}"


def run_lock(run: str) -> Path:
    """The lock file under which one worker of test run ``run`` builds its image."""
    return Path(tempfile.gettempdir()) / f"ductor-streams-image-{run[:12]}.lock"


def build_dir(run: str) -> Path:
    """The builder's folder: its pid, log and one ``<step>.status`` per finished step."""
    return Path(tempfile.gettempdir()) / f"ductor-streams-images-{run[:12]}"


def start_prebuild(run: str, env: Mapping[str, str], *, stack: bool) -> bool:
    """Start the builder process for test run ``run`` unless another worker has; True
    when one runs for this run. ``env`` is the container engine's environment."""
    folder = build_dir(run)
    folder.mkdir(exist_ok=True)
    with (folder / "start.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / "pid").exists():
            return True
        with (folder / "build.log").open("wb") as log:
            builder = subprocess.Popen(
                [sys.executable, "-m", "tests.support.run_image", run, *([STACK] if stack else [])],
                cwd=REPO,
                env={**env, "PYTHONPATH": str(REPO)},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own process group: the controller stops the whole build at the end.
                start_new_session=True,
            )
        (folder / "pid").write_text(str(builder.pid))
    return True


def wait_built(run: str, step: str, timeout: float = 1200) -> bool:
    """Wait for the builder's ``step``; False when no builder was started for this run
    (the caller builds). Fails with the build's log when the step failed or the
    builder is gone without finishing it."""
    folder = build_dir(run)
    pid_file = folder / "pid"
    if not pid_file.exists():
        return False
    pid = int(pid_file.read_text())
    status = folder / f"{step}.status"
    deadline = time.monotonic() + timeout
    while not status.exists():
        if not _alive(pid) and not status.exists():
            raise AssertionError(f"the image builder exited before {step}:\n{_log_tail(folder)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"the image builder's {step} took over {timeout:.0f} s")
        time.sleep(0.5)
    code = int(status.read_text())
    if code != 0:
        raise AssertionError(f"the image builder's {step} exited {code}:\n{_log_tail(folder)}")
    return True


def remove_run_image(run: str) -> None:
    """After every worker of test run ``run`` is done: stop its builder if it still
    runs, remove its shared image, lock file and build folder, if a worker made them."""
    folder = build_dir(run)
    pid_file = folder / "pid"
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(pid_file.read_text()), signal.SIGTERM)
    lock = run_lock(run)
    if lock.exists() or pid_file.exists():
        for tool in ("podman", "docker"):
            if shutil.which(tool):
                subprocess.run(
                    [tool, "rmi", "-f", run_image(run)],
                    capture_output=True,
                    timeout=120,
                    check=False,
                )
    lock.unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        # Our own child (a worker that started it) lingers as a zombie: reap it then.
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        if reaped == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _log_tail(folder: Path) -> str:
    log = folder / "build.log"
    return log.read_text(errors="replace")[-4000:] if log.exists() else "(no log)"


def _build(run: str, steps: Sequence[str]) -> int:
    """The builder: each step's deploy script, then its status file (the exit code)."""
    folder = build_dir(run)
    scripts = {
        APP: ("build-image.sh", {"IMAGE": run_image(run)}),
        STACK: (
            "build-stack.sh",
            {"SKIP_APP": "1", "POSTGRES_IMAGE": POSTGRES_IMAGE, "TEMPORAL_IMAGE": TEMPORAL_IMAGE},
        ),
    }
    for step in steps:
        script, extra = scripts[step]
        started = time.monotonic()
        code = subprocess.run(
            [str(DEPLOY / script)], env={**os.environ, **extra}, cwd=REPO, check=False
        ).returncode
        print(f"deploy/{script}: exit {code} after {time.monotonic() - started:.1f} s", flush=True)
        partial = folder / f"{step}.status.part"
        partial.write_text(str(code))
        partial.rename(folder / f"{step}.status")  # whole or absent for the waiting test
        if code != 0:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(_build(sys.argv[1], [APP, *sys.argv[2:]]))
