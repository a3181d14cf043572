"""The console (the /ops page's streams views) in a real headless browser against a
real ``serve``: the streams list and its filters, a stream's definition, credit bars and
consumers, the live tail (in order, and resuming across a restart of ``serve`` without a
gap or a duplicate), payloads as text only, redaction by token, close and legal hold, the
410 answer and keyboard reach.

Screenshots of each view go to the test's tmp folder, or to ``DUCTOR_STREAMS_SCREENSHOTS``
when that names a folder (to look at them)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from playwright.async_api import expect

from ductor_streams.maintenance.retention import prune_stream
from tests.conftest import API
from tests.ops.test_page_browser import _screenshot_dir
from tests.support.server import ServerProcess

PAGE = f"{API}/ops"
READ = ["streams:read"]
ADMIN = ["streams:read", "streams:admin"]


def _raw(headers: dict[str, str]) -> str:
    return headers["Authorization"].removeprefix("Bearer ")


async def _define(http: httpx.AsyncClient, admin: dict[str, str], run: str, **body: Any) -> None:
    body.setdefault("direction", "output")
    r = await http.post(f"{API}/runs/{run}/streams", json=body, headers=admin)
    assert r.status_code == 201, r.text


async def _append(
    http: httpx.AsyncClient, admin: dict[str, str], run: str, stream: str, payloads: list[Any]
) -> None:
    r = await http.post(
        f"{API}/runs/{run}/streams/{stream}/records",
        json={"records": [{"payload": p} for p in payloads]},
        headers=admin,
    )
    assert r.status_code == 201, r.text


class Console:
    """One browser page on the console, signed in with a token."""

    def __init__(self, page: Any, base: str, shots: Path) -> None:
        self.page = page
        self.base = base
        self.shots = shots
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        page.on("dialog", self._dialog)

    async def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        await dialog.dismiss()

    async def sign_in(self, token: str, fragment: str = "") -> None:
        await self.page.goto(f"{self.base}{PAGE}{fragment}")
        await self.page.wait_for_selector("#login-form", state="visible")
        await self.page.fill("#token", token)
        await self.page.click("#login-form button[type=submit]")

    async def open_stream(self, run: str, stream: str) -> None:
        await self.page.evaluate(f"location.hash = {f'#stream/{run}/{stream}'!r}")
        await expect(self.page.locator("#sv-title")).to_have_text(f"{run} / {stream}")

    async def shot(self, name: str) -> None:
        await self.page.screenshot(path=str(self.shots / f"console-{name}.png"), full_page=True)


@pytest.fixture
async def console(browser: Any, server: Any, tmp_path: Path) -> AsyncIterator[Console]:
    page = await browser.new_page(viewport={"width": 1400, "height": 1000})
    view = Console(page, server.url, _screenshot_dir(tmp_path))
    yield view
    assert view.errors == []
    await page.close()


async def _listed(page: Any, *expected: tuple[str, str]) -> None:
    """Wait until the list shows exactly ``expected``, in that order."""
    rows = page.locator("#streams tbody tr[data-run]")
    await expect(rows).to_have_count(len(expected))
    for i, (run, stream) in enumerate(expected):
        await expect(rows.nth(i)).to_have_attribute("data-stream", stream)
        await expect(rows.nth(i)).to_have_attribute("data-run", run)
    assert await _rows(page) == list(expected)


async def _rows(page: Any) -> list[tuple[str, str]]:
    rows = page.locator("#streams tbody tr[data-run]")
    return [
        (await r.get_attribute("data-run"), await r.get_attribute("data-stream"))
        for r in await rows.all()
    ]


async def test_list_shows_the_streams_and_filters_narrow_it(
    console: Console, server: Any, auth: Any, tenant: str
) -> None:
    admin = auth(tenant=tenant)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        await _define(http, admin, "job-a", stream_id="out", credit={"max_unread_items": 5})
        await _define(http, admin, "job-a", stream_id="done", consumers=["ui"])
        await _define(http, admin, "job-b", stream_id="in", direction="input")
        await _append(http, admin, "job-a", "done", [{"n": 1}, {"n": 2}])
        r = await http.post(f"{API}/runs/job-a/streams/done/close", headers=admin)
        assert r.status_code == 200
    page = console.page
    await console.sign_in(_raw(auth(tenant=tenant, scopes=READ)))
    # A token without streams:ops starts on the streams list.
    await _listed(page, ("job-a", "done"), ("job-b", "in"), ("job-a", "out"))
    assert await page.is_hidden("#console")
    done = page.locator('#streams tr[data-stream="done"] td')
    texts = await done.all_inner_texts()
    assert texts[:8] == [
        "job-a",
        "done",
        "output",
        "2",
        "2 / 1000",
        "14 B / 16.0 MiB",
        "closed",
        "",
    ]
    assert texts[8].endswith("ago")
    out = await page.locator('#streams tr[data-stream="out"] td').all_inner_texts()
    assert out[3:5] == ["0", "0 / 5"] and out[8] == "never"
    await console.shot("1-streams")

    await page.fill("#s-run", "job-a")
    await page.click("#s-filters button[type=submit]")
    await _listed(page, ("job-a", "done"), ("job-a", "out"))
    await page.select_option("#s-closed", "false")
    await page.click("#s-filters button[type=submit]")
    await _listed(page, ("job-a", "out"))
    await page.fill("#s-run", "")
    await page.select_option("#s-closed", "")
    await page.select_option("#s-direction", "input")
    await page.click("#s-filters button[type=submit]")
    await _listed(page, ("job-b", "in"))
    await console.shot("2-streams-filtered")

    # Open a stream from the list. Its deliveries are for streams:ops tokens (the
    # keyboard test follows that link).
    await page.click('#streams tr[data-stream="in"] a.open')
    await expect(page.locator("#sv-title")).to_have_text("job-b / in")
    await expect(page.locator('#sv-state dd[data-field="closed"]')).to_have_text("no")
    assert await page.is_hidden("#sv-deliveries")
    assert "#stream/job-b/in" in page.url and "ey" not in page.url  # no token in the URL


async def test_stream_view_shows_definition_credit_and_consumers_with_lag(
    console: Console, server: Any, auth: Any, tenant: str
) -> None:
    admin = auth(tenant=tenant, sub="agent")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        await _define(
            http,
            admin,
            "job-c",
            stream_id="chat",
            consumers=["ui", "audit"],
            credit={"max_unread_items": 10, "max_unread_bytes": 4096, "max_total_items": 8},
            retention={"max_age_seconds": 7200},
            redaction={"json_pointers": ["/user/email"]},
            authorization={"readers": ["*"], "writers": ["agent"]},
        )
        await _append(http, admin, "job-c", "chat", [{"n": i} for i in range(4)])
        for consumer, sequence in (("ui", 3), ("audit", 1)):
            r = await http.post(
                f"{API}/runs/job-c/streams/chat/consumers/{consumer}/ack",
                json={"sequence": sequence},
                headers=admin,
            )
            assert r.status_code == 200, r.text
        state = (await http.get(f"{API}/runs/job-c/streams/chat", headers=admin)).json()["state"]
    page = console.page
    await console.sign_in(_raw(auth(tenant=tenant, scopes=READ)), "#stream/job-c/chat")
    await expect(page.locator("#sv-title")).to_have_text("job-c / chat")
    await expect(page.locator("#sv-consumers tbody tr[data-consumer]")).to_have_count(2)
    consumers = await page.locator("#sv-consumers tbody tr").all_inner_texts()
    assert [c.split("\t") for c in consumers] == [["audit", "1", "3"], ["ui", "3", "1"]]

    unread = state["unread_bytes"]  # what audit (acked 1) has not read
    bars = {
        "unread-items": ("3", "10", "3 / 10"),
        "unread-bytes": (str(unread), "4096", f"{unread} B / 4.0 KiB"),
        "total-items": ("4", "8", "4 / 8"),
        "total-bytes": (str(state["total_bytes"]), "", f"{state['total_bytes']} B (no ceiling)"),
    }
    for name, (value, ceiling, text) in bars.items():
        bar = page.locator(f"#sv-credit .bar-{name}")
        assert await bar.get_attribute("data-value") == value, name
        assert await bar.get_attribute("data-max") == ceiling, name
        assert await bar.locator(".bar-text").text_content() == text
    width = await page.locator("#sv-credit .bar-total-items .fill").evaluate("e => e.style.width")
    assert width == "50%"

    definition = page.locator("#sv-definition")
    expected = {
        "max age": "2h 0m",
        "redacted fields": "/user/email",
        "readers": "*",
        "writers": "agent",
        "consumers": "ui, audit",
        "max unread items": "10",
        "client egress regions": "local",
        "metadata home": "local",
    }
    for name, text in expected.items():
        assert await definition.locator(f'dd[data-def="{name}"]').text_content() == text, name
    assert await page.locator('#sv-state dd[data-field="latest sequence"]').text_content() == "4"
    # No admin scope: no action buttons.
    assert await page.locator("#sv-actions button").count() == 0
    await console.shot("3-stream")


async def test_payload_markup_is_text_and_redaction_follows_the_token(
    console: Console, server: Any, auth: Any, tenant: str
) -> None:
    admin = auth(tenant=tenant)
    attack = "<img src=x onerror=alert(1)>"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        await _define(http, admin, "job-x", stream_id="x", redaction={"json_pointers": ["/card"]})
        await _append(http, admin, "job-x", "x", [{"text": attack, "card": "4111-1111"}])
    page = console.page
    await console.sign_in(_raw(auth(tenant=tenant, scopes=READ)), "#stream/job-x/x")
    cell = page.locator('#records tr[data-seq="1"] pre.payload-text')
    await expect(cell).to_contain_text(attack)
    text = await cell.text_content()
    assert '"[REDACTED]"' in text and "4111" not in text
    assert await page.locator("img").count() == 0
    assert console.dialogs == []
    assert "4111" not in await page.content()
    await console.shot("4-records-redacted")

    await page.click("#forget")
    await console.sign_in(
        _raw(auth(tenant=tenant, scopes=[*READ, "streams:read_unredacted"])), "#stream/job-x/x"
    )
    await expect(cell).to_contain_text("4111-1111")
    assert "[REDACTED]" not in await cell.text_content()
    assert await page.locator("img").count() == 0 and console.dialogs == []
    await console.shot("5-records-unredacted")


async def test_pruned_history_is_shown_as_such(
    console: Console, server: Any, auth: Any, tenant: str, pool: asyncpg.Pool
) -> None:
    admin = auth(tenant=tenant)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        await _define(http, admin, "job-p", stream_id="p", retention={"max_records": 2})
        await _append(http, admin, "job-p", "p", [{"n": i} for i in range(5)])
    pk = await pool.fetchval(
        "SELECT stream_pk FROM workflow_streams.streams WHERE tenant = $1 AND run_id = 'job-p'",
        tenant,
    )
    assert (await prune_stream(pool, pk))[0] == 3
    page = console.page
    await console.sign_in(_raw(auth(tenant=tenant, scopes=READ)), "#stream/job-p/p")
    notice = page.locator("#r-notice .pruned")
    await expect(notice).to_have_text("History before 4 was pruned; start from 4.")
    await console.shot("6-pruned")
    await page.click("#r-start-earliest")
    await expect(page.locator("#records tbody tr[data-seq]")).to_have_count(2)
    assert await page.locator("#records tbody tr[data-seq]").first.get_attribute("data-seq") == "4"
    assert await page.is_hidden("#r-notice")


async def test_close_and_legal_hold_from_the_page(
    console: Console, server: Any, auth: Any, tenant: str
) -> None:
    admin = auth(tenant=tenant)
    url = f"{API}/runs/job-h/streams/h"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        await _define(http, admin, "job-h", stream_id="h")
        page = console.page
        await console.sign_in(_raw(auth(tenant=tenant, scopes=ADMIN)), "#stream/job-h/h")
        await expect(page.locator("#act-hold-set")).to_be_visible()

        await page.click("#act-hold-set")
        await expect(page.locator("#confirm")).to_have_attribute("open", "")
        await page.fill("#confirm-reason", "litigation 42")
        await console.shot("7-confirm-hold")
        await page.click("#confirm-ok")
        await expect(page.locator("#act-hold-clear")).to_be_visible()
        state = (await http.get(url, headers=admin)).json()["state"]
        assert (state["legal_hold"], state["legal_hold_reason"]) == (True, "litigation 42")
        legal = page.locator('#sv-state dd[data-field="legal hold"]')
        assert await legal.text_content() == "on: litigation 42"

        # Cancel changes nothing.
        await page.click("#act-hold-clear")
        await page.click("#confirm-cancel")
        assert (await http.get(url, headers=admin)).json()["state"]["legal_hold"] is True
        await page.click("#act-hold-clear")
        await page.click("#confirm-ok")
        await expect(page.locator("#act-hold-set")).to_be_visible()
        assert (await http.get(url, headers=admin)).json()["state"]["legal_hold"] is False

        await page.click("#act-close")
        await page.click("#confirm-ok")
        await expect(page.locator("#sv-badges")).to_contain_text("closed")
        assert await page.locator("#act-close").count() == 0
        assert (await http.get(url, headers=admin)).json()["state"]["closed"] is True
        await console.shot("8-closed")

        # A read-only token gets no buttons, and the server would refuse it anyway.
        await page.click("#forget")
        await console.sign_in(_raw(auth(tenant=tenant, scopes=READ)), "#stream/job-h/h")
        await expect(page.locator('#sv-state dd[data-field="closed"]')).to_have_text("yes")
        assert await page.locator("#sv-actions button").count() == 0
        r = await http.put(
            f"{url}/legal-hold",
            json={"enabled": True},
            headers=auth(tenant=tenant, scopes=READ),
        )
        assert r.status_code == 403


async def test_a_refusal_shows_the_problem_text(
    console: Console, server: Any, auth: Any, tenant: str, pool: asyncpg.Pool
) -> None:
    """The stream goes away between showing the button and confirming: the dialog shows
    the server's problem (its detail and code) and stays open."""
    admin = auth(tenant=tenant)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        await _define(http, admin, "job-r", stream_id="r")
    page = console.page
    await console.sign_in(_raw(auth(tenant=tenant, scopes=ADMIN)), "#stream/job-r/r")
    await expect(page.locator("#act-hold-set")).to_be_visible()
    await pool.execute(
        "DELETE FROM workflow_streams.streams WHERE tenant = $1 AND run_id = 'job-r'", tenant
    )
    await page.click("#act-hold-set")
    await page.fill("#confirm-reason", "audit")
    await page.click("#confirm-ok")
    error = page.locator("#confirm-error")
    await expect(error).to_be_visible()
    text = await error.text_content() or ""
    assert text.startswith("Refused: Not found: stream") and text.endswith("[not_found].")
    assert await page.get_attribute("#confirm", "open") == ""
    await console.shot("9-refused")


