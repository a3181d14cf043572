"""The compose smoke test (deploy/compose.yaml): the whole stack comes up with one
command; an append through replica A reaches an SSE subscriber on replica B; an input
record reaches a running EchoWorkflow (the examples' worker as a service) and its echo
comes back; everything is torn down, network and volumes included.

podman-compose (Debian's 1.0.3) where podman is the engine, `docker compose` with docker.
The published ports are on 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client

from ductor_streams.auth import SCOPES, issue_token
from tests.conftest import repo_root
from tests.deploy.engine import Engine
from tests.deploy.helpers import free_port

pytestmark = pytest.mark.timeout(900)

COMPOSE_FILE = repo_root() / "deploy" / "compose.yaml"
JWT_SECRET = "compose-test-" + "k" * 24
TASK_QUEUE = "ductor-streams-examples"


class Stack:
    """One `up` of the compose file under a project name of its own."""

    def __init__(self, engine: Engine, images: dict[str, str], workdir: Path) -> None:
        self.engine = engine
        self.project = f"dstest{secrets.token_hex(3)}"
        self.ports = {"SERVE_A_PORT": free_port(), "SERVE_B_PORT": free_port()}
        self.ports["TEMPORAL_PORT"] = free_port()
        self.env = {
            **engine.env,
            **images,
            **{k: str(v) for k, v in self.ports.items()},
            "JWT_SECRET": JWT_SECRET,
        }
        self.log = workdir / "compose.log"

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        if self.engine.name == "podman":
            tool = shutil.which("podman-compose")
            assert tool, (
                "podman is installed but podman-compose is not (apt-get install podman-compose)"
            )
            command = [tool, "-f", str(COMPOSE_FILE), "-p", self.project, *args]
        else:
            command = ["docker", "compose", "-f", str(COMPOSE_FILE), "-p", self.project, *args]
        proc = subprocess.run(
            command, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        with self.log.open("a") as log:
            log.write(f"$ {' '.join(command)}\n{proc.stdout}\n{proc.stderr}\n")
        return proc

    def containers(self, service: str | None = None) -> list[str]:
        args = ["ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={self.project}"]
        if service:
            args += ["--filter", f"label=com.docker.compose.service={service}"]
        return self.engine.run(*args).stdout.split()

    def logs(self) -> str:
        out = []
        for container in self.containers():
            proc = self.engine.run("logs", "--tail", "30", container, check=False)
            out.append(f"--- {container}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        return "\n".join(out)

    def down(self) -> list[str]:
        """`down -v`, then whatever it left (podman-compose 1.0.3 leaves the network,
        and a container restarting at that moment may outlive it); what remains after."""
        # Anonymous volumes (an image's VOLUME that no named volume covers) outlive
        # `down -v` in podman-compose; note them before their containers go.
        anonymous = []
        for container in self.containers():
            mounts = self.engine.run(
                "inspect", "--format", "{{range .Mounts}}{{.Name}} {{end}}", container, check=False
            )
            anonymous += [m for m in mounts.stdout.split() if len(m) == 64]
        self.compose("down", "-v", timeout=180)
        for container in self.containers():
            self.engine.run("rm", "-f", "-v", container, check=False)
        label = f"label=com.docker.compose.project={self.project}"
        for volume in self.engine.run("volume", "ls", "-q", "--filter", label).stdout.split():
            self.engine.run("volume", "rm", "-f", volume, check=False)
        for volume in ("pgdata", "objects", "temporal"):
            self.engine.run("volume", "rm", "-f", f"{self.project}_{volume}", check=False)
        for volume in anonymous:
            self.engine.run("volume", "rm", "-f", volume, check=False)
        self.engine.run("network", "rm", "-f", f"{self.project}_default", check=False)
        left = self.containers()
        networks = self.engine.run("network", "ls", "--format", "{{.Name}}").stdout.split()
        left += [n for n in networks if n.startswith(self.project)]
        volumes = self.engine.run("volume", "ls", "--format", "{{.Name}}").stdout.split()
        left += [v for v in volumes if v.startswith(self.project) or v in anonymous]
        return left


@pytest.fixture
def stack(engine: Engine, stack_images: dict[str, str], tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(engine, stack_images, tmp_path)
    try:
        yield stack
    finally:
        left = stack.down()
        assert not left, f"left behind after down: {left}"


def test_compose_stack(stack: Stack) -> None:
    started = time.monotonic()
    up = stack.compose("up", "-d")
    assert up.returncode == 0, f"{up.stdout[-3000:]}{up.stderr[-3000:]}"
    up_took = time.monotonic() - started
    try:
        migrated = wait_migrated(stack)
        a = f"http://127.0.0.1:{stack.ports['SERVE_A_PORT']}"
        b = f"http://127.0.0.1:{stack.ports['SERVE_B_PORT']}"
        for url in (a, b):
            wait_ready(url)
        ready_took = time.monotonic() - started
        followed = append_on_a_follow_on_b(a, b)
        echoed = asyncio.run(echo_through_workflow(stack, a, b))
    except BaseException:
        print(stack.logs())
        raise
    print(
        f"compose up {up_took:.1f} s, migrate: {migrated}, both replicas ready "
        f"{ready_took:.1f} s after up; SSE on B got {followed}; echo: {echoed}"
    )


def wait_migrated(stack: Stack) -> str:
    """The one-shot migrate service exited 0 (podman-compose does not wait for it)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ids = stack.containers("migrate")
        if ids:
            state = stack.engine.run(
                "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", ids[0]
            ).stdout.split()
            if state[0] == "exited":
                logs = stack.engine.run("logs", ids[0], check=False)
                assert state[1] == "0", f"migrate exited {state[1]}: {logs.stdout}{logs.stderr}"
                return logs.stdout.strip().splitlines()[-1]
        time.sleep(0.5)
    raise AssertionError("migrate did not finish within 120 s")


