"""The activities called directly on the store (no Temporal needed for these): the read
page stays under Temporal's payload limit, and domain errors map to ApplicationErrors."""

from __future__ import annotations

import uuid

import pytest
from temporalio.exceptions import ApplicationError

from ductor_streams.activities import StreamsActivities, error_types, models
from ductor_streams.config import Settings
from ductor_streams.runtime import Runtime


async def test_read_page_is_capped_in_bytes(runtime: Runtime, settings: Settings) -> None:
    acts = StreamsActivities(
        settings.with_overrides(tenant=f"a-{uuid.uuid4().hex[:6]}"), runtime=runtime
    )
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    await acts.create_stream(
        models.CreateStreamInput(run_id, {"stream_id": "big", "direction": "output"})
    )
    blob = "x" * 59_998  # 60,000 bytes as JSON
    appended = await acts.append(models.AppendInput(run_id, "big", [blob] * 40, "k1"))
    assert (appended.first_sequence, appended.last_sequence, appended.replayed) == (1, 40, False)
    again = await acts.append(models.AppendInput(run_id, "big", [blob] * 40, "k1"))
    assert (again.first_sequence, again.last_sequence, again.replayed) == (1, 40, True)

    page = await acts.read(models.ReadInput(run_id, "big", 0, 1000))
    assert [r.sequence for r in page.records] == list(range(1, 18))  # 17 x 60,000 <= 1 MiB
    assert page.next_cursor == 17 and page.latest_sequence == 40
    rest = await acts.read(models.ReadInput(run_id, "big", 34, 1000))
    assert [r.sequence for r in rest.records] == list(range(35, 41))
    one = await acts.read(models.ReadInput(run_id, "big", 0, 1000, max_bytes=10))
    assert [r.sequence for r in one.records] == [1]  # always at least one record


@pytest.mark.parametrize(
    ("call", "kind", "code", "retryable"),
    [
        ("closed", error_types.STREAM_CLOSED, "stream_closed", False),
        ("conflict", error_types.DEFINITION_CONFLICT, "definition_conflict", False),
        ("missing", error_types.NOT_FOUND, "not_found", False),
        ("credit", error_types.CREDIT_EXHAUSTED, "credit_exhausted", True),
        ("future", error_types.ACK_REJECTED, "ack_in_future", False),
    ],
)
async def test_domain_errors_become_application_errors(
    runtime: Runtime, settings: Settings, call: str, kind: str, code: str, retryable: bool
) -> None:
    acts = StreamsActivities(
        settings.with_overrides(tenant=f"a-{uuid.uuid4().hex[:6]}"), runtime=runtime
    )
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    await acts.create_stream(
        models.CreateStreamInput(
            run_id,
            {"stream_id": "in", "direction": "input", "credit": {"max_unread_items": 1}},
        )
    )
    with pytest.raises(ApplicationError) as raised:
        if call == "closed":
            await acts.close(models.CloseInput(run_id, "in"))
            await acts.append(models.AppendInput(run_id, "in", [1]))
        elif call == "conflict":
            await acts.create_stream(
                models.CreateStreamInput(run_id, {"stream_id": "in", "direction": "output"})
            )
        elif call == "missing":
            await acts.append(models.AppendInput(run_id, "nope", [1]))
        elif call == "credit":
            await acts.append(models.AppendInput(run_id, "in", [1]))
            await acts.append(models.AppendInput(run_id, "in", [2]))
        else:
            await acts.ack(models.AckInput(run_id, "in", "workflow", 5))
    error = raised.value
    assert error.type == kind
    assert error.details[0]["code"] == code
    assert error.non_retryable is (not retryable)
    if retryable:
        assert error.next_retry_delay is not None and error.next_retry_delay.total_seconds() >= 1
