"""The incremental export of messages, deliveries, sessions and presence events to the lake.

What is exported, and how each table is followed without a new index on a hot table:

- messages and presence events are append-only: each run takes the ids after the table's
  watermark, up to a horizon (below), and moves the watermark there. A message that came from
  another domain and kept its id there (docs/architecture.md, "One id per message") has an id no
  sequence here hands out: it goes with its first delivery here, found in the deliveries' range.
- deliveries change state until they are delivered or expired, which happens once and for good
  (delivered and expired rows never move again; dead ones can be re-queued, so they are not final).
  A final row is exported once, into `deliveries/`. Every row not final yet is in the live snapshot
  `deliveries_live/run=<run>/`, which each run writes whole and which replaces the previous one.
  A row is therefore, after every run, either exported as final or in the current snapshot, and
  the run finds the rows that became final since the last one with primary-key lookups only:
  the ids after the watermark (a range of the primary key) plus the previous snapshot's ids (read
  back from the lake). The snapshot itself is read through the partial indexes messaging already
  has (undelivered rows by mailbox, dead letters), so its cost follows the backlog, not the table.
  No index is added to messaging_delivery, whose every index is paid on each state change.
- sessions change (heartbeats touch them every few seconds) until they close, and every close
  writes a disconnect event in the same transaction (presence.events). A closed session is
  exported once, into `sessions/`, when its disconnect event passes the sessions watermark; open
  sessions (and those closed after the horizon) are the live snapshot `sessions_live/run=<run>/`.

The horizon. Ids come from sequences when a row is inserted but become visible when its
transaction commits, so a row with a lower id can appear after a higher one has been exported;
a plain "max id seen" watermark would skip it for ever. A run reads each sequence's last value V,
then the time T, and waits (ANALYTICS_EXPORT_HORIZON_WAIT seconds at most) until no client
transaction of this database that started at or before T and may have written is still open (the
other databases of the server, other domains' say, are no concern): every id up to V is
then committed or rolled back for good. If a long transaction is still open, the append-only watermarks stay where
they are this run (and a warning names it). This needs the export's database role to see the
writers' transactions in pg_stat_activity (the same role, or pg_read_all_stats).

Atomicity. A run's files are written whole under `_staging/run-<run>/`, invisible to readers.
One transaction (REPEATABLE READ: every query of the run sees one snapshot) reads the rows, and
then advances the watermarks and records the run's file list; its commit is the export. Only then
are the files renamed into place and the live snapshots marked complete (`_SUCCESS`). A crash
before the commit leaves staged files that the next run deletes (the watermarks never moved, so
it exports the same rows again, once); a crash after it leaves a committed run that the next run
publishes. One export runs at a time (a Postgres advisory lock, released if the process dies).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import pyarrow as pa
import pyarrow.compute as pc
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from analytics.jobs import datasets as ds
from analytics.models import ExportTable, ExportWatermark, JobKind, JobRun, JobState
from apps_registry.models import MESSAGE_ID_BLOCK_SIZE
from foundation.locks import one_at_a_time
from messaging.models import UNDELIVERED_STATES, DeliveryState
from presence.models import PresenceEventKind, Transport

from .jobs import job_finish, job_start
from .lake import Lake, arrow_table, staging_dir
from .locks import EXPORT_LOCK

log = logging.getLogger(__name__)

LIVE_SNAPSHOTS_KEPT = 3  # a report still reading an older snapshot must not lose its files
RUNS_KEPT_DAYS = 7
FINAL_DELIVERY_STATES = (DeliveryState.DELIVERED, DeliveryState.EXPIRED)
CARRIED_IDS_PER_QUERY = 10_000

# Rows counted per dataset; `estimate` is an upper bound when known.
Progress = Callable[[str, int, int | None], None]


class ExportBusy(Exception):
    """Another export holds the lock."""


@dataclass
class ExportResult:
    run_id: int | None
    rows: dict[str, int] = field(default_factory=dict)
    files: int = 0


def _in(states) -> str:
    """A state list inlined as literals: a bound parameter would hide the partial index's predicate."""
    return ", ".join(f"'{DeliveryState(s).value}'" for s in states)


