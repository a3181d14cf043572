-- Readiness (http/routes/health.py): `-- name: <entity>_<verb>`.

-- name: health_takes_writes
-- Whether this session may write: false on a hot standby (in recovery), and on a
-- primary that is read-only for now (default_transaction_read_only on, as a failover
-- manager keeps a promoted node for a moment, or an old connection to a demoted one).
SELECT current_setting('transaction_read_only') = 'off'

-- name: doctor_notify
-- The doctor's LISTEN check (doctor/checks.py): one notification on the channel $1 that
-- its listener subscribed to, the channel a parameter rather than spliced into SQL.
SELECT pg_notify($1, '')