async def test_keyboard_reaches_every_action(
    console: Console, server: Any, auth: Any, tenant: str
) -> None:
    admin = auth(tenant=tenant)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        await _define(http, admin, "job-k", stream_id="k", direction="input")
        await _append(http, admin, "job-k", "k", [{"n": i} for i in range(3)])
    page = console.page
    scopes = [*ADMIN, "streams:ops"]
    await console.sign_in(_raw(auth(tenant=tenant, scopes=scopes)), "#streams")
    await expect(page.locator('#streams tr[data-stream="k"] a.open')).to_be_visible()

    async def reached(limit: int = 80) -> set[str]:
        seen: set[str] = set()
        await page.evaluate("document.activeElement && document.activeElement.blur()")
        for _ in range(limit):
            await page.keyboard.press("Tab")
            name = await page.evaluate(
                "(() => { const e = document.activeElement;"
                " return e.id || (e.className + ':' + e.textContent.trim()); })()"
            )
            seen.add(name)
        return seen

    listed = await reached()
    for wanted in (
        "nav-streams",
        "nav-deliveries",
        "forget",
        "s-run",
        "s-direction",
        "s-closed",
        "open:k",
    ):
        assert wanted in listed, (wanted, listed)
    # Open the stream with the keyboard.
    await page.focus('#streams tr[data-stream="k"] a.open')
    await page.keyboard.press("Enter")
    await expect(page.locator("#sv-title")).to_have_text("job-k / k")
    await expect(page.locator("#act-close")).to_be_visible()
    viewed = await reached(120)
    for wanted in (
        "act-close",
        "act-hold-set",
        "sv-deliveries-link",
        "tail-toggle",
        "tail-clear",
        "r-cursor",
        "r-limit",
    ):
        assert wanted in viewed, (wanted, viewed)
    # An action opens its confirmation from the keyboard, and Escape leaves it.
    await page.focus("#act-hold-set")
    await page.keyboard.press("Enter")
    await expect(page.locator("#confirm")).to_have_attribute("open", "")
    assert await page.evaluate("document.activeElement.id") == "confirm-reason"
    await page.keyboard.press("Escape")
    await expect(page.locator("#confirm")).not_to_have_attribute("open", "")
    # The deliveries of the input stream, in the /ops view, filtered to it.
    await page.focus("#sv-deliveries-link")
    await page.keyboard.press("Enter")
    await expect(page.locator("#deliveries tbody tr[data-delivery-id]")).to_have_count(3)
    assert await page.input_value("#f-run") == "job-k"
    await console.shot("10-deliveries-of-stream")