_DELIVERY_SELECT = """
    SELECT d.id, d.message_id, d.app_id, a.app_name, m.kind, d.recipient, d.state, d.attempts, d.last_error,
           d.created_at, d.sent_at, d.delivered_at, d.dead_at, d.expired_at {extra}
      FROM messaging_delivery d
      JOIN messaging_message m ON m.id = d.message_id
      JOIN apps_registry_clientapp a ON a.id = d.app_id
"""
_MESSAGE_SELECT = """
    SELECT m.id, m.app_id, a.app_name, m.sender, m.kind, m.confirmation_requested, m.client_message_id IS NOT NULL,
           m.origin_domain, octet_length(m.content), m.created_at
      FROM messaging_message m JOIN apps_registry_clientapp a ON a.id = m.app_id
"""
# A message that came from another domain keeps its id there (messaging.core.store.carried_id_sql),
# which no sequence of this database hands out: it is followed by its deliveries instead, and taken
# with the first of them (stored in the same transaction, so under the same horizon).
_CARRIED = "m.origin_message_id = m.id"
SQL_MESSAGES = _MESSAGE_SELECT + " WHERE m.id > %s AND m.id <= %s AND m.origin_message_id IS DISTINCT FROM m.id"
SQL_MESSAGES_CARRIED = _MESSAGE_SELECT + f"""
     WHERE m.id IN (SELECT d.message_id FROM messaging_delivery d WHERE d.id > %(from)s AND d.id <= %(to)s)
       AND {_CARRIED}
       AND NOT EXISTS (SELECT 1 FROM messaging_delivery e WHERE e.message_id = m.id AND e.id <= %(from)s)
"""
SQL_DELIVERIES_NEW = _DELIVERY_SELECT.format(extra="") + (
    f" WHERE d.id > %s AND d.id <= %s AND d.state IN ({_in(FINAL_DELIVERY_STATES)})")
SQL_DELIVERIES_CARRIED = _DELIVERY_SELECT.format(extra="") + (
    f" WHERE d.id = ANY(%s) AND d.state IN ({_in(FINAL_DELIVERY_STATES)})")
# Two branches, each matching one partial index's predicate exactly (delivery_undelivered_mailbox,
# delivery_dead_letters): the snapshot costs what the backlog costs.
SQL_DELIVERIES_LIVE = (
    _DELIVERY_SELECT.format(extra=", %(as_of)s") + f" WHERE d.state IN ({_in(UNDELIVERED_STATES)}) AND d.id <= %(to)s"
    + " UNION ALL "
    + _DELIVERY_SELECT.format(extra=", %(as_of)s") + f" WHERE d.state = '{DeliveryState.DEAD.value}' AND d.id <= %(to)s"
)
SQL_PRESENCE_EVENTS = """
    SELECT id, kind, at, connection_id::text, app_id, app_name, user_id, node_id, domain, transport, connected_at,
           close_reason
      FROM presence_presenceevent WHERE id > %s AND id <= %s
"""
SQL_SESSIONS_CLOSED = f"""
    SELECT e.connection_id::text, e.app_id, e.app_name, e.user_id, e.node_id, e.domain, e.transport, s.acks,
           e.connected_at, e.at, e.close_reason
      FROM presence_presenceevent e LEFT JOIN presence_session s ON s.connection_id = e.connection_id
     WHERE e.kind = '{PresenceEventKind.DISCONNECT.value}' AND e.id > %s AND e.id <= %s
"""
# Open sessions (partial index session_live_by_node), plus those whose disconnect event is past
# the horizon: not exported as closed yet, so they stay in the snapshot with their real end.
SQL_SESSIONS_LIVE = f"""
    SELECT s.connection_id::text, s.app_id, a.app_name, s.user_id, s.node_id, n.domain,
           coalesce((SELECT e.transport FROM presence_presenceevent e  -- one unique-index lookup per session
                      WHERE e.connection_id = s.connection_id AND e.kind = '{PresenceEventKind.CONNECT.value}'),
                    '{Transport.WS.value}'),
           s.acks, s.connected_at, NULL::timestamptz, '', %(as_of)s
      FROM presence_session s
      JOIN presence_node n ON n.node_id = s.node_id
      JOIN apps_registry_clientapp a ON a.id = s.app_id
     WHERE s.disconnected_at IS NULL
    UNION ALL
    SELECT e.connection_id::text, e.app_id, e.app_name, e.user_id, e.node_id, e.domain, e.transport, s.acks,
           e.connected_at, e.at, e.close_reason, %(as_of)s
      FROM presence_presenceevent e LEFT JOIN presence_session s ON s.connection_id = e.connection_id
     WHERE e.kind = '{PresenceEventKind.DISCONNECT.value}' AND e.id > %(position)s
"""
# The sequences whose horizon a run waits for.
SEQUENCES = {ExportTable.MESSAGES: "messaging_message", ExportTable.DELIVERIES: "messaging_delivery",
             ExportTable.PRESENCE_EVENTS: "presence_presenceevent"}


