"""schemathesis with every check (`st run --checks all`) against the real server: the
coverage, fuzzing and stateful phases, the stateful one following the document's links
(create a stream, append, read, ack, close; prepare, upload, commit an object). It must
report no failure and no error. The run is bounded (``MAX_EXAMPLES`` per operation, a
fixed seed) so that it takes well under a minute on a quiet machine.

Server-Sent Events (``/subscribe``) are left out: an open stream never ends, so a
response would only end at the request timeout; tests/live covers them.
The run's settings that are not command-line flags are in ``schemathesis.toml`` here,
each with its reason.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ductor_streams.auth import SCOPES, issue_token
from tests.conftest import JWT_SECRET

CONFIG = Path(__file__).with_name("schemathesis.toml")
REPO = Path(__file__).resolve().parents[2]
MAX_EXAMPLES = 20
SEED = 21
# The operations the stateful phase must reach with a 2xx, through the links.
STATEFUL_STEPS = {
    ("POST", "/api/workflow-streams/runs/{run_id}/streams"),
    ("POST", "/api/workflow-streams/runs/{run_id}/streams/{stream_id}/records"),
    ("GET", "/api/workflow-streams/runs/{run_id}/streams/{stream_id}/records"),
    ("POST", "/api/workflow-streams/runs/{run_id}/streams/{stream_id}/consumers/{consumer_id}/ack"),
    ("POST", "/api/workflow-streams/runs/{run_id}/streams/{stream_id}/close"),
}

pytestmark = pytest.mark.timeout(300)


def _stateful_successes(ndjson: Path) -> Counter[tuple[str, str]]:
    """(method, path template) -> 2xx answers in the stateful phase's scenarios."""
    reached: Counter[tuple[str, str]] = Counter()
    for line in ndjson.read_text(encoding="utf-8").splitlines():
        event = json.loads(line)
        finished = event.get("ScenarioFinished")
        if not finished or finished.get("phase") != "stateful":
            continue
        recorder = finished.get("recorder", {})
        for case_id, case in recorder.get("cases", {}).items():
            response = recorder.get("interactions", {}).get(case_id, {}).get("response") or {}
            if 200 <= int(response.get("status_code") or 0) < 300:
                reached[(case["value"]["method"], case["value"]["path"])] += 1
    return reached


def _run(command: list[str], tmp_path: Path, report: Path) -> tuple[dict[str, Any], str, int]:
    # In the temporary folder: schemathesis keeps a cache of its own in the working folder.
    run = subprocess.run(
        [*command, "--report-dir", str(report)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    output = run.stdout[-20000:] + run.stderr[-5000:]
    [summary_file] = report.glob("json-*.json")
    return json.loads(summary_file.read_text(encoding="utf-8")), output, run.returncode


def test_schemathesis_with_every_check_reports_nothing(server: Any, tmp_path: Path) -> None:
    token = issue_token(
        JWT_SECRET,
        sub="fuzzer",
        tenant=f"t-st-{secrets.token_hex(4)}",
        scopes=list(SCOPES),
        runs=["*"],
    )
    command = [
        sys.executable,
        "-m",
        "tests.security.st_cli",  # `st`, with a CPython 3.11 bug worked around
        "--config-file",
        str(CONFIG),
        "run",
        f"{server.url}/schema/openapi.json",
        "--checks",
        "all",
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        str(SEED),
        "--header",
        f"Authorization: Bearer {token}",
        "--exclude-path-regex",
        "/subscribe$",
        "--workers",
        "2",
        "--generation-database",
        "none",
        "--request-timeout",
        "30",
        "--no-color",
        "--report",
        "json,ndjson",
    ]
    report = tmp_path / "report"
    summary, output, returncode = _run(command, tmp_path, report)
    assert summary["complete"], output
    assert summary["failures"] == [] and summary["errors"] == [], output
    assert summary["test_cases"]["with_failures"] == 0, output
    assert {p: summary["phases"][p]["status"] for p in ("coverage", "fuzzing", "stateful")} == {
        "coverage": "success",
        "fuzzing": "success",
        "stateful": "success",
    }, output
    assert summary["operations"]["tested"] >= 19, output
    assert returncode == 0, output
    [events] = report.glob("ndjson-*.ndjson")
    reached = _stateful_successes(events)
    missing = STATEFUL_STEPS - set(reached)
    assert not missing, f"the stateful phase never got a 2xx from {sorted(missing)}: {reached}"
