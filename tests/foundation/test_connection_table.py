"""The bookkeeping behind the connection cap and the live-read cap, as units: places,
tenants, fair shares and the victim chosen at the cap (compat/connection_table.py), and
each tenant's live reads (http/middleware/live_reads.py). The servers that use them are tested in
tests/security/test_live_read_caps.py and test_connection_guard.py."""

from __future__ import annotations

import pytest

from ductor_streams.compat.connection_table import ConnectionTable
from ductor_streams.compat.uvicorn_protocol import PROBE_PATHS
from ductor_streams.config import Settings
from ductor_streams.errors import TooManyLiveReads
from ductor_streams.http.codecs.problems import problem_parts
from ductor_streams.http.middleware.live_reads import LiveReads, tenant_live_limit
from ductor_streams.http.routes import health


def _table(cap: int, held: dict[str, int]) -> tuple[ConnectionTable[str], dict[str, list[str]]]:
    table: ConnectionTable[str] = ConnectionTable(cap, reserve=2)
    names: dict[str, list[str]] = {}
    for tenant, count in held.items():
        for i in range(count):
            name = f"{tenant}{i}"
            table.admit(name)
            table.tag(name, tenant)
            names.setdefault(tenant, []).append(name)
    return table, names


def test_places_admitted_then_provisional_and_freed_at_once() -> None:
    table: ConnectionTable[str] = ConnectionTable(2, reserve=1)
    table.admit("a")
    table.admit("b")
    assert not table.has_room() and table.has_reserve()
    table.hold_provisionally("p")
    assert not table.has_reserve() and not table.is_admitted("p")
    table.remove("a")
    assert table.has_room()
    table.admit("p")  # promoted: its provisional place is free again
    assert table.is_admitted("p") and table.has_reserve()
    assert (table.admitted_count, table.provisional_count) == (2, 0)


def test_only_admitted_connections_carry_a_tenant() -> None:
    table: ConnectionTable[str] = ConnectionTable(4, reserve=1)
    table.hold_provisionally("p")
    table.tag("p", "t")
    assert table.tenant_of("p") is None and table.held_by("t") == 0
    table.admit("x")
    table.tag("x", "t")
    table.tag("x", "u")  # another tenant's request on the same connection
    assert (table.held_by("t"), table.held_by("u")) == (0, 1)
    table.remove("x")
    assert table.held_by("u") == 0


def test_the_newest_connection_of_the_busiest_tenant_goes_for_a_newcomer() -> None:
    table, names = _table(20, {"big": 20})
    assert table.fair_victim("new") == names["big"][-1]
    # The busiest tenant itself takes nobody's place, not even its own.
    assert table.fair_victim("big") is None


def test_a_connection_keeps_its_age_when_its_tenant_asks_again() -> None:
    table, names = _table(4, {"big": 4})
    table.tag(names["big"][0], "big")
    assert table.fair_victim("new") == names["big"][-1]


def test_nobody_below_or_at_their_share_is_evicted() -> None:
    # 15 and 5 of 20: a (above 10) may not take b's place; b (below 10) may take a's.
    table, names = _table(20, {"a": 15, "b": 5})
    assert table.fair_victim("a") is None
    assert table.fair_victim("b") == names["a"][-1]
    # A third tenant: the share is 20/3; a (15) is the busiest and above it.
    assert table.fair_victim("c") == names["a"][-1]
    # 10 and 10: both at their share; neither loses one to the other.
    table, _ = _table(20, {"a": 10, "b": 10})
    assert table.fair_victim("a") is None and table.fair_victim("b") is None
    # 7, 7 and 6 of 20 (share 20/3 each), a fourth tenant: share 5; a is the busiest.
    table, names = _table(20, {"a": 7, "b": 7, "c": 6})
    assert table.fair_victim("d") == names["a"][-1]
    # 8 and 7 of 15 with a third tenant asking (share 5): b is above it but not the
    # busiest; a goes.
    table, names = _table(15, {"a": 8, "b": 7})
    assert table.fair_victim("c") == names["a"][-1]


def test_an_idle_connection_goes_unless_another_tenant_at_its_share_holds_it() -> None:
    table, names = _table(20, {"a": 15, "b": 5})
    table.admit("fresh")  # a connection before its first request: nobody's
    assert table.may_take_idle("fresh", None) and table.may_take_idle("fresh", "b")
    # b's idle connection: b holds 5 of 20, below its share (10), so only b's own
    # request may take it.
    assert not table.may_take_idle(names["b"][0], "a")
    assert not table.may_take_idle(names["b"][0], None)
    assert table.may_take_idle(names["b"][0], "b")
    # a's: a holds 15, above its share, whoever asks (even before the asker is known).
    assert table.may_take_idle(names["a"][0], "b")
    assert table.may_take_idle(names["a"][0], None)
    assert table.may_take_idle(names["a"][0], "c")


def test_untagged_connections_count_against_the_cap_but_are_never_victims() -> None:
    table: ConnectionTable[str] = ConnectionTable(3, reserve=1)
    for name in ("probe1", "probe2", "probe3"):
        table.admit(name)
    assert not table.has_room()
    assert table.fair_victim("t") is None


def test_the_probe_paths_are_the_health_routes() -> None:
    assert {path for route in health.ROUTES for path in route.paths} == PROBE_PATHS


def test_live_reads_per_tenant() -> None:
    reads = LiveReads(2)
    first, second = reads.enter("a"), reads.enter("a")
    with pytest.raises(TooManyLiveReads) as refused:
        reads.enter("a")
    other = reads.enter("b")  # another tenant has its own count
    assert (reads.count("a"), reads.count("b")) == (2, 1)
    status, body, headers = problem_parts(refused.value)
    assert status == 429 and b'"code":"too_many_live_reads"' in body
    assert int(headers["Retry-After"]) >= 1
    first.close()
    first.close()  # once, however often
    assert reads.count("a") == 1
    with reads.enter("a"):
        assert reads.count("a") == 2
    second.close()
    other.close()
    assert (reads.count("a"), reads.count("b")) == (0, 0)


def test_the_default_live_read_limit_is_half_the_connection_cap() -> None:
    base = {"database_url": "postgresql://x/y", "jwt_secret": "s" * 32}
    assert tenant_live_limit(Settings(**base, max_connections=40)) == 20
    assert tenant_live_limit(Settings(**base, max_connections=40, tenant_max_live=7)) == 7
    assert tenant_live_limit(Settings(**base)) >= 8