def lake_export(*, job_run_id: int | None = None, requested_by: str = "", progress: Progress | None = None
                ) -> ExportResult:
    """Export what changed since the last run. Raises ExportBusy while another export runs."""
    if connection.in_atomic_block:
        raise RuntimeError("lake_export runs its own transactions; call it outside transaction.atomic()")
    lake = Lake(settings.ANALYTICS_LAKE)
    with one_at_a_time(EXPORT_LOCK) as taken:
        if not taken:
            raise ExportBusy("another export is running")
        _recover(lake, keep=job_run_id)
        run = job_start(job_run_id=job_run_id, kind=JobKind.EXPORT, requested_by=requested_by)
        if run is None:
            return ExportResult(run_id=job_run_id)  # that run had already finished
        try:
            horizons = _horizons()
            _export_rows(lake, run, horizons, progress)
        except BaseException as exc:
            lake.delete_dir(staging_dir(run.pk))
            job_finish(job_run=run, error=f"{type(exc).__name__}: {exc}")
            raise
        _publish(lake, run)
        _prune()
        return ExportResult(run_id=run.pk, rows=dict(run.rows), files=len(run.files))


def lake_reset() -> None:
    """Forget every watermark and delete the exported datasets: the next export starts over."""
    lake = Lake(settings.ANALYTICS_LAKE)
    with one_at_a_time(EXPORT_LOCK) as taken:
        if not taken:
            raise ExportBusy("another export is running")
        for dataset in ds.ALL:
            lake.delete_dir(dataset.name)
        lake.delete_dir(ds.STAGING)
        ExportWatermark.objects.all().delete()


# --- the steps -----------------------------------------------------------------------------------

def _recover(lake: Lake, *, keep: int | None) -> None:
    """Under the lock no other export runs, so a `running` export died: publish it if it had
    committed, else discard its staged files (its watermarks never moved)."""
    for run in JobRun.objects.filter(kind=JobKind.EXPORT, state=JobState.RUNNING).order_by("pk"):
        if run.committed_at is not None:
            log.warning("export run %s had committed but not published: publishing it now", run.pk)
            _publish(lake, run)
        else:
            lake.delete_dir(staging_dir(run.pk))
            if run.pk != keep:
                job_finish(job_run=run, error="interrupted before it committed; its staged files were discarded")
    lake.delete_dir(ds.STAGING)  # anything left was staged by a run whose JobRun row never committed


