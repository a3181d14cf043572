-- Operator views of input delivery and gap evidence (issue 8): `-- name: <entity>_<verb>`.
-- Every query takes the caller's visibility first: $1 tenant (NULL = every tenant, the
-- CLI on the database host) and $2 run IDs (NULL = every run of the tenant). A delivery
-- outside them does not exist for the caller.

-- name: ops_deliveries_list
-- Keyset page in delivery_id order (oldest first): $3 state, $4 run, $5 stream,
-- $6 minimum age in seconds (created at least that long ago), $7 after this id, $8 limit.
SELECT d.delivery_id, s.tenant, s.run_id, s.stream_id, d.sequence, d.state, d.attempts,
       d.last_error, d.next_attempt_at, d.delivered_at, d.created_at, d.retried_by,
       d.retried_at, d.lease_owner, d.lease_expires_at
  FROM workflow_streams.input_deliveries d
  JOIN workflow_streams.streams s ON s.stream_pk = d.stream_pk
 WHERE ($1::text IS NULL OR s.tenant = $1)
   AND ($2::text[] IS NULL OR s.run_id = ANY($2::text[]))
   AND ($3::text IS NULL OR d.state = $3)
   AND ($4::text IS NULL OR s.run_id = $4)
   AND ($5::text IS NULL OR s.stream_id = $5)
   AND ($6::float8 IS NULL OR d.created_at <= now() - make_interval(secs => $6::float8))
   AND d.delivery_id > $7
 ORDER BY d.delivery_id
 LIMIT $8;

-- name: ops_delivery_get
-- One delivery with its record's size and payload text (NULL once retention removed
-- it); the caller decides whether the payload may be shown.
SELECT d.delivery_id, s.tenant, s.run_id, s.stream_id, d.sequence, d.state, d.attempts,
       d.last_error, d.next_attempt_at, d.delivered_at, d.created_at, d.retried_by,
       d.retried_at, d.lease_owner, d.lease_expires_at,
       r.size AS record_size, r.appended_at AS record_appended_at, r.payload AS record_payload
  FROM workflow_streams.input_deliveries d
  JOIN workflow_streams.streams s ON s.stream_pk = d.stream_pk
  LEFT JOIN workflow_streams.records r ON r.stream_pk = d.stream_pk AND r.sequence = d.sequence
 WHERE d.delivery_id = $3
   AND ($1::text IS NULL OR s.tenant = $1)
   AND ($2::text[] IS NULL OR s.run_id = ANY($2::text[]));

-- name: ops_delivery_retry
-- dead -> pending, due now, with a fresh attempt budget and no lease; the audit columns
-- say who and when. No row when the delivery is invisible or not dead. The wake lets
-- any dispatcher that follows the stream's record wakes pick it up at once.
WITH retried AS (
    UPDATE workflow_streams.input_deliveries d
       SET state = 'pending', attempts = 0, next_attempt_at = now(),
           lease_owner = NULL, lease_expires_at = NULL,
           retried_by = $4, retried_at = now()
      FROM workflow_streams.streams s
     WHERE d.delivery_id = $3
       AND d.state = 'dead'
       AND s.stream_pk = d.stream_pk
       AND ($1::text IS NULL OR s.tenant = $1)
       AND ($2::text[] IS NULL OR s.run_id = ANY($2::text[]))
    RETURNING d.delivery_id, d.stream_pk
), wake AS (
    SELECT pg_notify('workflow_streams', 'r' || stream_pk::text) FROM retried
)
SELECT delivery_id FROM retried, (SELECT count(*) FROM wake) w;

-- name: ops_deliveries_count_by_state
-- Deliveries per state of the visible streams.
SELECT d.state, count(*) AS deliveries
  FROM workflow_streams.input_deliveries d
  JOIN workflow_streams.streams s ON s.stream_pk = d.stream_pk
 WHERE ($1::text IS NULL OR s.tenant = $1)
   AND ($2::text[] IS NULL OR s.run_id = ANY($2::text[]))
 GROUP BY d.state;

-- name: ops_deliveries_count_all
-- Deliveries per state, every tenant (metrics): an index-only scan of
-- input_deliveries_state, however many delivered rows there are.
SELECT state, count(*) AS deliveries
  FROM workflow_streams.input_deliveries
 GROUP BY state;

-- name: ops_deliveries_oldest_owed
-- Age in seconds of the oldest visible delivery still to be made (pending or retrying);
-- NULL when there is none. Reads owed rows only (the partial indexes), never delivered ones.
SELECT extract(epoch FROM now() - min(d.created_at))::float8 AS oldest_age_seconds
  FROM workflow_streams.input_deliveries d
  JOIN workflow_streams.streams s ON s.stream_pk = d.stream_pk
 WHERE d.state IN ('pending', 'retrying')
   AND ($1::text IS NULL OR s.tenant = $1)
   AND ($2::text[] IS NULL OR s.run_id = ANY($2::text[]));

-- name: ops_streams_lag
-- Streams that still owe deliveries, the longest waiting first ($3 limit): how many are
-- owed in each state, since when, and how far delivery got.
SELECT s.run_id, s.stream_id, s.latest_sequence,
       count(*) FILTER (WHERE d.state = 'pending') AS pending,
       count(*) FILTER (WHERE d.state = 'retrying') AS retrying,
       count(*) FILTER (WHERE d.state = 'dead') AS dead,
       min(d.sequence) AS first_undelivered_sequence,
       extract(epoch FROM now() - min(d.created_at))::float8 AS lag_seconds,
       (SELECT max(x.delivered_at) FROM workflow_streams.input_deliveries x
         WHERE x.stream_pk = s.stream_pk AND x.state = 'delivered') AS last_delivered_at
  FROM workflow_streams.input_deliveries d
  JOIN workflow_streams.streams s ON s.stream_pk = d.stream_pk
 WHERE d.state <> 'delivered'
   AND ($1::text IS NULL OR s.tenant = $1)
   AND ($2::text[] IS NULL OR s.run_id = ANY($2::text[]))
 GROUP BY s.stream_pk, s.run_id, s.stream_id, s.latest_sequence
 ORDER BY min(d.created_at), s.stream_pk
 LIMIT $3;

-- name: ops_gaps_list
-- Gap evidence recorded by live delivery, newest first: $3 run, $4 stream, $5 before
-- this gap_id (NULL = from the newest), $6 limit.
SELECT g.gap_id, s.run_id, s.stream_id, g.expected_sequence, g.received_sequence,
       g.repaired_records, g.detected_by, g.detected_at
  FROM workflow_streams.gap_evidence g
  JOIN workflow_streams.streams s ON s.stream_pk = g.stream_pk
 WHERE ($1::text IS NULL OR s.tenant = $1)
   AND ($2::text[] IS NULL OR s.run_id = ANY($2::text[]))
   AND ($3::text IS NULL OR s.run_id = $3)
   AND ($4::text IS NULL OR s.stream_id = $4)
   AND ($5::bigint IS NULL OR g.gap_id < $5)
 ORDER BY g.gap_id DESC
 LIMIT $6;
