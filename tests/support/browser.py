"""Debian's chromium driven by Playwright, for every browser test (the /ops page, the
console, pages on another origin): one launch, never a browser download."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

CHROMIUM = os.environ.get("DUCTOR_STREAMS_CHROMIUM", "/usr/bin/chromium")
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@asynccontextmanager
async def launched_chromium() -> AsyncIterator[Any]:
    """A headless chromium (``executable_path``), closed on exit. A missing chromium fails
    the test rather than skip it unseen."""
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium")
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield browser
        finally:
            await browser.close()