def _horizons() -> dict[str, int] | None:
    """The last id of each exported sequence below which no transaction can still commit a row,
    or None if an old transaction stayed open for the whole wait (see the module docstring)."""
    values = {}
    with connection.cursor() as cur:
        for table, name in SEQUENCES.items():
            cur.execute("SELECT pg_get_serial_sequence(%s, 'id')", [name])
            cur.execute(f"SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM {cur.fetchone()[0]}")
            values[table] = cur.fetchone()[0]
        cur.execute("SELECT clock_timestamp()")
        started = cur.fetchone()[0]
        deadline = time.monotonic() + settings.ANALYTICS_EXPORT_HORIZON_WAIT
        while True:
            # Each poll is its own transaction (autocommit): pg_stat_activity is re-read every time.
            # A transaction that has written holds an xid; one running a statement may be between
            # taking an id and writing its row. An idle one that never wrote cannot hold an id back,
            # nor can one in another database of the server (the sequences are this database's).
            cur.execute(
                "SELECT pid, application_name, xact_start, left(query, 200) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                "AND datname = current_database() AND backend_type = 'client backend' AND xact_start <= %s "
                "AND (backend_xid IS NOT NULL OR state = 'active') ORDER BY xact_start LIMIT 1",
                [started],
            )
            blocker = cur.fetchone()
            if blocker is None:
                return values
            if time.monotonic() > deadline:
                log.warning("export: transaction of pid %s (%s) open since %s (%s) holds the append-only watermarks "
                            "back this run", *blocker)
                return None
            time.sleep(0.05)


class _StagedWriter:
    """Writes a run's rows to staged Parquet files of at most ANALYTICS_EXPORT_BATCH_ROWS rows,
    one per day partition of each batch, streaming from a server-side cursor."""

    def __init__(self, lake: Lake, run_id: int, progress: Progress | None) -> None:
        self.lake, self.run_id, self.progress = lake, run_id, progress
        self.batch_rows = settings.ANALYTICS_EXPORT_BATCH_ROWS
        self.files: list[str] = []
        self.rows: Counter[str] = Counter()
        self._parts = 0

    def stream(self, dataset: ds.Dataset, sql: str, params, estimate: int | None = None) -> None:
        self.rows[dataset.name] += 0
        if self.progress:
            self.progress(dataset.name, 0, estimate)
        # A named (server-side) cursor: Postgres hands rows over a batch at a time.
        with connection.connection.cursor(name=f"export_{dataset.name}") as cur:
            cur.execute(sql, params)
            while rows := cur.fetchmany(self.batch_rows):
                self._write(dataset, arrow_table(dataset, rows))

    def _write(self, dataset: ds.Dataset, table: pa.Table) -> None:
        if dataset.live:
            self._put(ds.live_run_dir(dataset, self.run_id), table)
        else:
            days = pc.cast(table[dataset.partition_by], pa.date32())
            for day in pc.unique(days).to_pylist():
                self._put(f"{dataset.name}/{ds.DAY}={day.isoformat()}", table.filter(pc.equal(days, day)))
        self.rows[dataset.name] += table.num_rows
        if self.progress:
            self.progress(dataset.name, table.num_rows, None)

    def _put(self, directory: str, table: pa.Table) -> None:
        rel = f"{directory}/part-{self.run_id:08d}-{self._parts:05d}.parquet"
        self._parts += 1
        self.lake.write_table(table, f"{staging_dir(self.run_id)}/{rel}")
        self.files.append(rel)


