-- 0038: append_stream_groups always runs its statements with their generic plans.
--
-- Postgres caches the plan of each statement inside a plpgsql function per session, and
-- for a statement with parameters it chooses on every call between a generic plan (made
-- once) and a custom plan (made again for this call's values), by comparing the generic
-- plan's estimated cost with the average cost of the custom plans it made so far. A
-- custom plan of a statement over the unnest of a short array is estimated cheaper than
-- the generic plan (which assumes a few rows), so on a connection whose first
-- statements were small the average stays low and every later call plans its
-- statements again; a connection that began with large statements uses the generic
-- plans. Which one a connection gets depends on its history, and planning was a third
-- of Postgres's CPU for a statement of 1-4 streams (docs/speed.md, "Generic plans for
-- the several-stream statement").
--
-- The generic plans are the ones a connection gets once its statements grew large:
-- index lookups only (0037's SET clauses), the same plans at every size. Nothing else
-- changes: outcomes, rows, locks and wakes are the function's own.
ALTER FUNCTION workflow_streams.append_stream_groups(
    bigint[], integer[], integer[], integer[], text[], text[], text[], integer[], jsonb[],
    boolean, text[])
    SET plan_cache_mode = force_generic_plan;
