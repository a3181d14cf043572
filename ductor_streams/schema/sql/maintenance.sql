-- Upkeep: retention pruning, the deletion outbox, the sweep of expired intents and of
-- stored bytes no intent owns (docs/objects.md). Nothing here touches a stream under
-- legal hold: pruning re-checks the hold under the stream's row lock, and deletions of
-- a held stream's bytes wait in the outbox until the hold is lifted.

-- name: streams_with_retention
-- Keyset page of streams that have a retention limit and something retained, or append
-- receipts left after retention removed everything; pruned_before: retention has
-- removed records of it before (its receipts may be due: append_receipts_prune).
SELECT s.stream_pk, s.earliest_sequence > 1 AS pruned_before
  FROM workflow_streams.streams s
 WHERE s.stream_pk > $1
   AND ((s.definition -> 'retention' ->> 'max_records') IS NOT NULL
        OR (s.definition -> 'retention' ->> 'max_age_seconds') IS NOT NULL)
   AND NOT s.legal_hold
   AND (s.latest_sequence >= s.earliest_sequence
        OR EXISTS (SELECT 1 FROM workflow_streams.append_receipts a
                    WHERE a.stream_pk = s.stream_pk))
 ORDER BY s.stream_pk
 LIMIT $2;

-- name: stream_prune
-- One pruning step of one stream, under its row lock: removes the oldest records that
-- max_records or max_age_seconds no longer keep (at most $2 of them), queues the bytes
-- of their objects for deletion, and moves earliest_sequence and pruned_bytes (the
-- cumulative bytes of the last pruned record). No row: missing or under legal hold.
-- The limits are read within the definition bounds (docs/decisions.md): a stream created
-- before them may hold e.g. max_records 2^70 or max_age_seconds 10^18, which neither
-- bigint nor now() - interval can take; such a value keeps as much as the bound does.
WITH s AS MATERIALIZED (
    SELECT st.stream_pk, st.earliest_sequence, st.latest_sequence,
           workflow_streams.clamped_count(st.definition -> 'retention' ->> 'max_records')
               AS max_records,
           LEAST((st.definition -> 'retention' ->> 'max_age_seconds')::numeric,
                 3153600000)::bigint AS max_age
      FROM workflow_streams.streams st
     WHERE st.stream_pk = $1 AND NOT st.legal_hold
       FOR UPDATE
), bound AS MATERIALIZED (
    SELECT s.stream_pk, s.earliest_sequence,
           LEAST(s.latest_sequence + 1, s.earliest_sequence + $2, GREATEST(
               s.earliest_sequence,
               CASE WHEN s.max_records IS NOT NULL
                    THEN s.latest_sequence - s.max_records + 1 ELSE 0 END,
               -- sequences only grow, appended_at nearly so: keep everything from the
               -- first record young enough, so that what is retained stays contiguous.
               CASE WHEN s.max_age IS NOT NULL THEN coalesce(
                    (SELECT min(r.sequence) FROM workflow_streams.records r
                      WHERE r.stream_pk = s.stream_pk AND r.sequence >= s.earliest_sequence
                        AND r.appended_at >= now() - make_interval(secs => s.max_age)),
                    s.latest_sequence + 1)
                    ELSE 0 END)) AS new_earliest
      FROM s
), gone AS (
    DELETE FROM workflow_streams.records r
     USING bound b
     WHERE r.stream_pk = b.stream_pk AND r.sequence < b.new_earliest
    RETURNING r.sequence, r.cumulative_bytes, r.object
), queued AS (
    INSERT INTO workflow_streams.deletion_outbox
           (region, storage_key, reason, stream_pk, object_id)
    SELECT i.region, i.storage_key, 'retention', i.stream_pk, i.object_id
      FROM gone g
      JOIN workflow_streams.object_intents i
        ON i.object_id = (g.object ->> 'object_id')::uuid AND i.stream_pk = $1
     WHERE g.object IS NOT NULL
    RETURNING deletion_id
), moved AS (
    UPDATE workflow_streams.streams st
       SET earliest_sequence = b.new_earliest,
           pruned_bytes = coalesce(
               (SELECT g.cumulative_bytes FROM gone g WHERE g.sequence = b.new_earliest - 1),
               st.pruned_bytes)
      FROM bound b
     WHERE st.stream_pk = b.stream_pk AND b.new_earliest > b.earliest_sequence
    RETURNING st.earliest_sequence
)
SELECT b.earliest_sequence AS old_earliest, b.new_earliest,
       (SELECT count(*) FROM gone) AS records_pruned,
       (SELECT count(*) FROM queued) AS objects_queued
  FROM bound b;

-- name: append_receipts_prune
-- At most $3 of the stream's append receipts that are due: every record the receipt
-- answered for was removed by retention (last_sequence below earliest_sequence) and it
-- is older than the idempotency window ($2 seconds). A stream under legal hold keeps
-- them. Needs no lock: an append that meets a receipt as it goes replays it, one that
-- comes after appends anew (the key expired; docs/api.md), and earliest_sequence only
-- grows. Reads the stream's receipts through the primary key's first column.
WITH due AS (
    SELECT a.idempotency_key
      FROM workflow_streams.streams s
      JOIN workflow_streams.append_receipts a ON a.stream_pk = s.stream_pk
     WHERE s.stream_pk = $1 AND NOT s.legal_hold
       AND a.last_sequence < s.earliest_sequence
       AND a.created_at < now() - make_interval(secs => $2)
     LIMIT $3
), gone AS (
    DELETE FROM workflow_streams.append_receipts a
     USING due
     WHERE a.stream_pk = $1 AND a.idempotency_key = due.idempotency_key
    RETURNING 1
)
SELECT count(*) AS receipts_pruned FROM gone;

