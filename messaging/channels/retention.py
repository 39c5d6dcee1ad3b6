"""Where channel history ends: what was published longer ago than the app's retention goes (the
hourly beat task messaging.tasks.expire_channel_history), as docs/protocol.md promises.

Oldest first per channel, so the offsets that remain never have holes: a channel's history is cut
below its first message still within retention (an older message behind it waits for it). Offsets
are gap-free, so a cut `[first, upto)` removes at most `upto - first` rows: a run is split into
statements of at most `batch` rows each, and a large expiry never holds one long lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from django.db import connection

HISTORY_EXPIRE_BATCH = 10_000  # rows one DELETE statement removes at most


@dataclass(frozen=True)
class _Expired:
    channel_id: int
    first: int  # the channel's oldest offset
    cutoff: int  # offsets below it are past the retention


def _expired() -> list[_Expired]:
    # One snapshot: a channel none of whose messages is recent is cut below last_offset + 1, and a
    # publish committing later gets a higher offset, so it is never cut by this run.
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT c.id, f.first, COALESCE(k.first_kept, c.last_offset + 1)
              FROM messaging_channel c
              JOIN apps_registry_clientapp a ON a.id = c.app_id
             CROSS JOIN LATERAL (SELECT min(m."offset") AS first FROM messaging_channelmessage m
                                  WHERE m.channel_id = c.id) f
              LEFT JOIN LATERAL (SELECT x."offset" AS first_kept FROM messaging_channelmessage x
                                  WHERE x.channel_id = c.id
                                    AND x.created_at >= now() - make_interval(days => a.retention_days)
                                  ORDER BY x."offset" LIMIT 1) k ON true
             WHERE f.first < COALESCE(k.first_kept, c.last_offset + 1)
             ORDER BY c.id
            """
        )
        return [_Expired(*row) for row in cur.fetchall()]


def _batches(expired: list[_Expired], batch: int) -> Iterator[list[tuple[int, int]]]:
    """(channel id, delete below this offset) pairs, at most `batch` rows per list, oldest first."""
    cuts: list[tuple[int, int]] = []
    room = batch
    for item in expired:
        start = item.first
        while start < item.cutoff:
            upto = min(item.cutoff, start + room)
            cuts.append((item.channel_id, upto))
            room -= upto - start
            start = upto
            if room == 0:
                yield cuts
                cuts, room = [], batch
    if cuts:
        yield cuts


def channel_history_expire(*, batch: int = HISTORY_EXPIRE_BATCH) -> int:
    """Drop history older than each app's retention; returns how many messages went."""
    total = 0
    for cuts in _batches(_expired(), batch):
        with connection.cursor() as cur:
            # Served by the (channel, offset) unique index. The flood's rows of those publishes
            # (messaging.federation: waiting on a link, or given up) go with them, in the same statement:
            # the foreign key has no cascade in the database, and the publish is no more to be sent.
            cur.execute(
                """
                WITH gone AS (
                    DELETE FROM messaging_channelmessage m
                     USING unnest(%s::bigint[], %s::bigint[]) AS cut(channel_id, upto)
                     WHERE m.channel_id = cut.channel_id AND m."offset" < cut.upto
                    RETURNING m.id
                ), forwards AS (
                    DELETE FROM messaging_channelforward f USING gone WHERE f.publish_id = gone.id
                )
                SELECT count(*) FROM gone
                """,
                [[c for c, _ in cuts], [u for _, u in cuts]],
            )
            total += cur.fetchone()[0]
    return total
