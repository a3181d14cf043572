-- Stream definitions, records, acks: one named block per query (`-- name: <entity>_<verb>`).
-- Loaded with every other file of this folder by ductor_streams.schema.queries.

-- name: stream_insert
-- Creates a stream with its consumers within the tenant's quota of $7 streams
-- (workflow_streams.create_stream): outcome 'created', 'exists' (stream_pk is the
-- existing stream) or 'tenant_quota' (nothing created).
SELECT r_stream_pk AS stream_pk, r_outcome AS outcome
  FROM workflow_streams.create_stream($1, $2, $3, $4, $5::jsonb, $6::text[], $7);

-- name: stream_get_by_key
SELECT stream_pk, direction, definition::text AS definition
  FROM workflow_streams.streams
 WHERE tenant = $1 AND run_id = $2 AND stream_id = $3;

-- name: stream_state
SELECT s.latest_sequence, s.earliest_sequence, s.closed_at IS NOT NULL AS closed,
       s.legal_hold, s.legal_hold_reason, s.total_items, s.total_bytes,
       CASE WHEN s.min_acked_sequence IS NULL THEN 0
            ELSE s.latest_sequence - s.min_acked_sequence END AS unread_items,
       CASE WHEN s.min_acked_sequence IS NULL THEN 0
            ELSE s.total_bytes - s.min_acked_bytes END AS unread_bytes,
       coalesce((SELECT jsonb_agg(jsonb_build_object('consumer_id', c.consumer_id,
                                                     'acked_sequence', c.acked_sequence)
                                  ORDER BY c.consumer_id)
                   FROM workflow_streams.consumers c WHERE c.stream_pk = s.stream_pk),
                '[]'::jsonb)::text AS consumers
  FROM workflow_streams.streams s
 WHERE s.stream_pk = $1;

-- name: records_read
-- The stream's bounds and the page of records after the cursor, in one snapshot.
SELECT s.latest_sequence, s.earliest_sequence, s.closed_at IS NOT NULL AS closed,
       r.sequence, r.payload, r.size, r.appended_at, r.object::text AS object
  FROM workflow_streams.streams s
  LEFT JOIN LATERAL (
        SELECT rr.sequence, rr.payload, rr.size, rr.appended_at, rr.object
          FROM workflow_streams.records rr
         WHERE rr.stream_pk = s.stream_pk AND rr.sequence > $2
         ORDER BY rr.sequence
         LIMIT $3) r ON true
 WHERE s.stream_pk = $1
 ORDER BY r.sequence;

