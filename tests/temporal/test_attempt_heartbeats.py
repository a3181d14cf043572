"""When the stream helpers heartbeat an activity attempt (plugin/streaming/attempt.py),
through Temporal's ActivityEnvironment, which records each heartbeat's details."""

from __future__ import annotations

import dataclasses
from typing import Any

from temporalio import activity
from temporalio.testing import ActivityEnvironment

from ductor_streams.plugin.streaming.attempt import HEARTBEAT_KEY, attempt_state


def environment(beats: list[Any], *, attempt: int = 1, details: list[Any] | None = None):
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=attempt, heartbeat_details=details or [])
    env.on_heartbeat = lambda *d: beats.append(d[0] if d else None)
    return env


async def test_opening_a_writer_or_reader_heartbeats_before_anything_is_written() -> None:
    beats: list[Any] = []

    @activity.defn
    async def opens() -> None:
        state = attempt_state()
        assert beats == []
        state.opened()
        assert len(beats) == 1  # at once, before any record
        state.opened()  # a second helper within the interval: no second beat now
        assert len(beats) == 1

    await environment(beats).run(opens)
    assert beats[0] == {
        HEARTBEAT_KEY: {"writers": {}, "readers": {}, "reader_fingerprints": {}, "user": None}
    }


async def test_the_heartbeat_at_open_carries_what_earlier_attempts_wrote() -> None:
    earlier = {
        HEARTBEAT_KEY: {
            "writers": {"run-1/output": {"attempts": [{"attempt": 1, "data": [[1, 5]]}]}},
            "readers": {"run-1/input": 7},
            "user": {"mine": True},
        }
    }
    beats: list[Any] = []

    @activity.defn
    async def opens() -> None:
        attempt_state().opened()

    await environment(beats, attempt=2, details=[earlier]).run(opens)
    # An earlier attempt's details without reader fingerprints (written before they
    # existed) are carried as they were, with none added.
    assert beats == [{HEARTBEAT_KEY: {**earlier[HEARTBEAT_KEY], "reader_fingerprints": {}}}]
