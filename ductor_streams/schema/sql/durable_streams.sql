-- The Durable Streams endpoint (http/ds/, docs/durable-streams.md). Named blocks as
-- everywhere.

-- name: ds_append
-- One DS write with its writer checks (migration 0016): $2 payloads, $3 sizes, $4 the
-- request hash, $5 close, $6 Stream-Seq, $7-$9 producer id, epoch, seq (NULL: none),
-- $10 the request's traceparent for input delivery rows (NULL: none; migration 0021).
SELECT outcome, first_sequence, last_sequence, latest_sequence, closed,
       producer_epoch, producer_seq
  FROM workflow_streams.ds_append($1, $2::text[], $3::integer[], $4, $5, $6, $7, $8, $9,
                                  $10::text);

-- name: ds_stream_head
-- The stream's tail and whether it is closed (HEAD, offset=now, the 409 of a closed
-- stream).
SELECT latest_sequence, earliest_sequence, closed_at IS NOT NULL AS closed
  FROM workflow_streams.streams
 WHERE stream_pk = $1;

-- name: ds_records_read
-- records_read_bytes (streams.sql) where a NULL cursor ($2) is the DS offset -1: from the
-- first retained record. `after` is the cursor the page was read after.
SELECT s.latest_sequence, s.earliest_sequence, s.closed_at IS NOT NULL AS closed,
       c.after, r.sequence, r.payload, r.size, r.appended_at, r.object::text AS object
  FROM workflow_streams.streams s
 CROSS JOIN LATERAL (SELECT coalesce($2::bigint, s.earliest_sequence - 1) AS after) c
  LEFT JOIN LATERAL (
        SELECT w.sequence, w.payload, w.size, w.appended_at, w.object
          FROM (SELECT rr.sequence, rr.payload, rr.size, rr.appended_at, rr.object,
                       sum(rr.size) OVER (ORDER BY rr.sequence) AS running
                  FROM workflow_streams.records rr
                 WHERE rr.stream_pk = s.stream_pk AND rr.sequence > c.after
                 ORDER BY rr.sequence
                 LIMIT $3) w
         WHERE w.running - w.size < $4) r ON true
 WHERE s.stream_pk = $1
 ORDER BY r.sequence;
