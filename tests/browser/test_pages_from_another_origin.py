"""Pages on another origin, in a real headless browser, against a running workflow
(examples/workflows/echo.py): each follows the run's output stream with a bearer token,
must show the records appended during the test in order, and appends to the run's input
stream, which the workflow receives and echoes.

- page/native.html: plain ``fetch`` on the native API, with the fetch-based SSE reader
  the README shows (EventSource cannot send a token); the same page from an origin the
  server does not list gets nothing.
- page/index.html + page/app.js: the official Durable Streams JS client
  (``@durable-streams/client``, pinned in tests/browser/package-lock.json) on the run's
  DS endpoint, bundled at test time with the pinned esbuild, installed with ``npm ci``
  into a cache folder outside the repository keyed by the lockfile's hash
  (``DUCTOR_STREAMS_BROWSER_CACHE``, default ``~/.cache/ductor-streams``). Without node
  or npm that test skips, saying so; with ``CI=true`` it fails instead.

The parts are real: a ``serve`` subprocess with its dispatcher and
``DUCTOR_STREAMS_CORS_ORIGINS`` naming the page's origin, the Temporal dev server, the
example's EchoWorkflow, Debian's chromium driven by Playwright (no browser download),
and a second small HTTP server, on another port (so another origin), serving the page.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import asyncpg
import httpx
import pytest
from playwright.async_api import Page, expect
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from ductor_streams.config import Settings
from ductor_streams.store import Store, StreamKey
from examples.workflows.echo import TASK_QUEUE, EchoWorkflow
from tests.conftest import API, TokenFactory
from tests.support.browser import launched_chromium
from tests.support.server import ServerProcess, free_port
from tests.temporal.conftest import strict_runner
from tests.temporal.polling import eventually
from tests.temporal.support import deliveries

HERE = Path(__file__).resolve().parent
PAGE = HERE / "page"
LOCKFILE = HERE / "package-lock.json"
CACHE_ENV = "DUCTOR_STREAMS_BROWSER_CACHE"


def _missing_tool(what: str) -> None:
    """Skip, saying why; under CI a missing tool is a failure, never a silent skip."""
    message = f"{what} (.ci/run installs Debian's nodejs and npm)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def _cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV, "").strip()
    return Path(configured) if configured else Path.home() / ".cache" / "ductor-streams"


def installed_packages() -> Path:
    """The folder where the lockfile's packages are installed (``npm ci``), once per
    lockfile: its name carries the lockfile's hash, so a changed pin installs anew."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            _missing_tool(
                f"{tool} is not on the PATH: the browser test needs it to bundle its page"
            )
    digest = hashlib.sha256(LOCKFILE.read_bytes()).hexdigest()[:16]
    folder = _cache_root() / f"browser-{digest}"
    done = folder / ".installed"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be installing it
        if not done.exists():
            for name in ("package.json", "package-lock.json"):
                shutil.copyfile(HERE / name, folder / name)
            # --ignore-scripts: esbuild's postinstall only swaps its launcher for the
            # binary of the platform package that npm installs anyway.
            subprocess.run(
                ["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"],
                cwd=folder,
                check=True,
                capture_output=True,
                timeout=300,
            )
            done.write_text(digest)
    return folder


def bundle_page(into: Path) -> Path:
    """The page's folder: index.html and app.js bundled (with the client) as bundle.js."""
    packages = installed_packages()
    into.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PAGE / "index.html", into / "index.html")
    subprocess.run(
        [
            str(packages / "node_modules" / ".bin" / "esbuild"),
            str(PAGE / "app.js"),
            "--bundle",
            "--format=esm",
            "--target=es2020",
            "--log-level=warning",
            f"--outfile={into / 'bundle.js'}",
        ],
        # The entry is in the repository, its packages in the cache: esbuild resolves
        # bare imports through NODE_PATH too.
        env={**os.environ, "NODE_PATH": str(packages / "node_modules")},
        check=True,
        timeout=120,
    )
    return into


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None


@contextlib.contextmanager
def origin_server(folder: Path) -> Iterator[str]:
    """A plain static HTTP server for ``folder`` on a port of its own: the page's origin."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    async with launched_chromium() as browser:
        yield browser


async def shown(page: Page) -> list[Any]:
    return [json.loads(text) for text in await page.locator("#records li").all_text_contents()]


@dataclass
class EchoRun:
    """A running EchoWorkflow, a server that allows ``origin``, and a native client."""

    origin: str
    server_url: str
    http: httpx.AsyncClient
    handle: WorkflowHandle[Any, int]
    native: str  # the run's streams, under the API

    async def send(self, payloads: list[Any]) -> None:
        """Append ``payloads`` to the run's input stream natively (the workflow echoes)."""
        body = {"records": [{"payload": p} for p in payloads]}
        answer = await self.http.post(f"{self.native}/input/records", json=body)
        assert answer.status_code == 201, answer.text