def wait_ready(url: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise AssertionError(f"{url}/readyz never answered 200")


def headers() -> dict[str, str]:
    token = issue_token(JWT_SECRET, sub="smoke", tenant="default", scopes=list(SCOPES), runs=["*"])
    return {"Authorization": f"Bearer {token}"}


def streams_url(base: str, run: str) -> str:
    return f"{base}/api/workflow-streams/runs/{run}/streams"


def append_on_a_follow_on_b(a: str, b: str) -> str:
    """A subscriber on B (from cursor 0) gets every record appended through A, in order:
    two before it subscribed (its backfill) and three while it follows (live, through
    Postgres NOTIFY between the replicas)."""
    run = f"smoke-{secrets.token_hex(3)}"
    created = httpx.post(
        streams_url(a, run), headers=headers(), json={"stream_id": "out", "direction": "output"}
    )
    assert created.status_code == 201, created.text

    def append(n: int) -> None:
        answer = httpx.post(
            f"{streams_url(a, run)}/out/records",
            headers=headers(),
            json={"records": [{"payload": {"n": n}}]},
        )
        assert answer.status_code in (200, 201), answer.text

    append(1)
    append(2)
    got: list[tuple[str, object]] = []
    subscribed = threading.Event()

    def follow() -> None:
        url = f"{streams_url(b, run)}/out/subscribe?cursor=0"
        with httpx.stream("GET", url, headers=headers(), timeout=30) as response:
            assert response.status_code == 200, response.read()
            subscribed.set()
            event_id = None
            for line in response.iter_lines():
                if line.startswith("id:"):
                    event_id = line[3:].strip()
                elif line.startswith("data:") and event_id is not None:
                    got.append((event_id, json.loads(line[5:])))
                    event_id = None
                if len(got) == 5:
                    return

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    assert subscribed.wait(30), "the subscription on B did not start"
    time.sleep(0.3)  # its backfill has been read: what follows comes live
    for n in (3, 4, 5):
        append(n)
    reader.join(30)
    assert [event_id for event_id, _ in got] == ["1", "2", "3", "4", "5"], got
    return f"{len(got)} records in order"


async def echo_through_workflow(stack: Stack, a: str, b: str) -> str:
    """Start EchoWorkflow (served by the example-worker service), send it two input
    records through A, read its echo on B. The `workers` service delivers the input."""
    client = await Client.connect(f"127.0.0.1:{stack.ports['TEMPORAL_PORT']}")
    run = f"echo-{secrets.token_hex(3)}"
    started = time.monotonic()
    handle = await client.start_workflow("EchoWorkflow", id=run, task_queue=TASK_QUEUE)
    async with httpx.AsyncClient(headers=headers(), timeout=10) as http:
        deadline = time.monotonic() + 60
        while (await http.get(f"{streams_url(a, run)}/input")).status_code != 200:
            assert time.monotonic() < deadline, "EchoWorkflow never created its input stream"
            await asyncio.sleep(0.2)
        sent = time.monotonic()
        for payload in ("hello", {"done": True}):
            answer = await http.post(
                f"{streams_url(a, run)}/input/records", json={"records": [{"payload": payload}]}
            )
            assert answer.status_code in (200, 201), answer.text
        echoed = await asyncio.wait_for(handle.result(), 60)
        done = time.monotonic()
        assert echoed == 1
        page = (await http.get(f"{streams_url(b, run)}/output/records?cursor=0")).json()
    payloads = [record["payload"] for record in page["records"]]
    assert payloads == [{"echo": "hello"}], page
    return (
        f"workflow started to input stream {sent - started:.2f} s, input to result "
        f"{done - sent:.2f} s"
    )
