"""Operators' view of input delivery: review deliveries, retry dead ones, see lag and gaps.

Core: knows Postgres only. The edges are ``http/routes/ops.py`` (JSON + the /ops page)
and ``ops/cli_outbox.py`` (``ductor-streams outbox``).
"""

from ductor_streams.ops.deliveries import get_delivery, list_deliveries, retry_delivery
from ductor_streams.ops.filters import DeliveryFilter, GapFilter
from ductor_streams.ops.models import (
    DELIVERY_STATES,
    Delivery,
    DeliveryDetail,
    DeliveryPage,
    DeliverySummary,
    Gap,
    GapPage,
    StreamLag,
    Visibility,
)
from ductor_streams.ops.overview import count_by_state, list_gaps, summarize

__all__ = [
    "DELIVERY_STATES",
    "Delivery",
    "DeliveryDetail",
    "DeliveryFilter",
    "DeliveryPage",
    "DeliverySummary",
    "Gap",
    "GapFilter",
    "GapPage",
    "StreamLag",
    "Visibility",
    "count_by_state",
    "get_delivery",
    "list_deliveries",
    "list_gaps",
    "retry_delivery",
    "summarize",
]
