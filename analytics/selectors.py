"""Read-side queries of analytics: report reads, job runs, and the dashboard's live figures.

The live figures run on every load of the admin's front page, so none of them may grow with the
size of messaging_delivery (millions of rows): each is served by an index that holds only the
rows it counts, bounded by a LIMIT, taken from Postgres' statistics, or read from Redis. Each
query says which, and all of them share a short statement timeout (a figure that times out
shows as unknown instead of holding the page).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

import redis
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Count, QuerySet
from django.utils import timezone

from apps_registry.models import ClientApp
from messaging.gateway.pusher.figures import PusherFigures
from messaging.gateway.pusher.figures import figures_read as pusher_figures_read
from messaging.models import UNDELIVERED_STATES, DeliveryState
from presence.models import Node, Session

from .models import JobKind, JobRun, Report, ReportRow, RetentionDay

LIVE_COUNT_CAP = 100_000  # exact counts up to here, "more than" beyond
RECENT_DELIVERIES = 20_000  # how many of the newest delivery records "delivered in the last minute" reads
LIVE_QUERY_TIMEOUT_MS = 1000
TIMED_OUT = object()


def report_default_range(now: datetime | None = None) -> tuple[datetime, datetime]:
    """Yesterday, UTC: what the nightly reports cover."""
    today = (now or timezone.now()).astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - timedelta(days=1), today


def report_today_range(now: datetime | None = None) -> tuple[datetime, datetime]:
    """Today so far (to the next whole minute), UTC: the admin's on-demand choice."""
    now = (now or timezone.now()).astimezone(UTC)
    return now.replace(hour=0, minute=0, second=0, microsecond=0), \
        now.replace(second=0, microsecond=0) + timedelta(minutes=1)


def report_latest(kind: str) -> Report | None:
    """Served by report_latest_of_kind."""
    return Report.objects.filter(kind=kind).order_by("-computed_at").first()


def report_figures(report: Report, metric: str, grain: str | None = None, *, everyone: bool = False
                   ) -> list[ReportRow]:
    """One metric of a report, optionally only its all-apps rows (served by the report_row_once
    unique index)."""
    rows = report.rows.filter(metric=metric)
    if grain is not None:
        rows = rows.filter(grain=grain)
    if everyone:
        rows = rows.filter(app="", subgroup="")
    return list(rows.order_by("app", "subgroup", "period", "bucket"))


def report_rows_for_csv(report: Report) -> QuerySet[ReportRow]:
    return report.rows.order_by("metric", "grain", "app", "subgroup", "period", "bucket")


def job_runs_latest() -> dict[str, JobRun | None]:
    """The newest run of each kind (served by jobrun_latest_of_kind)."""
    return {kind.value: JobRun.objects.filter(kind=kind).order_by("-created_at").first() for kind in JobKind}


# --- live figures --------------------------------------------------------------------------------

@dataclass(frozen=True)
class NodeLoad:
    node_id: str
    domain: str
    connections: int
    users: int
    heartbeat_at: datetime | None


@dataclass(frozen=True)
class StateCount:
    state: str
    count: int | None  # None: unknown (timed out, or the table was never analysed)
    exact: bool  # False: an estimate from the planner's statistics
    capped: bool = False  # True: at least this many


@dataclass
class LiveFigures:
    measured_at: datetime
    connected_users: int | None = None
    connections: int | None = None
    nodes: list[NodeLoad] = field(default_factory=list)
    accepted_last_minute: int | None = None
    delivered_last_minute: int | None = None
    states: list[StateCount] = field(default_factory=list)
    dead_letters: int | None = None
    oldest_pending: datetime | None = None
    oldest_pending_known: bool = False
    routing_queue: int | None = None
    apps: list[AppLive] = field(default_factory=list)
    pusher_known: bool = False  # False: Redis did not answer (the Pusher figures are unknown)


@dataclass(frozen=True)
class AppLive:
    """An app's live figures: its native connections (live sessions) beside its Pusher door's, read
    cluster-wide from Redis (messaging.gateway.pusher.figures)."""

    app_name: str
    connections: int
    pusher: PusherFigures


