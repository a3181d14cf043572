"""`ductor-streams dev` from nothing: embedded Postgres, Temporal dev server, app,
workers and the example worker; the printed token and session work; SIGTERM stops it
all."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client

from tests.support.server import free_port
from tests.temporal.polling import eventually


def start_dev(port: int, data_dir: Path, out: Path) -> subprocess.Popen[bytes]:
    """`dev` with none of the DUCTOR_STREAMS_* settings: it must start everything."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUCTOR_STREAMS_")}
    args = [sys.executable, "-m", "ductor_streams.process.cli", "dev", "--port", str(port)]
    args += ["--data-dir", str(data_dir)]
    with open(out, "wb") as log:
        return subprocess.Popen(
            args,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


@pytest.mark.timeout(180)
async def test_dev_runs_the_echo_session_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    data_dir = tmp_path / "dev"
    out = tmp_path / "dev.out"
    process = start_dev(port, data_dir, out)
    try:

        async def printed() -> str:
            assert process.poll() is None, out.read_text()
            return out.read_text(errors="replace")

        text = await eventually(printed, lambda t: "Ctrl-C stops" in t, timeout=90, what="dev up")
        token = re.search(r"Authorization: Bearer (\S+)'", text)
        temporal = re.search(r"Temporal  (\S+)", text)
        assert token and temporal, text
        assert f"export API=http://127.0.0.1:{port}/api/workflow-streams" in text
        assert "--task-queue ductor-streams-examples --type EchoWorkflow" in text

        api = f"http://127.0.0.1:{port}/api/workflow-streams/runs/echo-dev/streams"
        headers = {"Authorization": f"Bearer {token.group(1)}"}
        client = await Client.connect(temporal.group(1))
        handle = await client.start_workflow(
            "EchoWorkflow", id="echo-dev", task_queue="ductor-streams-examples", result_type=int
        )
        async with httpx.AsyncClient(headers=headers, timeout=10) as http:
            await eventually(
                lambda: http.get(f"{api}/input"), lambda r: r.status_code == 200, what="input"
            )
            posted = await http.post(
                f"{api}/input/records",
                json={
                    "records": [
                        {"payload": "hello"},
                        {"payload": {"n": 2}},
                        {"payload": {"done": True}},
                    ]
                },
            )
            assert posted.status_code == 201, posted.text
            assert await asyncio.wait_for(handle.result(), 60) == 2
            page = (await http.get(f"{api}/output/records")).json()
        assert [r["payload"] for r in page["records"]] == [{"echo": "hello"}, {"echo": {"n": 2}}]
        assert page["closed"] is True
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            rc = process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    assert rc == 0
    # Postgres and Temporal went down with it.
    pidfile = data_dir / "pg" / "postmaster.pid"

    async def postgres_up() -> bool:
        return pidfile.exists()

    await eventually(postgres_up, lambda up: not up, timeout=10, what="postgres stopped")
