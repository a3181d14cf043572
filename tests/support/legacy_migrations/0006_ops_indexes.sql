-- 0006: indexes for the operator views (issue 8). Operators filter deliveries by state
-- and page them by id, and look for what is not delivered yet per stream; neither may
-- scan every delivered row ever written.

-- `?state=dead` (or any state) paged by delivery_id, and the per-state counts.
CREATE INDEX input_deliveries_state ON workflow_streams.input_deliveries (state, delivery_id);

-- Per-stream lag: only the rows still owed to a workflow.
CREATE INDEX input_deliveries_undelivered ON workflow_streams.input_deliveries (stream_pk, sequence)
    WHERE state <> 'delivered';

-- Gap evidence of one stream, newest first.
CREATE INDEX gap_evidence_stream ON workflow_streams.gap_evidence (stream_pk, gap_id);
