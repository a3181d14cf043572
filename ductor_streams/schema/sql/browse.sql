-- Browsing a tenant's streams (the console, issue 22): `-- name: <entity>_<verb>`.

-- name: streams_browse
-- One keyset page of the streams a caller may read, newest activity first. Activity is
-- the latest of: created, the newest record appended (the record at latest_sequence,
-- one primary-key lookup), closed. $1 tenant; $2 run IDs the token covers (NULL = every
-- run); $3 the principal (a stream lists only if its readers name it or '*'); $4 exactly
-- this run; $5 runs starting with this prefix; $6 direction; $7 closed or not; $8 and $9
-- the last (activity, stream_pk) of the page before (NULL = from the newest); $10 limit.
-- Each page reads the matching streams of the tenant once (streams_key's leading column).
SELECT x.*
  FROM (SELECT s.stream_pk, s.run_id, s.stream_id, s.direction, s.definition::text AS definition,
               s.latest_sequence, s.earliest_sequence, s.total_items, s.total_bytes,
               CASE WHEN s.min_acked_sequence IS NULL THEN 0
                    ELSE s.latest_sequence - s.min_acked_sequence END AS unread_items,
               CASE WHEN s.min_acked_sequence IS NULL THEN 0
                    ELSE s.total_bytes - s.min_acked_bytes END AS unread_bytes,
               s.closed_at, s.legal_hold, s.created_at, r.appended_at AS last_append_at,
               greatest(s.created_at, r.appended_at, s.closed_at) AS activity_at
          FROM workflow_streams.streams s
          LEFT JOIN workflow_streams.records r
                 ON r.stream_pk = s.stream_pk AND r.sequence = s.latest_sequence
         WHERE s.tenant = $1
           AND ($2::text[] IS NULL OR s.run_id = ANY($2::text[]))
           AND (s.definition #> '{authorization,readers}') ?| ARRAY['*', $3::text]
           AND ($4::text IS NULL OR s.run_id = $4)
           AND ($5::text IS NULL OR starts_with(s.run_id, $5))
           AND ($6::text IS NULL OR s.direction = $6)
           AND ($7::boolean IS NULL OR (s.closed_at IS NOT NULL) = $7)) x
 WHERE ($8::timestamptz IS NULL OR (x.activity_at, x.stream_pk) < ($8::timestamptz, $9::bigint))
 ORDER BY x.activity_at DESC, x.stream_pk DESC
 LIMIT $10;
