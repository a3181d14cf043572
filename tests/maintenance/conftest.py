"""Fixtures of the upkeep tests: see tests/support/objects.py."""

from tests.support.objects import gcs_emulator, objects_env

__all__ = ["gcs_emulator", "objects_env"]
