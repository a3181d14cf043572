-- 0003: input delivery in sequence order per stream.
-- The dispatcher finds each stream's first open delivery (its "head") with a loose index
-- scan over this index, so a claim costs O(streams with open work), not O(open rows),
-- and checks "no earlier open row" with one probe.
CREATE INDEX input_deliveries_open ON workflow_streams.input_deliveries (stream_pk, sequence)
    WHERE state IN ('pending', 'retrying');
