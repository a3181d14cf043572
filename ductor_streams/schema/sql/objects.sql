-- Object intents: prepared -> uploaded -> committed, or aborted / expired
-- (docs/objects.md). Each transition is ONE guarded statement: its WHERE clause names
-- the state it leaves, so a racing transition finds no row and changes nothing.

-- name: object_intent_insert
-- Prepare: pins everything; returns no row when the idempotency key is already taken.
INSERT INTO workflow_streams.object_intents
       (object_id, stream_pk, idempotency_key, sha256, size, content_type, schema, region,
        metadata, record_payload, storage_key, prepared_by, prepared_scopes, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::text::jsonb, $9::text, $10, $11, $12::text[],
        now() + make_interval(secs => $13))
ON CONFLICT ON CONSTRAINT object_intents_key DO NOTHING
RETURNING object_id, stream_pk, idempotency_key, sha256, size, content_type, schema, region,
          record_payload, storage_key, state, prepared_by, prepared_scopes,
          expires_at, expires_at <= now() AS past_expiry, stored_md5, committed_sequence;

-- name: object_intent_get_by_key
SELECT object_id, stream_pk, idempotency_key, sha256, size, content_type, schema, region,
       record_payload, storage_key, state, prepared_by, prepared_scopes,
       expires_at, expires_at <= now() AS past_expiry, stored_md5, committed_sequence
  FROM workflow_streams.object_intents
 WHERE stream_pk = $1 AND idempotency_key = $2;

-- name: object_intent_get
-- The intent, judged by the database clock, with its stream's retained bounds.
SELECT i.object_id, i.stream_pk, i.idempotency_key, i.sha256, i.size, i.content_type,
       i.schema, i.region, i.record_payload, i.storage_key, i.state,
       i.prepared_by, i.prepared_scopes, i.expires_at, i.expires_at <= now() AS past_expiry,
       i.stored_md5, i.committed_sequence, s.earliest_sequence
  FROM workflow_streams.object_intents i
  JOIN workflow_streams.streams s ON s.stream_pk = i.stream_pk
 WHERE i.object_id = $1 AND i.stream_pk = $2;

-- name: object_intent_mark_uploaded
-- prepared -> uploaded, only before expiry; $3 is the store's MD5 of the verified bytes.
UPDATE workflow_streams.object_intents
   SET state = 'uploaded', uploaded_at = now(), stored_md5 = $3
 WHERE object_id = $1 AND stream_pk = $2 AND state = 'prepared' AND expires_at > now()
RETURNING state;

-- name: object_intent_commit
-- uploaded -> committed, in the SAME statement (so the same transaction) that appends
-- the record through workflow_streams.append_requests, under its row lock, credit and
-- close rules. The intent is marked only when the append succeeded; otherwise the row
-- says why (stream_closed, credit_exhausted, quota_exhausted) and nothing changed.
-- No row at all: the intent was not 'uploaded' and unexpired (the caller looks it up).
WITH intent AS MATERIALIZED (
    SELECT i.object_id, i.stream_pk
      FROM workflow_streams.object_intents i
     WHERE i.object_id = $1 AND i.stream_pk = $2
       AND i.state = 'uploaded' AND i.expires_at > now()
       FOR UPDATE
), appended AS MATERIALIZED (
    SELECT a.outcome, a.first_sequence
      FROM intent,
           workflow_streams.append_requests(intent.stream_pk, ARRAY[1], ARRAY[NULL::text],
                                            ARRAY[NULL::text], ARRAY[$3::text],
                                            ARRAY[$4::integer], ARRAY[$5::jsonb]) a
), committed AS (
    UPDATE workflow_streams.object_intents i
       SET state = 'committed', committed_sequence = a.first_sequence, committed_at = now()
      FROM appended a
     WHERE i.object_id = $1 AND i.stream_pk = $2 AND a.outcome = 'appended'
    RETURNING i.committed_sequence
)
SELECT a.outcome, a.first_sequence FROM appended a;

-- name: object_intent_abort
-- prepared | uploaded -> aborted before expiry, queueing the deletion of its bytes in
-- the same statement.
WITH aborted AS (
    UPDATE workflow_streams.object_intents
       SET state = 'aborted', ended_at = now()
     WHERE object_id = $1 AND stream_pk = $2
       AND state IN ('prepared', 'uploaded') AND expires_at > now()
    RETURNING object_id, stream_pk, region, storage_key
), queued AS (
    INSERT INTO workflow_streams.deletion_outbox
           (region, storage_key, reason, stream_pk, object_id)
    SELECT region, storage_key, 'aborted', stream_pk, object_id FROM aborted
    RETURNING deletion_id
)
SELECT q.deletion_id FROM queued q;

-- name: object_orphan_queue_deletion
-- Bytes written for an intent that left 'prepared' while they were uploading.
INSERT INTO workflow_streams.deletion_outbox (region, storage_key, reason, stream_pk, object_id)
VALUES ($1, $2, 'orphan', $3, $4)
RETURNING deletion_id;
