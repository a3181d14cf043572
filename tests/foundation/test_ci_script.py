""".ci/run is what CI executes: it must at least be a valid bash script (an edit once
left it with an unterminated backquote, so CI would have stopped before ``make test``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

CI_RUN = Path(__file__).resolve().parents[2] / ".ci" / "run"


def test_ci_run_parses_and_ends_with_the_readme_test_command() -> None:
    checked = subprocess.run(["bash", "-n", str(CI_RUN)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    commands = [
        line.strip()
        for line in CI_RUN.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert commands[-1] == "make test"
    assert commands.count("make test") == 1
