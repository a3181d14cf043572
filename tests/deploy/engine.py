"""The container engine the deploy tests drive (podman, else docker with a daemon), run
the way deploy/engine.sh runs it, and the image builds they share."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.run_image import DEPLOY, REPO


@dataclass
class Engine:
    name: str  # "podman" or "docker"
    env: dict[str, str]  # the environment the engine and the deploy scripts run with

    def run(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [self.name, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{self.name} {' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}"
            )
        return proc

    def script(self, name: str, env: dict[str, str], timeout: float = 900) -> None:
        """A deploy/ script (a build), with its output kept for the failure message."""
        started = time.monotonic()
        proc = subprocess.run(
            [str(DEPLOY / name)],
            env={**self.env, **env},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise AssertionError(
                f"deploy/{name} exited {proc.returncode}:\n{proc.stdout[-3000:]}"
                f"\n{proc.stderr[-3000:]}"
            )
        print(f"deploy/{name}: {time.monotonic() - started:.1f} s")

    def wait_exit(self, container: str, timeout: float) -> int:
        """The container's exit code once it has stopped (AssertionError after timeout)."""
        proc = self.run("wait", container, timeout=timeout)
        return int(proc.stdout.strip().splitlines()[-1])


def find_engine(build_dir: Path) -> Engine:
    """podman when installed, else docker when its daemon answers; else the test skips,
    naming what is missing. Podman gets the scratch containers.conf of deploy/engine.sh
    (written by the build scripts into ``build_dir``)."""
    engine, missing = usable_engine(build_dir)
    if engine is None:
        pytest.skip(missing)
    return engine


def usable_engine(build_dir: Path) -> tuple[Engine | None, str]:
    """The engine ``find_engine`` gives, or None and what is missing."""
    env = dict(os.environ)
    env["BUILD_DIR"] = str(build_dir)
    # The venv's tools (uv from `make install`) for the scripts.
    uv = REPO / ".tools" / "bin" / "uv"
    if uv.exists():
        env["UV"] = str(uv)
    if shutil.which("podman"):
        env["ENGINE"] = "podman"
        if not env.get("CONTAINERS_CONF"):
            env["CONTAINERS_CONF"] = str(write_containers_conf(build_dir))
        return Engine("podman", env), ""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "info"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            env["ENGINE"] = "docker"
            return Engine("docker", env), ""
        return None, "podman is not installed and docker's daemon does not answer"
    return None, "neither podman nor docker is installed"


def write_containers_conf(build_dir: Path) -> Path:
    """The same scratch file deploy/engine.sh writes (see there for why)."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 20000 if hard == resource.RLIM_INFINITY else min(20000, hard)
    lines = ["[containers]", f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc=4096:4096"]']
    if shutil.which("runc"):
        lines += ["[engine]", 'runtime = "runc"']
    path = build_dir / "containers.conf"
    path.write_text("\n".join(lines) + "\n")
    return path
