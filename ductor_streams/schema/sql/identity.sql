-- The database cluster a process runs against (ductor_streams/store/identity.py).

-- name: database_identity
-- The cluster this connection reaches: its system identifier (shared by a primary and
-- its physical standbys; another one after a restore into a new cluster) and its
-- timeline (a promotion starts a new one). On a primary the timeline is that of the WAL
-- being written: pg_control_checkpoint()'s changes only at the next checkpoint, which a
-- promotion requests but does not wait for. In recovery (a standby) it is the last
-- checkpoint's. Both functions are executable by any role on a stock Postgres; a
-- managed one may refuse them (store/identity.py then stops asking).
SELECT (SELECT system_identifier FROM pg_control_system()) AS system_identifier,
       CASE WHEN pg_is_in_recovery()
            THEN (SELECT timeline_id FROM pg_control_checkpoint())::bigint
            ELSE ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint
       END AS timeline;
