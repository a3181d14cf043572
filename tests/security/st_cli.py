"""schemathesis's command line (``st``), with one CPython 3.11 bug kept out of its way.

CPython 3.11's ``ast.parse`` can raise ``SystemError: AST constructor recursion depth
mismatch`` when it is called deep in a recursion (fixed in 3.12). Hypothesis calls it to
describe a lambda when it prints a strategy, which schemathesis makes it do while
building the coverage cases of a free-form JSON body: the run then reports a "Runtime
Error" before any request is sent. Here a lambda that cannot be described that way is
described as ``lambda: <unknown>``, which only changes how a strategy prints.
(``hypothesis.internal.lambda_sources`` is private: on another hypothesis this does
nothing and ``st`` runs as it is.)
"""

from __future__ import annotations

import sys
from typing import Any


def _guard_lambda_descriptions() -> None:
    if sys.version_info >= (3, 12):
        return
    try:
        from hypothesis.internal import lambda_sources
    except ImportError:
        return
    describe = getattr(lambda_sources, "_lambda_description", None)
    if describe is None:
        return

    def guarded(f: Any) -> str:
        try:
            return str(describe(f))
        except SystemError:
            return "lambda: <unknown>"

    lambda_sources._lambda_description = guarded


if __name__ == "__main__":
    _guard_lambda_descriptions()
    from schemathesis.cli import schemathesis

    sys.exit(schemathesis())
