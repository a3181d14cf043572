"""The floor under ``bench.activity_streams``' concurrent load: the same tokens, durable
commits and SSE followers with no product code in between (``--sql``: the product's
statement and wakes between the same bare processes).

    python -m bench.token_floor --serve --dsn DSN [--sql]   # the SSE side (prints its port)
    python -m bench.token_floor --produce '<json>'          # the producing side

The code is tests/support/token_floor.py, where tests/speed/test_token_floor.py checks
that each floor stores and delivers every token once, in order.
"""

from __future__ import annotations

import sys

from tests.support.token_floor import main

if __name__ == "__main__":
    sys.exit(main())