async def _tail_sequences(page: Any) -> list[int]:
    cells = await page.locator("#tail tbody tr[data-seq]").evaluate_all(
        "rows => rows.map(r => Number(r.dataset.seq))"
    )
    return list(cells)


async def test_live_tail_in_order_and_resumes_across_a_restart(
    browser: Any, server: Any, settings: Any, auth: Any, tenant: str, tmp_path: Path
) -> None:
    """The page is served by its own ``serve``; records appended through the shared one
    while the page's server is down arrive after it comes back, with no gap or duplicate."""
    admin = auth(tenant=tenant)
    own = ServerProcess(settings, log_path=tmp_path / "own.log").start()
    page = await browser.new_page(viewport={"width": 1400, "height": 1000})
    view = Console(page, own.url, _screenshot_dir(tmp_path))
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            await _define(http, admin, "job-t", stream_id="t")
            await _append(http, admin, "job-t", "t", [{"n": 0}])
            await view.sign_in(_raw(auth(tenant=tenant, scopes=READ)), "#stream/job-t/t")
            await expect(page.locator('#sv-state dd[data-field="latest sequence"]')).to_have_text(
                "1"
            )
            await page.click("#tail-toggle")
            await expect(page.locator("#tail-state")).to_have_attribute("data-state", "live")
            for n in range(1, 4):
                # Each record shows before the next is appended: live, in order.
                await _append(http, admin, "job-t", "t", [{"n": n}])
                await expect(page.locator(f'#tail tr[data-seq="{n + 1}"]')).to_be_visible(
                    timeout=10_000
                )
                assert await _tail_sequences(page) == list(range(2, n + 2))
            assert await _tail_sequences(page) == [2, 3, 4]
            await view.shot("11-tail-live")

            own.kill()  # the SSE connection dies with the server, no goodbye
            await expect(page.locator("#tail-state")).to_have_attribute(
                "data-state", "down", timeout=10_000
            )
            await _append(http, admin, "job-t", "t", [{"n": 4}, {"n": 5}])
            await view.shot("12-tail-down")
            own.start()
            await expect(page.locator('#tail tr[data-seq="6"]')).to_be_visible(timeout=15_000)
            await expect(page.locator("#tail-state")).to_have_attribute("data-state", "live")
            await _append(http, admin, "job-t", "t", [{"n": 6}])
            await expect(page.locator('#tail tr[data-seq="7"]')).to_be_visible(timeout=1000)
            assert await _tail_sequences(page) == [2, 3, 4, 5, 6, 7]
            assert "resumed after" in (await page.text_content("#tail-state") or "")

            # Pause, append, resume: the records in between come once.
            await page.click("#tail-toggle")
            await expect(page.locator("#tail-state")).to_have_attribute("data-state", "paused")
            await _append(http, admin, "job-t", "t", [{"n": 7}])
            await asyncio.sleep(0)  # nothing to wait for: paused shows nothing new
            assert await _tail_sequences(page) == [2, 3, 4, 5, 6, 7]
            await page.click("#tail-toggle")
            await expect(page.locator('#tail tr[data-seq="8"]')).to_be_visible(timeout=5000)
            assert await _tail_sequences(page) == [2, 3, 4, 5, 6, 7, 8]
            # The state follows the tail, and the outage's error is gone.
            await expect(page.locator('#sv-state dd[data-field="latest sequence"]')).to_have_text(
                "8"
            )
            await expect(page.locator("#error")).to_be_hidden()
            points = await page.get_attribute("#tail-spark polyline", "points")
            assert points and len(points.split(" ")) == 60
            await view.shot("13-tail-resumed")
        assert view.errors == []
    finally:
        await page.close()
        own.stop()