@contextlib.asynccontextmanager
async def echo_run(
    folder: Path,
    wf_client: Client,
    wf_settings: Settings,
    headers: dict[str, str],
    run_id: str,
    log: Path,
    any_origin: bool = False,
) -> AsyncIterator[EchoRun]:
    """The server lists the page's origin, or allows ``*`` with ``any_origin``."""
    native = f"{API}/runs/{run_id}/streams"
    with origin_server(folder) as origin:
        env = {"DUCTOR_STREAMS_CORS_ORIGINS": "*" if any_origin else origin}
        with ServerProcess(wf_settings, workers=True, extra_env=env, log_path=log) as server:
            async with (
                Worker(
                    wf_client,
                    task_queue=TASK_QUEUE,
                    workflows=[EchoWorkflow],
                    workflow_runner=strict_runner(),
                ),
                httpx.AsyncClient(base_url=server.url, headers=headers, timeout=10) as http,
            ):
                handle = await wf_client.start_workflow(
                    "EchoWorkflow", id=run_id, task_queue=TASK_QUEUE, result_type=int
                )
                for stream_id in ("input", "output"):
                    await eventually(
                        lambda s=stream_id: http.get(f"{native}/{s}"),
                        lambda r: r.status_code == 200,
                        what=f"{stream_id} created",
                    )
                yield EchoRun(origin, server.url, http, handle, native)


async def follow_and_send(page: Page, run: EchoRun, url: str) -> list[Any]:
    """Open the page at ``url`` and drive the run: records echoed before it opened and
    while it follows, then one input the page appends itself, then the end. Returns
    what the page showed, once the stream closed."""
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(str(error)))
    await run.send([{"i": 0}, {"i": 1}])  # echoed before the page opens
    await page.goto(url)
    status = page.locator("#status")
    await _shows(page, [{"echo": {"i": 0}}, {"echo": {"i": 1}}])
    await expect(status).to_have_attribute("data-state", "following")
    # Records appended while the page follows, in several appends.
    await run.send([{"i": 2}])
    await run.send([{"i": 3}, {"i": 4}, {"i": 5}])
    await run.send([{"i": 6}])
    expected = [{"echo": {"i": n}} for n in range(7)]
    await _shows(page, expected)
    # The page appends to the input stream; the workflow echoes it.
    await page.evaluate("window.appendInput({from: 'the page'})")
    expected.append({"echo": {"from": "the page"}})
    await _shows(page, expected)
    await run.send([{"done": True}])
    await expect(status).to_have_attribute("data-state", "closed", timeout=30_000)
    assert await asyncio.wait_for(run.handle.result(), 30) == 8
    assert problems == []
    return await shown(page)


async def assert_the_workflow_got_the_page_input(
    store: Store, pool: asyncpg.Pool, tenant: str, run_id: str
) -> None:
    """The page's input is an input record like any other, delivered to the workflow."""
    ref = await store.get_stream(StreamKey(tenant, run_id, "input"))
    rows = await deliveries(pool, ref)
    assert [(r["sequence"], r["state"]) for r in rows] == [(n, "delivered") for n in range(1, 10)]
    page_input = await store.read(ref, 7, 1)
    assert [json.loads(r.payload) for r in page_input.records] == [{"from": "the page"}]


EXPECTED = [*({"echo": {"i": n}} for n in range(7)), {"echo": {"from": "the page"}}]


@pytest.mark.timeout(180)
async def test_a_page_on_another_origin_follows_output_and_sends_input_with_the_ds_client(
    browser: Any,
    wf_client: Client,
    wf_settings: Settings,
    auth: TokenFactory,
    run_id: str,
    store: Store,
    pool: asyncpg.Pool,
    tmp_path: Path,
) -> None:
    folder = bundle_page(tmp_path / "page")
    headers = auth(tenant=wf_settings.tenant, runs=[run_id])
    log = tmp_path / "serve.log"
    async with echo_run(folder, wf_client, wf_settings, headers, run_id, log) as run:
        settings = urlencode(
            {"base": f"{run.server_url}{API}/runs/{run_id}/ds", "token": _token(headers)}
        )
        page = await browser.new_page()
        shown_records = await follow_and_send(page, run, f"{run.origin}/index.html#{settings}")
    assert shown_records == EXPECTED
    await assert_the_workflow_got_the_page_input(store, pool, wf_settings.tenant, run_id)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("setting", ["the origin", "*"])
async def test_a_page_on_another_origin_follows_output_and_sends_input_with_plain_fetch(
    setting: str,
    browser: Any,
    wf_client: Client,
    wf_settings: Settings,
    auth: TokenFactory,
    run_id: str,
    store: Store,
    pool: asyncpg.Pool,
    tmp_path: Path,
) -> None:
    headers = auth(tenant=wf_settings.tenant, runs=[run_id])
    log = tmp_path / "serve.log"
    any_origin = setting == "*"
    async with echo_run(PAGE, wf_client, wf_settings, headers, run_id, log, any_origin) as run:
        settings = urlencode(
            {"api": f"{run.server_url}{API}", "run": run_id, "token": _token(headers)}
        )
        page = await browser.new_page()
        shown_records = await follow_and_send(page, run, f"{run.origin}/native.html#{settings}")
        if not any_origin:
            # The same page from an origin the server does not list: the browser keeps
            # every answer from it (CORS), so it never gets as far as a record.
            other = await browser.new_page()
            unlisted = run.origin.replace("127.0.0.1", "localhost")
            await other.goto(f"{unlisted}/native.html#{settings}")
            await expect(other.locator("#status")).to_have_attribute("data-state", "error")
            assert "Failed to fetch" in await other.locator("#status").inner_text()
            assert await other.locator("#records li").count() == 0
    assert shown_records == EXPECTED
    await assert_the_workflow_got_the_page_input(store, pool, wf_settings.tenant, run_id)


async def _shows(page: Page, expected: list[Any]) -> None:
    """Wait until the page shows exactly ``expected``, in order."""
    await expect(page.locator("#records li")).to_have_count(len(expected), timeout=30_000)
    assert await shown(page) == expected


def _token(headers: dict[str, str]) -> str:
    return headers["Authorization"].removeprefix("Bearer ")
