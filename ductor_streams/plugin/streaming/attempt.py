"""What the stream helpers know about the activity attempt they run in.

One ``AttemptState`` per activity attempt, shared by every writer and reader the attempt
opens (also from tasks it starts), because an activity has one set of heartbeat details:

- the idempotency keys of its appends, ``ds:act:<digest>:<attempt>:<batch>``, where the
  digest is of the workflow ID, the workflow's run ID and the activity ID (activity IDs
  start again at 1 after Continue-As-New, so the run ID keeps two runs' keys apart) and
  the batch counts this attempt's appends per stream;
- the heartbeat details, one JSON object under ``"ductor_streams"``: per stream written,
  what each attempt appended; per stream read, the last consumed sequence (``readers``)
  and that record's fingerprint (``reader_fingerprints``: the next attempt resumes with
  it, and learns whether the stream still has that record); and the author's own value
  (``heartbeat``). The next attempt finds them in
  ``activity.info().heartbeat_details``.
"""

from __future__ import annotations

import asyncio
import hashlib
import weakref
from typing import Any

from temporalio import activity

HEARTBEAT_KEY = "ductor_streams"
# The helpers heartbeat at most this often, and whenever a writer or reader closes. The
# SDK sends at most one per 80% of the heartbeat timeout anyway, but each call costs the
# worker a task and an encoding: at 0.1 s, 100 writers spent 1,000 of them a second.
HEARTBEAT_INTERVAL_SECONDS = 0.5
KEY_PREFIX = "ds:act:"


class AttemptState:
    """The stream helpers' state for one activity attempt; see the module docstring."""

    def __init__(self, info: activity.Info) -> None:
        self.info = info
        self.attempt = info.attempt
        identity = f"{info.workflow_id}\x00{info.workflow_run_id}\x00{info.activity_id}"
        digest = hashlib.sha256(identity.encode()).hexdigest()[:32]
        self.key_prefix = f"{KEY_PREFIX}{digest}:"
        previous = previous_details(info)
        self.previous_writers: dict[str, Any] = dict(previous.get("writers") or {})
        # Streams read by earlier attempts keep their cursor until read again.
        self.readers: dict[str, int] = {
            k: int(v) for k, v in (previous.get("readers") or {}).items()
        }
        # The fingerprint of each reader's last consumed record (details before it
        # existed have none: such a reader resumes unchecked).
        self.reader_fingerprints: dict[str, str] = {
            k: str(v) for k, v in (previous.get("reader_fingerprints") or {}).items()
        }
        # Per stream written: its progress, or a callable giving it (an open writer's,
        # built only when a heartbeat goes out).
        self.writers: dict[str, Any] = dict(self.previous_writers)
        self.user: Any = previous.get("user")
        self._batches: dict[int, int] = {}
        self._open = 0
        self._last_beat = float("-inf")
        self._timer: asyncio.TimerHandle | None = None

    def key(self, suffix: str) -> str:
        """The idempotency key of this attempt's append ``suffix`` (a batch number)."""
        return f"{self.key_prefix}{self.attempt}:{suffix}"

    def next_batch(self, stream_pk: int) -> int:
        """The number of this attempt's next append to the stream (1, 2, ...)."""
        number = self._batches.get(stream_pk, 0) + 1
        self._batches[stream_pk] = number
        return number

    def opened(self) -> None:
        """A writer or reader opened: heartbeat now (or within the interval). The SDK
        sends an attempt's first heartbeat to Temporal at once and later ones at most
        once per throttle interval, so the one that costs a round trip goes out here,
        before the first record, and not with it: with many activities opening together
        those round trips landed on their first records (docs/decisions.md, "Streaming
        activities")."""
        self._open += 1
        self.heartbeat()

    def closed(self) -> None:
        self._open -= 1
        self.heartbeat(force=True)

    def heartbeat(self, *, force: bool = False) -> None:
        """Record the progress as the activity's heartbeat details: now when the last
        one is older than ``HEARTBEAT_INTERVAL_SECONDS`` (or ``force``), else once
        that interval has passed."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if force or now - self._last_beat >= HEARTBEAT_INTERVAL_SECONDS:
            self._beat(now)
        elif self._timer is None:
            # The timer's callback runs in this activity's context (call_at copies it).
            self._timer = loop.call_at(self._last_beat + HEARTBEAT_INTERVAL_SECONDS, self._on_timer)

    def details(self) -> dict[str, Any]:
        return {
            HEARTBEAT_KEY: {
                "writers": {k: v() if callable(v) else v for k, v in self.writers.items()},
                "readers": self.readers,
                "reader_fingerprints": self.reader_fingerprints,
                "user": self.user,
            }
        }

    def _on_timer(self) -> None:
        self._timer = None
        self._beat(asyncio.get_running_loop().time())

    def _beat(self, now: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._last_beat = now
        activity.heartbeat(self.details())


def previous_details(info: activity.Info) -> dict[str, Any]:
    """The helpers' part of the heartbeat details an earlier attempt left, or {}."""
    for detail in info.heartbeat_details:
        if isinstance(detail, dict) and isinstance(detail.get(HEARTBEAT_KEY), dict):
            return dict(detail[HEARTBEAT_KEY])
    return {}


# One state per attempt: keyed by the SDK's per-attempt activity context, which every
# task of the attempt shares, and dropped with it.
_STATES: dict[int, AttemptState] = {}


def attempt_state() -> AttemptState:
    """The state of the running activity attempt (RuntimeError outside an activity)."""
    context = activity._Context.current()  # the attempt's context object
    state = _STATES.get(id(context))
    if state is None:
        state = _STATES[id(context)] = AttemptState(activity.info())
        weakref.finalize(context, _STATES.pop, id(context), None)
    return state