async def test_an_object_record_opens_its_content_with_the_token(
    console: Console, server: Any, auth: Any, tenant: str
) -> None:
    admin = auth(tenant=tenant)
    data = b"report bytes \x00\x01"
    base = f"{API}/runs/job-o/streams/o"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        await _define(http, admin, "job-o", stream_id="o")
        r = await http.post(
            f"{base}/objects",
            json={
                "idempotency_key": "report-1",
                "sha256": hashlib.sha256(data).hexdigest(),
                "size": len(data),
                "content_type": "application/pdf",
            },
            headers=admin,
        )
        assert r.status_code == 201, r.text
        object_id = r.json()["object_id"]
        r = await http.put(
            f"{base}/objects/{object_id}/content",
            content=data,
            headers={**admin, "Content-Type": "application/octet-stream"},
        )
        assert r.status_code == 200, r.text
        r = await http.post(f"{base}/objects/{object_id}/commit", headers=admin)
        assert r.status_code == 201, r.text
    page = console.page
    await console.sign_in(_raw(auth(tenant=tenant, scopes=READ)), "#stream/job-o/o")
    button = page.locator('#records tr[data-seq="1"] button.object-link')
    await expect(button).to_have_text(f"Open object (application/pdf, {len(data)} B)")
    async with page.expect_download() as info:
        await button.click()
    download = await info.value
    saved = await download.path()
    assert await asyncio.to_thread(Path(saved).read_bytes) == data
    assert download.suggested_filename.startswith(object_id)
    await console.shot("14-object-record")
