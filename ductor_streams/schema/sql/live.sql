-- Live delivery (ductor_streams/live): follower start points and gap evidence.

-- name: live_stream_latest
-- Where a new per-process follower starts: the latest sequence, read BEFORE the
-- follower watches the stream (anything committed later wakes it).
SELECT latest_sequence FROM workflow_streams.streams WHERE stream_pk = $1;

-- name: gap_evidence_insert
-- A subscriber saw sequence $3 while it expected $2 and read $4 records from Postgres
-- to fill the hole before going on.
INSERT INTO workflow_streams.gap_evidence
       (stream_pk, expected_sequence, received_sequence, repaired_records, detected_by)
VALUES ($1, $2, $3, $4, $5);