-- name: records_read_page_json
-- records_read with the page's records already as the API's JSON (http/codecs/json_bodies.py
-- record_json, byte for byte), joined with commas: Postgres writes the text, so a page
-- costs the server one string instead of a Python object per record and field. The
-- payload is stored as compact JSON text and spliced in as is; appended_at is written as
-- Python's datetime.isoformat() writes a UTC time (no fraction when it is zero). A page
-- holding a record with an object reference says so (has_objects) and carries no body:
-- its caller reads it with records_range instead (jsonb's text form is not compact).
-- Only the page's first piece is read: the records that start within $4 payload bytes of
-- its first one (at least that one). Sequences are dense, so the page is $2+1 .. $2+$3
-- (up to the latest); the caller reads the rest a piece at a time (records_range_json),
-- and a response never holds more than a piece in memory (http/middleware/write_budget.py).
-- Each record's fingerprint is workflow_streams.record_fingerprint's (inlined
-- by the planner). With $5 true, cursor_fingerprint is the fingerprint of the
-- record at the cursor (NULL: none), for a reader that sent one (store/fingerprint.py);
-- with $5 false its lookup is not run.
SELECT s.latest_sequence, s.earliest_sequence, s.closed_at IS NOT NULL AS closed,
       p.records, p.last_sequence, p.has_objects,
       CASE WHEN NOT p.has_objects THEN p.body END AS body,
       CASE WHEN $5::boolean THEN
            (SELECT workflow_streams.record_fingerprint(c.sequence, c.appended_at, c.size)
               FROM workflow_streams.records c
              WHERE c.stream_pk = $1 AND c.sequence = $2) END AS cursor_fingerprint
  FROM workflow_streams.streams s
 CROSS JOIN LATERAL (
        SELECT count(*) AS records, max(r.sequence) AS last_sequence,
               coalesce(bool_or(r.object IS NOT NULL), false) AS has_objects,
               string_agg('{"sequence":' || r.sequence || ',"payload":' || r.payload
                          || ',"size":' || r.size || ',"appended_at":"'
                          || to_char(r.appended_at AT TIME ZONE 'UTC',
                                     CASE WHEN date_trunc('second', r.appended_at) = r.appended_at
                                          THEN 'YYYY-MM-DD"T"HH24:MI:SS"+00:00"'
                                          ELSE 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"' END)
                          || '","object":null,"fingerprint":"'
                          || workflow_streams.record_fingerprint(r.sequence, r.appended_at, r.size)
                          || '"}', ',' ORDER BY r.sequence) AS body
          FROM (SELECT rr.sequence, rr.payload, rr.size, rr.appended_at, rr.object
                  FROM workflow_streams.records rr
                 WHERE rr.stream_pk = s.stream_pk AND rr.sequence > $2
                   AND rr.sequence <= $2 + $3
                   AND rr.cumulative_bytes - rr.size
                       < $4 + (SELECT f.cumulative_bytes - f.size
                                 FROM workflow_streams.records f
                                WHERE f.stream_pk = $1 AND f.sequence = $2 + 1)
                 ORDER BY rr.sequence
                 LIMIT $3) r) p
 WHERE s.stream_pk = $1;

-- name: records_range_json
-- One later piece of a page (records_read_page_json): the records after $2 up to $3
-- that start within $4 payload bytes of the first of them (at least that one), as
-- records_read_page_json writes them; no body when one refers to an object. The range
-- ends at most a few pieces further ($3, from the caller), so that the scan stops
-- there rather than at the page's end.
SELECT count(*) AS records, max(r.sequence) AS last_sequence,
       coalesce(bool_or(r.object IS NOT NULL), false) AS has_objects,
       string_agg('{"sequence":' || r.sequence || ',"payload":' || r.payload
                  || ',"size":' || r.size || ',"appended_at":"'
                  || to_char(r.appended_at AT TIME ZONE 'UTC',
                             CASE WHEN date_trunc('second', r.appended_at) = r.appended_at
                                  THEN 'YYYY-MM-DD"T"HH24:MI:SS"+00:00"'
                                  ELSE 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"' END)
                  || '","object":null,"fingerprint":"'
                  || workflow_streams.record_fingerprint(r.sequence, r.appended_at, r.size)
                  || '"}', ',' ORDER BY r.sequence)
         FILTER (WHERE r.object IS NULL) AS body
  FROM (SELECT rr.sequence, rr.payload, rr.size, rr.appended_at, rr.object
          FROM workflow_streams.records rr
         WHERE rr.stream_pk = $1 AND rr.sequence > $2 AND rr.sequence <= $3
           AND rr.cumulative_bytes - rr.size
               < $4 + (SELECT f.cumulative_bytes - f.size
                         FROM workflow_streams.records f
                        WHERE f.stream_pk = $1 AND f.sequence = $2 + 1)) r;

-- name: records_range
-- records_range_json's records as rows (for a reader with redaction, a piece with an
-- object reference, and DS pages).
SELECT rr.sequence, rr.payload, rr.size, rr.appended_at, rr.object::text AS object
  FROM workflow_streams.records rr
 WHERE rr.stream_pk = $1 AND rr.sequence > $2 AND rr.sequence <= $3
   AND rr.cumulative_bytes - rr.size
       < $4 + (SELECT f.cumulative_bytes - f.size
                 FROM workflow_streams.records f
                WHERE f.stream_pk = $1 AND f.sequence = $2 + 1)
 ORDER BY rr.sequence;
-- name: record_fingerprint_at
-- The stream's bounds and the fingerprint of its record at $2 (NULL: none), for a
-- subscriber or reader that resumes with the fingerprint of the record it saw there
-- (store/read.py verify_fingerprint). No row: no such stream.
SELECT s.latest_sequence, s.earliest_sequence,
       (SELECT workflow_streams.record_fingerprint(r.sequence, r.appended_at, r.size)
          FROM workflow_streams.records r
         WHERE r.stream_pk = s.stream_pk AND r.sequence = $2) AS fingerprint
  FROM workflow_streams.streams s
 WHERE s.stream_pk = $1;

-- name: records_read_bytes
-- records_read with a byte budget as well ($4, the sum of the records' sizes): the page
-- stops before the record that would pass it, but holds at least one record. Live
-- delivery reads this way, so that no catch-up page of large records costs a
-- subscriber more than its budget of memory.
SELECT s.latest_sequence, s.earliest_sequence, s.closed_at IS NOT NULL AS closed,
       r.sequence, r.payload, r.size, r.appended_at, r.object::text AS object
  FROM workflow_streams.streams s
  LEFT JOIN LATERAL (
        SELECT w.sequence, w.payload, w.size, w.appended_at, w.object
          FROM (SELECT rr.sequence, rr.payload, rr.size, rr.appended_at, rr.object,
                       sum(rr.size) OVER (ORDER BY rr.sequence) AS running
                  FROM workflow_streams.records rr
                 WHERE rr.stream_pk = s.stream_pk AND rr.sequence > $2
                 ORDER BY rr.sequence
                 LIMIT $3) w
         WHERE w.running - w.size < $4) r ON true
 WHERE s.stream_pk = $1
 ORDER BY r.sequence;

-- name: records_read_sse_frames
-- records_read_bytes' page ($3 records at most, at most $4 payload bytes but at least one
-- record) already written as the native SSE response's record events, joined: for each
-- record "event: record\nid: <sequence>\ndata: <its JSON>\n\n", the JSON exactly as
-- records_read_page_json writes it (http/routes/subscribe.py _record_frames, byte for
-- byte). The SSE backfill then costs the server one string per page, not a Python
-- object per record and field (docs/speed.md, "SSE backfill written by Postgres"). A
-- record that refers to an object (jsonb's text form is not compact) ends the framed
-- part: frames holds the records before it, object_next says that one was met; a page
-- that starts with one has no frames, and its caller reads it with records_read_bytes.
-- Without window functions (they were a third of the statement): the byte budget counts
-- from the page's first record with cumulative_bytes (the stream's running sum of
-- sizes), and b, one pass over the page's rows before the frames are written, finds
-- where it starts and its first record with an object.
SELECT s.latest_sequence, s.earliest_sequence, s.closed_at IS NOT NULL AS closed,
       p.records, p.last_sequence, b.first_object IS NOT NULL AS object_next, p.frames
  FROM workflow_streams.streams s
 CROSS JOIN (
        SELECT min(x.cumulative_bytes - x.size) AS start,
               min(x.sequence) FILTER (WHERE x.object IS NOT NULL) AS first_object
          FROM (SELECT xx.sequence, xx.size, xx.cumulative_bytes, xx.object
                  FROM workflow_streams.records xx
                 WHERE xx.stream_pk = $1 AND xx.sequence > $2
                 ORDER BY xx.sequence
                 LIMIT $3) x) b
 CROSS JOIN LATERAL (
        SELECT count(*) AS records, max(w.sequence) AS last_sequence,
               string_agg(E'event: record\nid: ' || w.sequence
                          || E'\ndata: {"sequence":' || w.sequence || ',"payload":' || w.payload
                          || ',"size":' || w.size || ',"appended_at":"'
                          || to_char(w.appended_at AT TIME ZONE 'UTC',
                                     CASE WHEN date_trunc('second', w.appended_at) = w.appended_at
                                          THEN 'YYYY-MM-DD"T"HH24:MI:SS"+00:00"'
                                          ELSE 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"' END)
                          || '","object":null,"fingerprint":"'
                          || workflow_streams.record_fingerprint(w.sequence, w.appended_at, w.size)
                          || E'"}\n\n', '' ORDER BY w.sequence) AS frames
          FROM (SELECT rr.sequence, rr.payload, rr.size, rr.appended_at, rr.cumulative_bytes
                  FROM workflow_streams.records rr
                 WHERE rr.stream_pk = $1 AND rr.sequence > $2
                 ORDER BY rr.sequence
                 LIMIT $3) w
         WHERE w.cumulative_bytes - w.size - b.start < $4
           AND (b.first_object IS NULL OR w.sequence < b.first_object)) p
 WHERE s.stream_pk = $1;

-- name: records_append
-- The 7-argument form: notifies inside its own transaction, at commit. Not on the HTTP
-- append path (records_append_group); tests/speed/test_wakes.py checks that form with it.
SELECT request_index, outcome, first_sequence, last_sequence
  FROM workflow_streams.append_requests($1, $2::integer[], $3::text[], $4::text[],
                                        $5::text[], $6::integer[], $7::jsonb[]);

-- name: consumer_ack
SELECT outcome, acked_sequence FROM workflow_streams.ack_consumer($1, $2, $3);

-- name: stream_close
WITH closed AS (
    UPDATE workflow_streams.streams
       SET closed_at = coalesce(closed_at, now())
     WHERE stream_pk = $1
    RETURNING latest_sequence
), wake AS (
    SELECT pg_notify('workflow_streams', 'c' || $1::text) FROM closed
)
SELECT latest_sequence FROM closed, (SELECT count(*) FROM wake) w;

-- name: stream_set_legal_hold
UPDATE workflow_streams.streams
   SET legal_hold = $2, legal_hold_reason = $3
 WHERE stream_pk = $1;

-- name: append_receipts_with_prefix
-- The stream's append receipts whose idempotency key starts with $2, in sequence order:
-- an activity's stream writer finds what earlier attempts of the activity appended
-- (their keys share a prefix, ductor_streams/plugin/streaming/keys.py). Reads only the
-- stream's own receipts (the primary key's first column).
SELECT idempotency_key, first_sequence, last_sequence
  FROM workflow_streams.append_receipts
 WHERE stream_pk = $1 AND starts_with(idempotency_key, $2)
 ORDER BY first_sequence;

-- name: records_read_bytes_many
-- records_read_bytes for several streams in one statement, one snapshot for all: $1 the
-- streams, $2 their cursors, $3 their limits, $4 the byte budget of each page. Each row
-- carries the 1-based index of its request (a stream that does not exist has none).
-- Live followers woken in the same turn of the event loop read this way
-- (live/read_batch.py): one statement instead of one per stream. The stream rows are
-- looked up one by one (LATERAL ... LIMIT 1: a plain join was planned as a hash join
-- over a sequential scan of every stream).
SELECT q.i, s.latest_sequence, s.earliest_sequence, s.closed_at IS NOT NULL AS closed,
       r.sequence, r.payload, r.size, r.appended_at, r.object::text AS object
  FROM unnest($1::bigint[], $2::bigint[], $3::int[]) WITH ORDINALITY AS q(stream_pk, after, lim, i)
 CROSS JOIN LATERAL (
        SELECT ss.latest_sequence, ss.earliest_sequence, ss.closed_at
          FROM workflow_streams.streams ss
         WHERE ss.stream_pk = q.stream_pk
         LIMIT 1) s
  LEFT JOIN LATERAL (
        SELECT w.sequence, w.payload, w.size, w.appended_at, w.object
          FROM (SELECT rr.sequence, rr.payload, rr.size, rr.appended_at, rr.object,
                       sum(rr.size) OVER (ORDER BY rr.sequence) AS running
                  FROM workflow_streams.records rr
                 WHERE rr.stream_pk = q.stream_pk AND rr.sequence > q.after
                 ORDER BY rr.sequence
                 LIMIT q.lim) w
         WHERE w.running - w.size < $4) r ON true
 ORDER BY q.i, r.sequence;

-- name: stream_credit_probe
-- Whether a request refused for credit is worth sending again now (store/credit_wait.py):
-- false only while the stream's row shows that the unread ceilings would still refuse
-- $2 records of $3 bytes and nothing else would decide first (the stream is open, the
-- total ceilings let them in, and no receipt answers key $4). It reads a few columns
-- of one row, without its lock and without the payload: the append function still
-- decides, under the lock, whatever this answers. No row (the stream is gone): true,
-- so that the append function answers not_found.
SELECT coalesce((
    SELECT s.closed_at IS NOT NULL
        OR (s.definition -> 'credit' ->> 'max_total_items' IS NOT NULL
            AND s.total_items + $2
                > workflow_streams.clamped_count(s.definition -> 'credit' ->> 'max_total_items'))
        OR (s.definition -> 'credit' ->> 'max_total_bytes' IS NOT NULL
            AND s.total_bytes + $3
                > workflow_streams.clamped_count(s.definition -> 'credit' ->> 'max_total_bytes'))
        OR s.min_acked_sequence IS NULL
        OR ((s.definition -> 'credit' ->> 'max_unread_items' IS NULL
             OR s.latest_sequence - s.min_acked_sequence + $2
                <= workflow_streams.clamped_count(s.definition -> 'credit' ->> 'max_unread_items'))
            AND (s.definition -> 'credit' ->> 'max_unread_bytes' IS NULL
                 OR s.total_bytes - s.min_acked_bytes + $3
                    <= workflow_streams.clamped_count(s.definition -> 'credit' ->> 'max_unread_bytes')))
        OR ($4::text IS NOT NULL AND EXISTS (
               SELECT 1 FROM workflow_streams.append_receipts r
                WHERE r.stream_pk = s.stream_pk AND r.idempotency_key = $4::text))
      FROM workflow_streams.streams s
     WHERE s.stream_pk = $1), true) AS worth_sending;
