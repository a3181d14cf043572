-- 0024: at most 10,000 Durable Streams producers per stream.
--
-- A producer's row lives as long as its stream (retention prunes records, not writer
-- state), so a writer inventing a new Producer-Id per request grew ds_producers without
-- limit. ds_append now refuses the first write of a new producer on a stream that has
-- 10,000 already, with the outcome
--   too_many_producers  a new producer on a stream at the cap: nothing written
-- decided under the stream's row lock like every other check. Producers the stream
-- knows keep writing. Otherwise 0021's function unchanged (the form without p_trace
-- calls this one).

CREATE OR REPLACE FUNCTION workflow_streams.ds_append(
    p_stream_pk  bigint,
    p_payloads   text[],
    p_sizes      integer[],
    p_hash       text,
    p_close      boolean,
    p_stream_seq text,
    p_producer   text,
    p_epoch      bigint,
    p_seq        bigint,
    p_trace      text
) RETURNS TABLE (outcome text, first_sequence bigint, last_sequence bigint,
                 latest_sequence bigint, closed boolean,
                 producer_epoch bigint, producer_seq bigint)
LANGUAGE plpgsql AS $$
DECLARE
    s   workflow_streams.streams%ROWTYPE;
    w   workflow_streams.ds_stream_writers%ROWTYPE;
    pr  workflow_streams.ds_producers%ROWTYPE;
    r   record;
    v_n integer := coalesce(array_length(p_payloads, 1), 0);
BEGIN
    SELECT * INTO s FROM workflow_streams.streams WHERE stream_pk = p_stream_pk FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN NEXT;
        RETURN;
    END IF;
    latest_sequence := s.latest_sequence;
    closed := s.closed_at IS NOT NULL;
    producer_epoch := p_epoch;
    producer_seq := p_seq;
    SELECT * INTO w FROM workflow_streams.ds_stream_writers WHERE stream_pk = p_stream_pk;

    IF s.closed_at IS NOT NULL THEN
        IF p_producer IS NOT NULL AND w.closed_by_producer = p_producer
           AND w.closed_by_epoch = p_epoch AND w.closed_by_seq = p_seq THEN
            outcome := 'duplicate';
        ELSIF p_close AND v_n = 0 AND p_producer IS NULL THEN
            outcome := 'already_closed';
        ELSE
            outcome := 'stream_closed';
        END IF;
        RETURN NEXT;
        RETURN;
    END IF;

    IF p_producer IS NOT NULL THEN
        SELECT * INTO pr FROM workflow_streams.ds_producers
         WHERE stream_pk = p_stream_pk AND producer_id = p_producer;
        IF NOT FOUND THEN
            IF p_seq <> 0 THEN
                outcome := 'seq_gap';
                producer_seq := 0;
            ELSIF (SELECT count(*) FROM (SELECT 1 FROM workflow_streams.ds_producers
                                          WHERE stream_pk = p_stream_pk LIMIT 10000) known)
                  >= 10000 THEN
                -- http/ds/writes.py MAX_PRODUCERS: counted under the stream's row lock,
                -- so concurrent new producers cannot pass the cap together.
                outcome := 'too_many_producers';
            END IF;
        ELSIF p_epoch < pr.epoch THEN
            outcome := 'stale_epoch';
            producer_epoch := pr.epoch;
        ELSIF p_epoch > pr.epoch THEN
            IF p_seq <> 0 THEN
                outcome := 'epoch_seq';
            END IF;
        ELSIF p_seq <= pr.last_seq THEN
            outcome := 'duplicate';
            producer_seq := pr.last_seq;
        ELSIF p_seq > pr.last_seq + 1 THEN
            outcome := 'seq_gap';
            producer_seq := pr.last_seq + 1;
        END IF;
        IF outcome IS NOT NULL THEN
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;

    IF p_stream_seq IS NOT NULL AND w.last_stream_seq IS NOT NULL
       AND p_stream_seq COLLATE "C" <= w.last_stream_seq COLLATE "C" THEN
        outcome := 'stream_seq_conflict';
        RETURN NEXT;
        RETURN;
    END IF;

    IF v_n > 0 THEN
        SELECT * INTO r
          FROM workflow_streams.append_requests(
                   p_stream_pk, ARRAY[v_n], ARRAY[NULL::text], ARRAY[p_hash],
                   p_payloads, p_sizes, NULL::jsonb[], true,
                   CASE WHEN p_trace IS NULL THEN NULL ELSE ARRAY[p_trace] END) a;
        IF r.outcome <> 'appended' THEN
            outcome := r.outcome;
            RETURN NEXT;
            RETURN;
        END IF;
        first_sequence := r.first_sequence;
        last_sequence := r.last_sequence;
        latest_sequence := r.last_sequence;
    END IF;

    IF p_close THEN
        UPDATE workflow_streams.streams SET closed_at = now() WHERE stream_pk = p_stream_pk;
        -- The close wake of stream_close (schema/sql/streams.sql): followers read the end.
        PERFORM pg_notify('workflow_streams', 'c' || p_stream_pk::text);
        closed := true;
    END IF;

    IF p_producer IS NOT NULL THEN
        INSERT INTO workflow_streams.ds_producers (stream_pk, producer_id, epoch, last_seq)
        VALUES (p_stream_pk, p_producer, p_epoch, p_seq)
        ON CONFLICT (stream_pk, producer_id)
        DO UPDATE SET epoch = excluded.epoch, last_seq = excluded.last_seq, updated_at = now();
    END IF;
    IF p_stream_seq IS NOT NULL OR (p_close AND p_producer IS NOT NULL) THEN
        INSERT INTO workflow_streams.ds_stream_writers
               (stream_pk, last_stream_seq, closed_by_producer, closed_by_epoch, closed_by_seq)
        VALUES (p_stream_pk, p_stream_seq,
                CASE WHEN p_close THEN p_producer END,
                CASE WHEN p_close THEN p_epoch END,
                CASE WHEN p_close THEN p_seq END)
        ON CONFLICT (stream_pk) DO UPDATE
           SET last_stream_seq = coalesce(excluded.last_stream_seq,
                                          workflow_streams.ds_stream_writers.last_stream_seq),
               closed_by_producer = coalesce(excluded.closed_by_producer,
                                             workflow_streams.ds_stream_writers.closed_by_producer),
               closed_by_epoch = coalesce(excluded.closed_by_epoch,
                                          workflow_streams.ds_stream_writers.closed_by_epoch),
               closed_by_seq = coalesce(excluded.closed_by_seq,
                                        workflow_streams.ds_stream_writers.closed_by_seq);
    END IF;
    outcome := 'appended';
    RETURN NEXT;
END;
$$;
