-- The Durable Streams endpoint (http/fronts/ds/, docs/durable-streams.md). Named blocks as
-- everywhere.

-- name: ds_append
-- One DS write with its writer checks (workflow_streams.ds_append): $2 payloads, $3 sizes, $4 the
-- request hash, $5 close, $6 Stream-Seq, $7-$9 producer id, epoch, seq (NULL: none),
-- $10 the request's traceparent for input delivery rows (NULL: none).
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
-- A DS catch-up page after `after` (a NULL cursor, $2, is the DS offset -1: from the
-- first retained record): at most $3 records and about $4 payload bytes (records that
-- start within $4 bytes of the first, at least one), with the page's last sequence
-- (page_last) and only its first piece of records: those that start within $5 bytes of
-- the first. The caller reads the rest a piece at a time (records_range), so a response
-- never holds more than a piece in memory. read_page's cursor rules; `after` is the
-- cursor the page was read after. Sequences are dense and cumulative_bytes is the
-- stream's running sum of sizes, so the page's bounds need no payload.
SELECT s.latest_sequence, s.earliest_sequence, s.closed_at IS NOT NULL AS closed,
       c.after, e.page_last, r.sequence, r.payload, r.size, r.appended_at,
       r.object::text AS object
  FROM workflow_streams.streams s
 CROSS JOIN LATERAL (SELECT coalesce($2::bigint, s.earliest_sequence - 1) AS after) c
 CROSS JOIN LATERAL (
        -- least(): an offset past the tail finds nothing (CursorInFuture), not an overflow
        SELECT min(f.cumulative_bytes - f.size) AS start
          FROM workflow_streams.records f
         WHERE f.stream_pk = s.stream_pk
           AND f.sequence = least(c.after, s.latest_sequence) + 1) b
 CROSS JOIN LATERAL (
        SELECT max(y.sequence) AS page_last
          FROM workflow_streams.records y
         WHERE y.stream_pk = s.stream_pk AND y.sequence > c.after
           AND y.sequence <= least(c.after, s.latest_sequence) + $3
           AND y.cumulative_bytes - y.size < b.start + $4) e
  LEFT JOIN LATERAL (
        SELECT rr.sequence, rr.payload, rr.size, rr.appended_at, rr.object
          FROM workflow_streams.records rr
         WHERE rr.stream_pk = s.stream_pk AND rr.sequence > c.after
           AND rr.sequence <= e.page_last
           AND rr.cumulative_bytes - rr.size < b.start + $5) r ON true
 WHERE s.stream_pk = $1
 ORDER BY r.sequence;
