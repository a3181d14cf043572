"""What a failover that lost commits leaves behind, made directly in SQL.

With asynchronous replication the promoted standby never had the old primary's last
commits: their records, their receipts and the stream row's counters as those commits
left them are simply not there. ``lose_commits_after`` makes a stream look exactly so;
the next append then reuses the lost sequences for other records.
"""

from __future__ import annotations

import asyncpg


async def lose_commits_after(pool: asyncpg.Pool, stream_pk: int, keep: int) -> None:
    """Remove every record after sequence ``keep`` (and its append receipts), and set the
    stream's counters back to what they were when ``keep`` was the latest sequence."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "DELETE FROM workflow_streams.records WHERE stream_pk = $1 AND sequence > $2",
            stream_pk,
            keep,
        )
        await conn.execute(
            "DELETE FROM workflow_streams.append_receipts"
            " WHERE stream_pk = $1 AND first_sequence > $2",
            stream_pk,
            keep,
        )
        await conn.execute(
            """
            UPDATE workflow_streams.streams s
               SET latest_sequence = $2,
                   total_items = $2,
                   total_bytes = coalesce((SELECT sum(r.size) FROM workflow_streams.records r
                                            WHERE r.stream_pk = s.stream_pk), 0)
             WHERE s.stream_pk = $1
            """,
            stream_pk,
            keep,
        )
