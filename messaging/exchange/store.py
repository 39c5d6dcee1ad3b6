"""The exchange's durable half: an app's follow graph and state in Postgres, loaded at start and
written in group commits (one transaction per batch, bulk SQL over arrays, never a query per event)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db import connection, transaction

from messaging.exchange.models import ExchangeState, Follow

_FOLLOW = Follow._meta.db_table
_STATE = ExchangeState._meta.db_table


def exchange_state_load(*, app_id: int) -> ExchangeState:
    """The app's state row (made on first use): the engine resumes at applied_seq + 1."""
    state, _ = ExchangeState.objects.get_or_create(app_id=app_id)
    return state


def follow_graph_load(*, app_id: int) -> dict[int, set[int]]:
    """Followers per followee, as the engine keeps them in memory."""
    followers: dict[int, set[int]] = {}
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT followee, follower FROM {_FOLLOW} WHERE app_id = %s", [app_id])
        for followee, follower in cursor.fetchall():
            fans = followers.get(followee)
            if fans is None:
                fans = followers[followee] = set()
            fans.add(follower)
    return followers


def exchange_batch_commit(*, app_id: int, applied_seq: int, adds: list[tuple[int, int]],
                          removes: list[tuple[int, int]], skipped: int = 0, malformed: int = 0,
                          gap_seq: int | None = None, gap_age: float | None = None, held: int = 0) -> None:
    """One transaction: the batch's net graph change (each pair appears at most once, as added or
    removed) and the state moved to `applied_seq`. Counters are increments; the gap report is
    overwritten (gap_age seconds ago, as the engine's monotonic clock saw it)."""
    gap_since = datetime.now(UTC) - timedelta(seconds=gap_age) if gap_seq is not None and gap_age is not None else None
    try:
        _batch_write(app_id, applied_seq, adds, removes, skipped, malformed, gap_seq, gap_since, held)
    except Exception:
        # A connection Postgres dropped (a restart, an idle timeout) stays broken in this thread,
        # which no request cycle ever closes: closed here, the retry (the adapter's) opens a new one.
        connection.close()
        raise


def _batch_write(app_id: int, applied_seq: int, adds: list[tuple[int, int]], removes: list[tuple[int, int]],
                 skipped: int, malformed: int, gap_seq: int | None, gap_since, held: int) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        if removes:
            cursor.execute(
                f"DELETE FROM {_FOLLOW} f USING unnest(%s::bigint[], %s::bigint[]) AS d(follower, followee) "
                "WHERE f.app_id = %s AND f.follower = d.follower AND f.followee = d.followee",
                [[p[0] for p in removes], [p[1] for p in removes], app_id])
        if adds:
            cursor.execute(
                f"INSERT INTO {_FOLLOW} (app_id, follower, followee, created_at) "
                "SELECT %s, a.follower, a.followee, now() "
                "FROM unnest(%s::bigint[], %s::bigint[]) AS a(follower, followee) "
                "ON CONFLICT (app_id, follower, followee) DO NOTHING",
                [app_id, [p[0] for p in adds], [p[1] for p in adds]])
        cursor.execute(
            f"UPDATE {_STATE} SET applied_seq = GREATEST(applied_seq, %s), skipped = skipped + %s, "
            "malformed = malformed + %s, gap_seq = %s, gap_since = %s, held = %s, updated_at = now() "
            "WHERE app_id = %s",
            [applied_seq, skipped, malformed, gap_seq, gap_since, held, app_id])
