"""Fixtures of the upkeep tests: see tests/support/objects.py."""

from tests.support.objects import gcs_emulator, object_server, objects_env

__all__ = ["gcs_emulator", "object_server", "objects_env"]
