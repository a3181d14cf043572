"""Fixtures of the browser tests: the real Temporal dev server and its client, as in
tests/temporal."""

from __future__ import annotations

from tests.temporal.conftest import (  # noqa: F401
    plugin,
    temporal_address,
    temporal_env,
    wf_client,
    wf_settings,
)
