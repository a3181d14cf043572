"""Where the deploy tests find uv: $UV, then the one `make install` sets up, then PATH."""

from __future__ import annotations

import os
import shutil

from tests.conftest import repo_root


def uv_binary() -> str:
    candidates = [
        os.environ.get("UV"),
        str(repo_root() / ".tools" / "bin" / "uv"),
        shutil.which("uv"),
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise AssertionError("uv is missing: `make install` sets it up in .tools/")
