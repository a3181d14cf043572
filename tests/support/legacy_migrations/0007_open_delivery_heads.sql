-- 0007: the first open delivery of every stream, as one view, so that the dispatcher's
-- claim and its next-due query share one definition of "a stream's head" (a skip scan
-- over input_deliveries_open from 0003: one index probe per stream with open rows).
CREATE VIEW workflow_streams.open_delivery_heads AS
WITH RECURSIVE lanes AS (
    (SELECT o.stream_pk, o.sequence
       FROM workflow_streams.input_deliveries o
      WHERE o.state IN ('pending', 'retrying')
      ORDER BY o.stream_pk, o.sequence
      LIMIT 1)
    UNION ALL
    SELECT n.stream_pk, n.sequence
      FROM lanes l
     CROSS JOIN LATERAL (
            SELECT o.stream_pk, o.sequence
              FROM workflow_streams.input_deliveries o
             WHERE o.state IN ('pending', 'retrying') AND o.stream_pk > l.stream_pk
             ORDER BY o.stream_pk, o.sequence
             LIMIT 1) n
)
SELECT stream_pk, sequence FROM lanes;
