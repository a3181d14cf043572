"""The /ops page in a real headless browser (Debian's chromium, driven by Playwright with
no browser download) against a real server subprocess: the page loads, asks for a token,
shows a dead delivery with its error, and its retry button moves it back to pending.

A screenshot of each step is written to the test's tmp folder, or to
``DUCTOR_STREAMS_SCREENSHOTS`` when that names a folder (to look at it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from playwright.async_api import expect

from ductor_streams.schema import QUERIES
from tests.ops.helpers import OPS, append, delivery_ids, input_stream, mark_dead, mark_delivered
from tests.support.browser import launched_chromium


def _screenshot_dir(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("DUCTOR_STREAMS_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
async def browser() -> Any:
    async with launched_chromium() as browser:
        yield browser


async def test_page_shows_a_dead_delivery_and_retry_moves_it_to_pending(
    browser: Any, server: Any, auth: Any, tenant: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    admin = auth(tenant=tenant)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        await input_stream(http, admin, "run-page", redaction={"json_pointers": ["/card"]})
        await input_stream(http, admin, "run-ok")
        await append(http, admin, "run-page", [{"card": "4111-1111", "text": "hello"}, {"n": 2}])
        await append(http, admin, "run-ok", [{"n": 3}])
    dead = await delivery_ids(pool, tenant, "run-page", "in")
    await mark_dead(pool, dead, "workflow 'run-page' has completed")
    await mark_delivered(pool, await delivery_ids(pool, tenant, "run-ok", "in"))
    stream_pk = await pool.fetchval(
        "SELECT stream_pk FROM workflow_streams.streams WHERE tenant = $1 AND run_id = 'run-ok'",
        tenant,
    )
    await pool.execute(QUERIES["gap_evidence_insert"], stream_pk, 4, 7, 3, "replica-b")
    token = auth(tenant=tenant, scopes=["streams:ops"], sub="oncall-ana")
    token = token["Authorization"].removeprefix("Bearer ")
    shots = _screenshot_dir(tmp_path)

    page = await browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)

    await page.goto(f"{server.url}{OPS}")
    await page.wait_for_selector("#login-form", state="visible")
    assert await page.is_hidden("#console")
    await page.screenshot(path=str(shots / "ops-1-login.png"))

    await page.fill("#token", token)
    await page.click("#login-form button[type=submit]")
    row = f'#deliveries tr[data-delivery-id="{dead[0]}"]'
    await page.wait_for_selector(f'{row}[data-state="dead"]', timeout=15_000)
    assert await page.text_content(f"{row} .error-text") == "workflow 'run-page' has completed"
    assert await page.text_content("#who") == f"oncall-ana · tenant {tenant}"
    assert await page.text_content(".count-dead .count-value") == "2"
    assert await page.text_content(".count-delivered .count-value") == "1"
    lag_rows = await page.locator("#lag tbody tr").all_inner_texts()
    assert len(lag_rows) == 1 and "run-page" in lag_rows[0]
    gap_rows = await page.locator("#gaps tbody tr").all_inner_texts()
    assert len(gap_rows) == 1
    assert gap_rows[0].split("\t")[1:7] == ["run-ok", "in", "4", "7", "3", "replica-b"]
    # The token never leaves the tab's session storage, and no payload is on the page.
    assert await page.evaluate("document.cookie") == ""
    assert "4111" not in await page.content() and "hello" not in await page.content()
    await page.screenshot(path=str(shots / "ops-2-dead.png"), full_page=True)

    # Details: the payload stays hidden for a token without streams:read.
    await page.click(f"{row} button.details")
    await page.wait_for_selector("#detail[open]")
    assert (await page.text_content("#detail-payload")) == (
        "Not shown: the token lacks streams:read."
    )
    await page.screenshot(path=str(shots / "ops-3-detail.png"))
    await page.click("#detail button[type=submit]")

    await page.click(f"{row} button.retry")
    await page.wait_for_selector(f'{row}[data-state="pending"]', timeout=15_000)
    assert await page.locator(f"{row} button.retry").count() == 0
    state = await pool.fetchrow(
        "SELECT state, retried_by, retried_at FROM workflow_streams.input_deliveries "
        "WHERE delivery_id = $1",
        dead[0],
    )
    assert (state["state"], state["retried_by"]) == ("pending", "oncall-ana")
    assert state["retried_at"] is not None
    other = f'#deliveries tr[data-delivery-id="{dead[1]}"]'
    assert await page.get_attribute(other, "data-state") == "dead"
    # the next poll shows the new counts (no reload)
    await expect(page.locator(".count-dead .count-value")).to_have_text("1", timeout=15_000)
    await page.screenshot(path=str(shots / "ops-4-retried.png"), full_page=True)

    # The dead filter now lists only the other one.
    await page.select_option("#f-state", "dead")
    await page.click("#filters button[type=submit]")
    listed = page.locator("#deliveries tbody tr[data-delivery-id]")
    await expect(listed).to_have_count(1, timeout=15_000)
    assert await listed.get_attribute("data-delivery-id") == str(dead[1])
    assert errors == []

    # Forgetting the token empties the page.
    await page.click("#forget")
    await page.wait_for_selector("#login-form", state="visible")
    assert await page.evaluate("sessionStorage.length") == 0
    await page.close()
