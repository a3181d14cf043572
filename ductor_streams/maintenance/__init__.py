"""Upkeep: retention pruning, the deletion outbox, and the sweeps of expired intents and
orphaned bytes (docs/objects.md). Core: knows nothing of HTTP or Temporal."""

from ductor_streams.maintenance.upkeep import PassReport, maintenance_worker, run_pass

__all__ = ["PassReport", "maintenance_worker", "run_pass"]
