"""The console's browser tests: Debian's chromium driven by Playwright (no browser
download), as the /ops page's test does."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.ops.test_page_browser import CHROMIUM, LAUNCH_ARGS


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium")
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield browser
        finally:
            await browser.close()
