-- Live delivery (ductor_streams/live): follower start points and gap evidence.

-- name: live_stream_watch
-- A new per-process follower asks for the stream's record wakes for $2 seconds and
-- learns where to start: appends that lock the row after this commits notify, appends
-- before it are at or below the latest_sequence returned (streams.watched_until).
UPDATE workflow_streams.streams
   SET watched_until = greatest(watched_until, now() + make_interval(secs => $2))
 WHERE stream_pk = $1
RETURNING latest_sequence;

-- name: live_streams_rewatch
-- Renews the watch of every stream this process follows. Rows are locked in stream_pk
-- order, as the appends of several streams lock them, so the two never deadlock.
WITH followed AS (
    SELECT stream_pk FROM workflow_streams.streams
     WHERE stream_pk = ANY($1::bigint[])
     ORDER BY stream_pk
       FOR UPDATE
)
UPDATE workflow_streams.streams s
   SET watched_until = greatest(s.watched_until, now() + make_interval(secs => $2))
  FROM followed
 WHERE s.stream_pk = followed.stream_pk;

-- name: gap_evidence_insert
-- A subscriber saw sequence $3 while it expected $2 and read $4 records from Postgres
-- to fill the hole before going on.
INSERT INTO workflow_streams.gap_evidence
       (stream_pk, expected_sequence, received_sequence, repaired_records, detected_by)
VALUES ($1, $2, $3, $4, $5);