-- name: object_intents_expire
-- prepared | uploaded -> expired once past expiry (at most $1 per call), queueing the
-- deletion of whatever bytes they may have in the same statement.
WITH due AS (
    SELECT object_id
      FROM workflow_streams.object_intents
     WHERE state IN ('prepared', 'uploaded') AND expires_at <= now()
     ORDER BY expires_at
     LIMIT $1
       FOR UPDATE SKIP LOCKED
), expired AS (
    UPDATE workflow_streams.object_intents i
       SET state = 'expired', ended_at = now()
      FROM due
     WHERE i.object_id = due.object_id
       AND i.state IN ('prepared', 'uploaded') AND i.expires_at <= now()
    RETURNING i.object_id, i.stream_pk, i.region, i.storage_key
), queued AS (
    INSERT INTO workflow_streams.deletion_outbox
           (region, storage_key, reason, stream_pk, object_id)
    SELECT region, storage_key, 'expired', stream_pk, object_id FROM expired
    RETURNING deletion_id
)
SELECT count(*) AS expired FROM queued;

-- name: storage_keys_unowned
-- Of the listed keys, those that no live intent (prepared, uploaded, committed) owns.
SELECT k.key
  FROM unnest($1::text[]) AS k(key)
 WHERE NOT EXISTS (SELECT 1 FROM workflow_streams.object_intents i
                    WHERE i.storage_key = k.key
                      AND i.state IN ('prepared', 'uploaded', 'committed'));

-- name: storage_keys_not_queued
-- Of the listed keys, those no pending deletion already covers.
SELECT k.key
  FROM unnest($1::text[]) AS k(key)
 WHERE NOT EXISTS (SELECT 1 FROM workflow_streams.deletion_outbox d
                    WHERE d.storage_key = k.key AND d.state = 'pending');

-- name: streams_on_hold
-- Of the given streams, those under legal hold.
SELECT stream_pk FROM workflow_streams.streams
 WHERE stream_pk = ANY($1::bigint[]) AND legal_hold;

-- name: deletion_insert
INSERT INTO workflow_streams.deletion_outbox (region, storage_key, reason, stream_pk, object_id)
SELECT $1, k, $3, $4, NULL FROM unnest($2::text[]) k
RETURNING deletion_id;

-- name: deletions_claim
-- Claims due deletions of the given regions (FOR UPDATE SKIP LOCKED: replicas never
-- take the same row); the claim is a lease: next_attempt_at moves $3 seconds ahead, so
-- a crashed worker's claim becomes due again. Deletions of a held stream's bytes wait.
WITH due AS (
    SELECT d.deletion_id
      FROM workflow_streams.deletion_outbox d
     WHERE d.state = 'pending' AND d.next_attempt_at <= now()
       AND d.region = ANY($2::text[])
       AND NOT EXISTS (SELECT 1 FROM workflow_streams.streams s
                        WHERE s.stream_pk = d.stream_pk AND s.legal_hold)
     ORDER BY d.next_attempt_at, d.deletion_id
     LIMIT $1
       FOR UPDATE SKIP LOCKED
)
UPDATE workflow_streams.deletion_outbox d
   SET attempts = d.attempts + 1, next_attempt_at = now() + make_interval(secs => $3)
  FROM due
 WHERE d.deletion_id = due.deletion_id
RETURNING d.deletion_id, d.region, d.storage_key, d.stream_pk, d.attempts;

-- name: deletion_claim_one
-- The same claim for one given deletion (abort deletes its bytes at once).
UPDATE workflow_streams.deletion_outbox d
   SET attempts = d.attempts + 1, next_attempt_at = now() + make_interval(secs => $2)
 WHERE d.deletion_id = (
        SELECT x.deletion_id FROM workflow_streams.deletion_outbox x
         WHERE x.deletion_id = $1 AND x.state = 'pending' AND x.next_attempt_at <= now()
           AND NOT EXISTS (SELECT 1 FROM workflow_streams.streams s
                            WHERE s.stream_pk = x.stream_pk AND s.legal_hold)
           FOR UPDATE SKIP LOCKED)
RETURNING d.deletion_id, d.region, d.storage_key, d.stream_pk, d.attempts;

-- name: deletion_done
UPDATE workflow_streams.deletion_outbox
   SET state = 'done', done_at = now(), last_error = NULL
 WHERE deletion_id = $1 AND state = 'pending';

-- name: deletion_failed
-- Back to pending, due again after $3 seconds, with the error (never a payload).
UPDATE workflow_streams.deletion_outbox
   SET last_error = $2, next_attempt_at = now() + make_interval(secs => $3)
 WHERE deletion_id = $1 AND state = 'pending';

-- name: deletions_pending_count
SELECT count(*) FROM workflow_streams.deletion_outbox WHERE state = 'pending';
