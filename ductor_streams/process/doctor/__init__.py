"""``ductor-streams doctor``: does this deployment keep the product's guarantees?

Checks, in this order, each one function in ``checks.py`` (its rule in
``decisions.py``): the database (reachable, version, takes writes), its migration level,
whether an acknowledged commit survives a failover (a synchronous standby, or a managed
service's replicated storage), the pooler in front of ``DATABASE_URL`` against
``DUCTOR_STREAMS_DATABASE_POOLER``, LISTEN on the connection that carries it, clock skew
between this host and Postgres, Temporal, and the object store. Each reports ``ok``,
``warn`` or ``fail`` with a one-line detail, as a table or (``--json``) as JSON; the
exit code is 1 on any ``fail`` and, with ``--strict``, on any ``warn``. docs/operators.md
("Checking a deployment") says what each verdict means.
"""

from __future__ import annotations

import asyncio

from ductor_streams.config import Settings
from ductor_streams.process.doctor.checks import CHECKS, Context, short_error
from ductor_streams.process.doctor.report import FAIL, Check, as_json, as_table, exit_code

DEFAULT_TIMEOUT_SECONDS = 10.0


async def run_checks(
    settings: Settings, *, check_seconds: float = DEFAULT_TIMEOUT_SECONDS
) -> list[Check]:
    """Every check, one after the other, each within ``check_seconds``; a check that
    raises or runs out of time fails with what happened."""
    settings.require_database()
    ctx = Context(settings)
    results = []
    for name, check, needs_database in CHECKS:
        if needs_database and ctx.database_error is not None:
            results.append(Check(name, FAIL, "not checked: the database cannot be reached"))
            continue
        try:
            async with asyncio.timeout(check_seconds):
                status, detail = await check(ctx)
        except TimeoutError:
            status, detail = FAIL, f"no answer within {check_seconds:g} s"
        except Exception as exc:
            status, detail = FAIL, short_error(exc)
        results.append(Check(name, status, detail))
    return results


def run_doctor(settings: Settings, *, json: bool, strict: bool, timeout: float) -> int:
    """Print the report (a table, or JSON); return the exit code."""
    checks = asyncio.run(run_checks(settings, check_seconds=timeout))
    print(as_json(checks) if json else as_table(checks))
    return exit_code(checks, strict=strict)
