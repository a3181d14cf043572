"""The production tests that need Temporal (tests/production/test_replicas_behind_proxy.py)
reuse the Temporal side's fixtures: one real dev server for the session, a client with
the StreamsPlugin, strict-sandbox workers."""

from tests.temporal.conftest import (  # noqa: F401
    make_worker,
    plugin,
    task_queue,
    temporal_address,
    temporal_env,
    wf_client,
    wf_settings,
)
