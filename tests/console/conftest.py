"""The console's browser tests: Debian's chromium driven by Playwright (no browser
download), as the /ops page's test does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.browser import launched_chromium


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    async with launched_chromium() as browser:
        yield browser