def dashboard_live() -> LiveFigures:
    figures = LiveFigures(measured_at=timezone.now())
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"SET LOCAL statement_timeout = {LIVE_QUERY_TIMEOUT_MS}")
        _sessions(cur, figures)
        figures.accepted_last_minute = _count(
            # messaging_message.created_at's index: only the last minute's rows, and at most the cap.
            cur, "SELECT count(*) FROM (SELECT 1 FROM messaging_message WHERE created_at >= now() - interval "
                 "'1 minute' LIMIT %s) t", [LIVE_COUNT_CAP])
        figures.delivered_last_minute = _count(
            # A backward walk of the primary key over the newest records only: deliveries of older
            # messages (a fetch after a long absence) are not seen here; the backlog report has them.
            cur, "SELECT count(*) FROM (SELECT delivered_at FROM messaging_delivery ORDER BY id DESC LIMIT %s) t "
                 "WHERE delivered_at >= now() - interval '1 minute'", [RECENT_DELIVERIES])
        figures.states = _states(cur)
        dead = next((s for s in figures.states if s.state == DeliveryState.DEAD), None)
        figures.dead_letters = dead.count if dead else None
        # The partial index delivery_undelivered_mailbox holds exactly the undelivered rows, so
        # this reads the backlog, not the table (and gives up after the timeout).
        oldest = _one(cur, f"SELECT min(created_at) FROM messaging_delivery WHERE state IN ({_states_in()})", [])
        figures.oldest_pending_known = oldest is not TIMED_OUT
        figures.oldest_pending = None if oldest is TIMED_OUT else oldest
        try:
            with transaction.atomic():  # (a savepoint: a timeout here leaves the native column at 0)
                native = dict(Session.objects.filter(disconnected_at__isnull=True).values("app_id")
                              .annotate(n=Count("pk")).values_list("app_id", "n"))
        except DatabaseError:
            native = {}
    figures.routing_queue = _routing_queue_depth()
    _apps(figures, native)
    return figures


def _apps(figures: LiveFigures, native: dict[int, int]) -> None:
    """Per app, the apps with something live only: `native` its live sessions (read like the per-node
    ones, live rows only), the Pusher figures from Redis."""
    names = dict(ClientApp.objects.values_list("pk", "app_name"))
    try:
        pusher = pusher_figures_read(list(names))
        figures.pusher_known = True
    except redis.RedisError:
        pusher = {}
    quiet = PusherFigures()
    figures.apps = [AppLive(name, native.get(pk, 0), pusher.get(pk, quiet)) for pk, name in names.items()
                    if native.get(pk) or pusher.get(pk, quiet) != quiet]
    figures.apps.sort(key=lambda a: a.app_name)


def _states_in() -> str:
    return ", ".join(f"'{s}'" for s in UNDELIVERED_STATES)


def _one(cur, sql: str, params: list):
    """One value, or TIMED_OUT (a savepoint keeps the other figures going)."""
    try:
        with transaction.atomic():
            cur.execute(sql, params)
            return cur.fetchone()[0]
    except DatabaseError:
        return TIMED_OUT


def _count(cur, sql: str, params: list) -> int | None:
    n = _one(cur, sql, params)
    return None if n is TIMED_OUT else n


def _sessions(cur, figures: LiveFigures) -> None:
    # Live sessions only, through the partial index session_live_by_node; grouping sets give the
    # per-node counts and the cluster-wide distinct users in one pass.
    try:
        with transaction.atomic():
            cur.execute(
                "SELECT node_id, count(*), count(DISTINCT (app_id, user_id)) FROM presence_session "
                "WHERE disconnected_at IS NULL GROUP BY GROUPING SETS ((node_id), ())")
            rows = cur.fetchall()
    except DatabaseError:
        return
    nodes = {n.node_id: n for n in Node.objects.filter(node_id__in=[r[0] for r in rows if r[0]])}
    for node_id, connections, users in rows:
        if node_id is None:
            figures.connections, figures.connected_users = connections, users
        else:
            node = nodes.get(node_id)
            figures.nodes.append(NodeLoad(node_id, node.domain if node else "?", connections, users,
                                          node.heartbeat_at if node else None))
    figures.nodes.sort(key=lambda n: n.node_id)
    if figures.connections is None:
        figures.connections = figures.connected_users = 0


