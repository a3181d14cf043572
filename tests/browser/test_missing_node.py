"""Without node or npm the Durable Streams client page cannot be bundled: its test skips
with a message saying why, except under CI (``CI=true``), where it fails."""

from __future__ import annotations

import shutil

import pytest

from tests.browser import test_pages_from_another_origin as pages


@pytest.mark.parametrize("tool", ["node", "npm"])
def test_a_missing_tool_skips_with_a_message(tool: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == tool else real(name))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=f"{tool} is not on the PATH"):
        pages.installed_packages()


@pytest.mark.parametrize("tool", ["node", "npm"])
def test_a_missing_tool_fails_under_ci(tool: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == tool else real(name))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=f"{tool} is not on the PATH"):
        pages.installed_packages()
