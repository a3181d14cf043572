"""Garbage-collection tuning (ductor_streams/runtime/gc_tuning.py): start-up objects frozen out
of collection and full collections ten times rarer, once per process, in ``serve`` and
in a worker with the StreamsPlugin (unless ``tune_gc=False``); each collection's pause
on /metrics. Each check runs in a process of its own: tuning is process-wide."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ductor_streams.config import Settings
from tests.conftest import repo_root
from tests.support.server import settings_env
from tests.temporal.polling import eventually


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 60) -> Any:
    """Run ``code`` in a fresh interpreter; its last line of output, as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=repo_root(),
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_tuning_freezes_start_up_objects_once_and_makes_full_collections_rarer() -> None:
    result = run_python(
        """
        import gc, json
        from ductor_streams.foundation import metrics
        from ductor_streams.runtime import gc_tuning
        before = (gc.get_freeze_count(), gc.get_threshold())
        first = gc_tuning.tune_garbage_collection()
        frozen, thresholds = gc.get_freeze_count(), gc.get_threshold()
        second = gc_tuning.tune_garbage_collection()
        again = gc.get_freeze_count()
        gc.collect(2)
        text = metrics.render().decode()
        print(json.dumps({"before": before, "first": first, "second": second,
                          "frozen": frozen, "again": again, "thresholds": thresholds,
                          "tuned": gc_tuning.tuned(), "metrics": text}))
        """
    )
    frozen_before, defaults = result["before"]  # CPython's own thresholds, untouched
    assert frozen_before == 0
    assert result["first"] is True and result["second"] is False and result["tuned"] is True
    assert result["frozen"] > 10_000  # the package's imports, at least
    assert result["again"] == result["frozen"]  # the second call froze nothing more
    assert result["thresholds"] == [defaults[0], defaults[1], 100]
    found = samples(result["metrics"])
    assert found[("ductor_streams_gc_frozen_objects", ())] == result["frozen"]
    # The forced full collection was observed, as one pause of generation 2.
    assert found[("ductor_streams_gc_pause_seconds_count", (("generation", "2"),))] == 1


def test_an_untuned_process_reports_nothing_frozen_and_no_pauses() -> None:
    result = run_python(
        """
        import gc, json
        from ductor_streams.foundation import metrics
        defaults = gc.get_threshold()
        gc.collect(2)
        print(json.dumps({"metrics": metrics.render().decode(), "defaults": defaults,
                          "thresholds": gc.get_threshold()}))
        """
    )
    found = samples(result["metrics"])
    assert found[("ductor_streams_gc_frozen_objects", ())] == 0
    assert ("ductor_streams_gc_pause_seconds_count", (("generation", "2"),)) not in found
    assert result["thresholds"] == result["defaults"]


async def test_serve_tunes_its_collector_once_started(server: Any) -> None:
    young = ("ductor_streams_gc_pause_seconds_count", (("generation", "0"),))
    async with httpx.AsyncClient(base_url=server.url) as http:

        async def scrape() -> dict[Any, float]:
            return samples((await http.get("/metrics")).text)

        # Each scrape allocates: soon one of them triggers a collection, observed.
        found = await eventually(scrape, lambda f: f.get(young, 0) >= 1, what="a pause")
    # serve's start-up (Litestar, asyncpg, uvicorn, the package) is far above this.
    assert found[("ductor_streams_gc_frozen_objects", ())] > 50_000


WORKER = """
    import asyncio, gc, json, os, uuid
    from temporalio.worker import Worker
    from ductor_streams import temporal_connection
    from ductor_streams.activities import StreamsActivities
    from ductor_streams.config import Settings
    from ductor_streams.plugin import StreamsPlugin

    async def main():
        defaults = gc.get_threshold()
        settings = Settings.from_env()
        tune = os.environ["TEST_TUNE_GC"] == "1"
        client = await temporal_connection.connect(
            settings, plugins=[StreamsPlugin(settings, tune_gc=tune)])
        worker = Worker(client, task_queue=f"gc-{uuid.uuid4().hex[:8]}",
                        activities=[], workflows=[])
        task = asyncio.create_task(worker.run())
        # Started: the plugin's runtime is open (StreamsActivities.current() is set).
        for _ in range(600):
            try:
                StreamsActivities.current().runtime
                break
            except RuntimeError:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)
        result = {"frozen": gc.get_freeze_count(), "thresholds": gc.get_threshold(),
                  "defaults": defaults}
        await worker.shutdown()
        await task
        print(json.dumps(result))

    asyncio.run(main())
    """


def test_a_worker_with_the_plugin_tunes_its_process(
    wf_settings: Settings,
) -> None:
    env = {**settings_env(wf_settings), "TEST_TUNE_GC": "1"}
    result = run_python(WORKER, env)
    assert result["frozen"] > 50_000
    defaults = result["defaults"]
    assert result["thresholds"] == [defaults[0], defaults[1], 100]


def test_tune_gc_false_leaves_the_workers_collector_alone(wf_settings: Settings) -> None:
    env = {**settings_env(wf_settings), "TEST_TUNE_GC": "0"}
    result = run_python(WORKER, env)
    assert result["frozen"] == 0
    assert result["thresholds"] == result["defaults"]