def _states(cur) -> list[StateCount]:
    counts: list[StateCount] = []
    # Undelivered and dead rows: exact, each read through its partial index
    # (delivery_undelivered_mailbox, delivery_dead_letters), at most LIVE_COUNT_CAP of them.
    for state in (*UNDELIVERED_STATES, DeliveryState.DEAD):
        n = _count(cur, f"SELECT count(*) FROM (SELECT 1 FROM messaging_delivery WHERE state = '{state}' LIMIT %s) t",
                 [LIVE_COUNT_CAP + 1])
        counts.append(StateCount(str(state), None if n is None else min(n, LIVE_COUNT_CAP), True,
                                 n is not None and n > LIVE_COUNT_CAP))
    # Delivered and expired are nearly the whole table: the planner's statistics (row estimate
    # times the state's frequency, as of the last ANALYZE) instead of a count.
    estimate = {}
    try:
        with transaction.atomic():
            cur.execute(
                "SELECT c.reltuples, s.most_common_vals::text::text[], s.most_common_freqs FROM pg_class c "
                "LEFT JOIN pg_stats s ON s.schemaname = current_schema() AND s.tablename = 'messaging_delivery' "
                "AND s.attname = 'state' WHERE c.oid = 'messaging_delivery'::regclass")
            reltuples, values, freqs = cur.fetchone()
        if reltuples is not None and reltuples >= 0 and values:
            estimate = {v: round(reltuples * f) for v, f in zip(values, freqs, strict=True)}
    except DatabaseError:
        pass
    for state in (DeliveryState.DELIVERED, DeliveryState.EXPIRED):
        counts.append(StateCount(str(state), estimate.get(str(state), 0 if estimate else None), False))
    return counts


def _routing_queue_depth() -> int | None:
    """Routing tasks waiting in the broker: kombu keeps the `routing` queue as Redis lists (the
    plain name, and one per priority step when priorities are used)."""
    queue = settings.CELERY_TASK_ROUTES["messaging.tasks.route_deliveries"]["queue"]
    names = [queue] + [f"{queue}\x06\x16{p}" for p in (3, 6, 9)]
    try:
        client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=2, socket_connect_timeout=2)
        try:
            pipe = client.pipeline(transaction=False)
            for name in names:
                pipe.llen(name)
            return sum(pipe.execute())
        finally:
            client.close()
    except redis.RedisError:
        return None


@dataclass(frozen=True)
class RetentionFigures:
    """What the retention sweep keeps and removed: per source table, its oldest row's time, and
    the rows removed on each of the last days (newest first)."""

    oldest: dict[str, datetime | None]
    days: list[tuple[date, list[int]]]  # each day's counts in RETENTION_SOURCES's order


# The oldest row of each table: its lowest id (an index walk of one row, whatever the table's size).
_OLDEST = {"messages": "SELECT created_at FROM messaging_message ORDER BY id LIMIT 1",
           "deliveries": "SELECT created_at FROM messaging_delivery ORDER BY id LIMIT 1",
           "sessions": "SELECT min(connected_at) FROM presence_session WHERE disconnected_at IS NOT NULL",
           "presence_events": "SELECT at FROM presence_presenceevent ORDER BY id LIMIT 1",
           "standby_copies": "SELECT created_at FROM messaging_standbycopy ORDER BY id LIMIT 1"}
RETENTION_SOURCES = tuple(_OLDEST)


def retention_figures(*, days: int = 7) -> RetentionFigures:
    oldest: dict[str, datetime | None] = {}
    with connection.cursor() as cur:
        for source, sql in _OLDEST.items():
            cur.execute(sql)
            row = cur.fetchone()
            oldest[source] = row[0] if row else None
    since = timezone.now().date() - timedelta(days=days - 1)
    per_day: dict[date, dict[str, int]] = {}
    for day, source, removed in RetentionDay.objects.filter(day__gte=since).values_list("day", "source", "removed"):
        per_day.setdefault(day, {})[source] = removed
    return RetentionFigures(oldest=oldest, days=[(day, [counts.get(source, 0) for source in RETENTION_SOURCES])
                                                 for day, counts in sorted(per_day.items(), reverse=True)])
