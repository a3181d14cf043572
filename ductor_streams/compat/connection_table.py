"""Which open connections count against the server's cap, and whose each one is.

The connection guard (compat/uvicorn_protocol.py) keeps one table per server. A
connection is *admitted* (it holds one of ``cap`` places) or *provisional* (one of
``reserve`` places above the cap, for a connection whose request head has not shown yet
what it is: a health probe is answered there, anything else needs an admitted place).
Once a request on an admitted connection is authenticated, the connection carries the
token's tenant until another tenant's request uses it.

At the cap, a request first takes the place of an idle connection (waiting for a
request head), unless that one carries another tenant at or below its fair share
(``may_take_idle``); else, for a tenant below its fair share, the place of the newest
connection of the tenant holding the most, when that tenant is above its own
(``fair_victim``). The fair share is the cap divided by the number of tenants holding
connections, the asking one included. So one tenant can fill an idle server, and
gives places back, newest first, as others arrive; a tenant at or below its share never
loses a connection to another, and nobody loses one to a tenant already at its share.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

C = TypeVar("C", bound=Hashable)


class ConnectionTable(Generic[C]):
    """The places of one server's connections (see the module docstring)."""

    def __init__(self, cap: int, reserve: int) -> None:
        self.cap = cap
        self.reserve = reserve
        self._admitted: dict[C, None] = {}
        self._provisional: dict[C, None] = {}
        self._tenant: dict[C, str] = {}
        # Each tenant's admitted connections, oldest (first tagged) first.
        self._by_tenant: dict[str, dict[C, None]] = {}

    # -- places ----------------------------------------------------------------------

    @property
    def admitted_count(self) -> int:
        return len(self._admitted)

    @property
    def provisional_count(self) -> int:
        return len(self._provisional)

    def is_admitted(self, connection: C) -> bool:
        return connection in self._admitted

    def has_room(self) -> bool:
        """Whether an admitted place is free."""
        return len(self._admitted) < self.cap

    def has_reserve(self) -> bool:
        """Whether a provisional place is free."""
        return len(self._provisional) < self.reserve

    def admit(self, connection: C) -> None:
        """Give ``connection`` an admitted place (from a provisional one, if it had one)."""
        self._provisional.pop(connection, None)
        self._admitted[connection] = None

    def hold_provisionally(self, connection: C) -> None:
        self._provisional[connection] = None

    def remove(self, connection: C) -> None:
        """Forget ``connection`` (closed, or being closed): its place is free at once."""
        self._admitted.pop(connection, None)
        self._provisional.pop(connection, None)
        self.untag(connection)

    # -- tenants ---------------------------------------------------------------------

    def tenant_of(self, connection: C) -> str | None:
        return self._tenant.get(connection)

    def tag(self, connection: C, tenant: str) -> None:
        """``connection`` serves ``tenant`` now (admitted connections only)."""
        if connection not in self._admitted:
            return
        current = self._tenant.get(connection)
        if current == tenant:
            return  # keeps its age among the tenant's connections
        if current is not None:
            self.untag(connection)
        self._tenant[connection] = tenant
        self._by_tenant.setdefault(tenant, {})[connection] = None

    def untag(self, connection: C) -> None:
        tenant = self._tenant.pop(connection, None)
        if tenant is None:
            return
        held = self._by_tenant[tenant]
        del held[connection]
        if not held:
            del self._by_tenant[tenant]

    def held_by(self, tenant: str) -> int:
        """How many admitted connections carry ``tenant``."""
        return len(self._by_tenant.get(tenant, ()))

    def _holders(self, tenant: str | None) -> int:
        """Tenants holding connections, counting ``tenant`` among them."""
        return len(self._by_tenant) + (tenant is not None and tenant not in self._by_tenant)

    def may_take_idle(self, connection: C, tenant: str | None) -> bool:
        """Whether a request of ``tenant`` (None: not known) may take the place of the
        idle ``connection``: one that carries no tenant, ``tenant`` itself, or a tenant
        above its fair share."""
        owner = self._tenant.get(connection)
        if owner is None or owner == tenant:
            return True
        return len(self._by_tenant[owner]) * self._holders(tenant) > self.cap

    def fair_victim(self, tenant: str) -> C | None:
        """The connection a request of ``tenant`` may take the place of at the cap: the
        newest of the tenant holding the most, if ``tenant`` is below its fair share and
        that one above its own; else None."""
        holders = self._holders(tenant)
        # Below the share cap / holders, in integers: held * holders < cap.
        if self.held_by(tenant) * holders >= self.cap:
            return None
        busiest: dict[C, None] | None = None
        for other, held in self._by_tenant.items():
            if other != tenant and (busiest is None or len(held) > len(busiest)):
                busiest = held
        if busiest is None or len(busiest) * holders <= self.cap:
            return None
        return next(reversed(busiest))
