"""No general MCP read/append tools (spec: "Ductor does not register general MCP
read/append tools without a separate explicit tool policy and entitlement contract").

There is no tool policy in this build, so nothing may expose stream payloads as MCP
tools: no MCP library is imported, no module names MCP or JSON-RPC tool methods, no
route serves them, no dependency or entry point brings them. Whoever adds a tool policy
must make these tests check that policy instead of deleting them."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from ductor_streams.config import Settings
from tests.security.routes import api_routes

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ductor_streams"
MCP_WORDS = re.compile(
    r"\b(mcp|fastmcp|modelcontextprotocol|tools/call|tools/list|call_tool|list_tools)\b",
    re.IGNORECASE,
)


def test_no_tool_policy_is_configurable() -> None:
    fields = set(Settings.model_fields)
    assert not {f for f in fields if "tool" in f or "mcp" in f}, (
        "a tool policy was added: extend tests/security/test_no_mcp_tools.py to check it"
    )


def test_no_module_mentions_mcp_tools() -> None:
    offenders = []
    for path in PACKAGE.rglob("*"):
        if path.suffix not in (".py", ".sql", ".js", ".html", ".toml", ".json"):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if MCP_WORDS.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_importing_every_module_loads_no_mcp_library() -> None:
    script = (
        "import importlib, pkgutil, sys, ductor_streams\n"
        "for m in pkgutil.walk_packages(ductor_streams.__path__, 'ductor_streams.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in"
        " ('mcp', 'fastmcp', 'modelcontextprotocol'))\n"
        "print(len([n for n in sys.modules if n.startswith('ductor_streams')]), bad)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    count, bad = done.stdout.strip().split(" ", 1)
    assert int(count) > 30 and bad == "[]", done.stdout


def test_no_route_serves_tools() -> None:
    words = re.compile(r"mcp|tool|jsonrpc|rpc", re.IGNORECASE)
    assert not [str(r) for r in api_routes(include_public=True) if words.search(r.path)]


def test_no_dependency_or_entry_point_brings_mcp() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        requirements.extend(extra)
    assert not [r for r in requirements if re.match(r"\s*(fast)?mcp\b", r, re.IGNORECASE)]
    assert "entry-points" not in project or not any(
        "mcp" in group.lower() for group in project["entry-points"]
    )
