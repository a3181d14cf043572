"""Deliveries for operators: list with filters and keyset paging, show one, retry a dead one.

Retry is the one write: ``dead -> pending``, due now, with a fresh attempt budget and
the audit columns ``retried_by``/``retried_at``. Only a dead delivery can be retried,
so a retry never races a dispatcher that holds a lease on a live one.
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg

from ductor_streams.errors import DeliveryNotRetryable, NotFound
from ductor_streams.foundation import metrics
from ductor_streams.ops.filters import DeliveryFilter, page_token
from ductor_streams.ops.models import Delivery, DeliveryDetail, DeliveryPage, Visibility
from ductor_streams.schema import QUERIES

log = logging.getLogger(__name__)


def _delivery(row: Any) -> Delivery:
    return Delivery(
        delivery_id=row["delivery_id"],
        tenant=row["tenant"],
        run_id=row["run_id"],
        stream_id=row["stream_id"],
        sequence=row["sequence"],
        state=row["state"],
        attempts=row["attempts"],
        last_error=row["last_error"],
        next_attempt_at=row["next_attempt_at"],
        delivered_at=row["delivered_at"],
        created_at=row["created_at"],
        retried_by=row["retried_by"],
        retried_at=row["retried_at"],
        lease_owner=row["lease_owner"],
        lease_expires_at=row["lease_expires_at"],
    )


async def list_deliveries(
    pool: asyncpg.Pool,
    view: Visibility,
    where: DeliveryFilter,
    *,
    limit: int,
    after: int | None = None,
) -> DeliveryPage:
    """One page of deliveries in id order (oldest first), after the id ``after``."""
    rows = await pool.fetch(
        QUERIES["ops_deliveries_list"],
        *view.args(),
        where.state,
        where.run_id,
        where.stream_id,
        where.older_than_seconds,
        after or 0,
        limit + 1,
    )
    deliveries = [_delivery(r) for r in rows[:limit]]
    more = len(rows) > limit
    return DeliveryPage(deliveries, page_token(deliveries[-1].delivery_id) if more else None)


async def get_delivery(pool: asyncpg.Pool, view: Visibility, delivery_id: int) -> DeliveryDetail:
    """One delivery with its record; NotFound when it is not visible to ``view``."""
    row = await pool.fetchrow(QUERIES["ops_delivery_get"], *view.args(), delivery_id)
    if row is None:
        raise NotFound(f"delivery {delivery_id} does not exist")
    return DeliveryDetail(
        delivery=_delivery(row),
        record_size=row["record_size"],
        record_appended_at=row["record_appended_at"],
        payload=row["record_payload"],
    )


async def retry_delivery(
    pool: asyncpg.Pool, view: Visibility, delivery_id: int, *, retried_by: str
) -> Delivery:
    """Re-queue a dead delivery (audited); returns it as it is now.

    NotFound when it is not visible; DeliveryNotRetryable when it is not dead (then
    nothing changed).
    """
    retried = await pool.fetchval(
        QUERIES["ops_delivery_retry"], *view.args(), delivery_id, retried_by
    )
    detail = await get_delivery(pool, view, delivery_id)
    delivery = detail.delivery
    if retried is None:
        raise DeliveryNotRetryable(
            f"delivery {delivery_id} is {delivery.state}; only a dead delivery can be retried",
            state=delivery.state,
        )
    metrics.DELIVERY_RETRIES.inc()
    log.info(
        "dead delivery re-queued by an operator",
        extra={
            "delivery_id": delivery_id,
            "tenant": delivery.tenant,
            "run_id": delivery.run_id,
            "stream_id": delivery.stream_id,
            "sequence": delivery.sequence,
            "retried_by": retried_by,
        },
    )
    return delivery
