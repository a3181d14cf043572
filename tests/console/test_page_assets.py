"""The console's page and scripts as served: the same strict CSP as /ops, and scripts that
never write markup from strings nor keep the token anywhere but sessionStorage."""

from __future__ import annotations

import re
from typing import Any

from tests.conftest import API

PAGE = f"{API}/ops"
STRICT = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


async def test_page_and_scripts_are_served_under_the_strict_csp(client: Any) -> None:
    page = await client.get(PAGE)
    assert page.status_code == 200
    assert page.headers["content-security-policy"] == STRICT
    assert 'src="ops/static/console.js"' in page.text
    # No inline script or style anywhere in the page.
    assert not re.search(r"<script(?![^>]*\bsrc=)", page.text)
    assert " style=" not in page.text and "<style" not in page.text
    for name in ("ops.js", "console.js"):
        js = await client.get(f"{PAGE}/static/{name}")
        assert js.status_code == 200, name
        assert js.headers["content-type"].startswith("text/javascript")
        assert js.headers["content-security-policy"] == STRICT
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in js.text, (name, sink)
        assert "localStorage" not in js.text and "document.cookie" not in js.text