def _export_rows(lake: Lake, run: JobRun, horizons: dict[str, int] | None, progress: Progress | None) -> None:
    for table in ExportTable:
        ExportWatermark.objects.get_or_create(table=table)
    writer = _StagedWriter(lake, run.pk, progress)
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("SELECT now()")
            as_of = cur.fetchone()[0]
        marks = {m.table: m for m in ExportWatermark.objects.select_for_update()}
        upto = {t: (horizons or {}).get(t, marks[t].position) for t in ExportTable}
        upto[ExportTable.SESSIONS] = upto[ExportTable.PRESENCE_EVENTS]

        m = marks[ExportTable.MESSAGES]
        d = marks[ExportTable.DELIVERIES]
        # No estimate across a jump into the domain's block of ids (apps_registry Domain.number).
        estimate = upto[m.table] - m.position
        writer.stream(ds.MESSAGES, SQL_MESSAGES, [m.position, upto[m.table]],
                      estimate if estimate < MESSAGE_ID_BLOCK_SIZE else None)
        writer.stream(ds.MESSAGES, SQL_MESSAGES_CARRIED, {"from": d.position, "to": upto[d.table]})

        carried = _carried_ids(lake, d)
        writer.stream(ds.DELIVERIES, SQL_DELIVERIES_NEW, [d.position, upto[d.table]],
                      upto[d.table] - d.position + len(carried))
        for start in range(0, len(carried), CARRIED_IDS_PER_QUERY):
            writer.stream(ds.DELIVERIES, SQL_DELIVERIES_CARRIED, [carried[start:start + CARRIED_IDS_PER_QUERY]])
        writer.stream(ds.DELIVERIES_LIVE, SQL_DELIVERIES_LIVE, {"as_of": as_of, "to": upto[d.table]})

        e = marks[ExportTable.PRESENCE_EVENTS]
        writer.stream(ds.PRESENCE_EVENTS, SQL_PRESENCE_EVENTS, [e.position, upto[e.table]], upto[e.table] - e.position)
        s = marks[ExportTable.SESSIONS]
        writer.stream(ds.SESSIONS, SQL_SESSIONS_CLOSED, [s.position, upto[s.table]])
        writer.stream(ds.SESSIONS_LIVE, SQL_SESSIONS_LIVE, {"as_of": as_of, "position": upto[s.table]})

        for table, mark in marks.items():
            mark.position = upto[table]
            if table in (ExportTable.DELIVERIES, ExportTable.SESSIONS):
                mark.snapshot_run = run.pk
            mark.updated_at = as_of
            mark.save()
        run.committed_at, run.snapshot_at = timezone.now(), as_of
        run.files = writer.files
        run.rows = dict(writer.rows)
        run.save(update_fields=["committed_at", "snapshot_at", "files", "rows"])


def _carried_ids(lake: Lake, mark: ExportWatermark) -> list[int]:
    """The ids of the previous delivery snapshot: the rows at or below the watermark that were not
    final then, so the only old rows that can have become final since."""
    if mark.snapshot_run is None:
        return []
    directory = ds.live_run_dir(ds.DELIVERIES_LIVE, mark.snapshot_run)
    if not lake.exists(f"{directory}/{ds.SUCCESS}"):
        raise RuntimeError(f"the lake lost the delivery snapshot {directory}: run `manage.py analytics_export "
                           "--reset` to export everything again")
    return sorted(lake.read(directory, ds.DELIVERIES_LIVE.columns, only=["id"])["id"].to_pylist())


def _publish(lake: Lake, run: JobRun) -> None:
    """Rename a committed run's files into place, then mark its snapshots complete. Idempotent."""
    staged = staging_dir(run.pk)
    for rel in run.files:
        lake.move(f"{staged}/{rel}", rel)
    for dataset in (ds.DELIVERIES_LIVE, ds.SESSIONS_LIVE):
        lake.write_text(f"{ds.live_run_dir(dataset, run.pk)}/{ds.SUCCESS}", run.snapshot_at.isoformat())
        for old in lake.subdirs(dataset.name)[:-LIVE_SNAPSHOTS_KEPT]:
            lake.delete_dir(f"{dataset.name}/{old}")
    lake.delete_dir(staged)
    job_finish(job_run=run)


def _prune() -> None:
    """Export runs are a log, not a record: the lake and the watermarks are."""
    cutoff = timezone.now() - timedelta(days=RUNS_KEPT_DAYS)
    JobRun.objects.filter(kind=JobKind.EXPORT, created_at__lt=cutoff,
                          state__in=[JobState.SUCCEEDED, JobState.FAILED]).delete()
