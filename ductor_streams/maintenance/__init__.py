"""Upkeep: retention pruning, the deletion outbox, and the sweeps of expired intents and
orphaned bytes (docs/objects.md). Core: knows nothing of HTTP or Temporal."""

from ductor_streams.maintenance.upkeep import PassReport, run_pass, running_upkeep

__all__ = ["PassReport", "run_pass", "running_upkeep"]
