"""Rows past their app's retention deleted, in bounded batches, once the analytics export has them.

Nothing else ever removes a message, delivery, session or presence-event row (retention marks an
undelivered delivery `expired`, messaging.core.delivery.expiry), so without this the tables grow by every
send for ever. A row goes only when all of these hold:

- it is older than its app's `retention_days` (presence events of an app that no longer exists:
  RETENTION_ORPHAN_DAYS), a day being RETENTION_DAY_SECONDS long (a calendar day: `1 day`, unless
  shortened, as tests/system/test_retention_load.py does to run a load through many retentions);
- it is final: a delivery delivered or expired before the last export took its snapshot (a dead
  letter stays until an operator settles it; a row still waiting, or a domain's record of a message
  it passed on, stays); a message with no delivery, no confirmation and no held arrival left; a
  session closed;
- the export has it: its id is at or below the export's watermark (for a session, its disconnect
  event's; for a message that kept its id from another domain, none of its deliveries is left, the
  first of which took it to the lake), and a delivery was final before that export's snapshot, so
  the lake holds its final state (analytics.services.export).

A standby's copy of another domain's mailboxes (StandbyCopy, messaging.federation.standby.copy) goes
by the home's rule for its own deliveries, read from the copy: older than the app's retention (by
when the home stored it) and delivered or expired there. A copy still waiting stays, as the home's
delivery does until the home's expiry makes it expired (and its copy with it); so does a dead
letter. Nothing exports copies, so none waits for an export. Without this, a standby's disk grew
for ever, content outlived the app's retention there, and a takeover merged all of history.

Each table goes in batches of RETENTION_BATCH_ROWS, oldest ids first, each batch its own short
transaction, until RETENTION_BUDGET_SECONDS are spent (the next beat run goes on). What went is
counted per day and table (RetentionDay), which the operator dashboard shows with the oldest row
each table keeps.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from analytics.models import ExportTable, ExportWatermark, RetentionDay
from messaging.models import DeliveryState

log = logging.getLogger(__name__)

_FINAL = f"('{DeliveryState.DELIVERED.value}', '{DeliveryState.EXPIRED.value}')"
_MESSAGE_GONE = """m.created_at < now() - a.retention_days * %(day)s
               AND NOT EXISTS (SELECT 1 FROM messaging_delivery d WHERE d.message_id = m.id)
               AND NOT EXISTS (SELECT 1 FROM messaging_message c WHERE c.confirms_id = m.id)
               AND NOT EXISTS (SELECT 1 FROM messaging_heldinorder h WHERE h.message_id = m.id)"""

# Each statement deletes one batch and returns how many rows went. %(upto)s: the export's watermark;
# %(as_of)s: its snapshot's time; %(batch)s: the batch size; %(orphan_days)s: for presence events;
# %(day)s: one day of retention, an interval (RETENTION_DAY_SECONDS: a calendar day unless shortened).
_DELETES: dict[str, str] = {
    "deliveries": f"""
        WITH doomed AS (
            SELECT d.id FROM messaging_delivery d JOIN apps_registry_clientapp a ON a.id = d.app_id
             WHERE d.id <= %(upto)s AND d.state IN {_FINAL}
               AND d.created_at < now() - a.retention_days * %(day)s
               AND coalesce(d.delivered_at, d.expired_at, d.created_at) < %(as_of)s
             ORDER BY d.id LIMIT %(batch)s)
        DELETE FROM messaging_delivery d USING doomed WHERE d.id = doomed.id""",
    # A message that came from another domain keeps its id there, above the watermark when its
    # origin's block is above this domain's (messaging.core.store.carried_id_sql): the export took it
    # with its first delivery, so with no delivery left it has it.
    "messages": f"""
        WITH doomed AS (
            (SELECT m.id FROM messaging_message m JOIN apps_registry_clientapp a ON a.id = m.app_id
              WHERE m.id <= %(upto)s AND {_MESSAGE_GONE}
              ORDER BY m.id LIMIT %(batch)s)
            UNION ALL
            (SELECT m.id FROM messaging_message m JOIN apps_registry_clientapp a ON a.id = m.app_id
              WHERE m.id > %(upto)s AND m.origin_message_id = m.id AND {_MESSAGE_GONE}
              ORDER BY m.id LIMIT %(batch)s))
        DELETE FROM messaging_message m USING doomed WHERE m.id = doomed.id""",
    "sessions": """
        WITH doomed AS (
            SELECT s.connection_id FROM presence_session s JOIN apps_registry_clientapp a ON a.id = s.app_id
             WHERE s.disconnected_at IS NOT NULL
               AND s.disconnected_at < now() - a.retention_days * %(day)s
               AND EXISTS (SELECT 1 FROM presence_presenceevent e
                            WHERE e.connection_id = s.connection_id AND e.kind = 'disconnect' AND e.id <= %(upto)s)
             LIMIT %(batch)s)
        DELETE FROM presence_session s USING doomed WHERE s.connection_id = doomed.connection_id""",
    "presence_events": """
        WITH doomed AS (
            SELECT e.id FROM presence_presenceevent e LEFT JOIN apps_registry_clientapp a ON a.id = e.app_id
             WHERE e.id <= %(upto)s
               AND e.at < now() - coalesce(a.retention_days, %(orphan_days)s) * %(day)s
               -- a connect event stays while its session is open: the export's live sessions read it
               AND NOT EXISTS (SELECT 1 FROM presence_session s
                                WHERE s.connection_id = e.connection_id AND s.disconnected_at IS NULL)
             ORDER BY e.id LIMIT %(batch)s)
        DELETE FROM presence_presenceevent e USING doomed WHERE e.id = doomed.id""",
    "standby_copies": f"""
        WITH doomed AS (
            SELECT c.id FROM messaging_standbycopy c JOIN apps_registry_clientapp a ON a.id = c.app_id
             WHERE c.state IN {_FINAL} AND c.created_at < now() - a.retention_days * %(day)s
             ORDER BY c.id LIMIT %(batch)s)
        DELETE FROM messaging_standbycopy c USING doomed WHERE c.id = doomed.id""",
}
# Whose watermark says what the export has: deliveries before their messages (a message goes once
# its deliveries have), sessions before the events their deletion looks up. None: never exported.
_WATERMARK = {"deliveries": ExportTable.DELIVERIES, "messages": ExportTable.MESSAGES,
              "sessions": ExportTable.PRESENCE_EVENTS, "presence_events": ExportTable.PRESENCE_EVENTS,
              "standby_copies": None}


@dataclass
class Swept:
    removed: dict[str, int] = field(default_factory=dict)
    done: bool = True  # False: the budget ran out with rows left


def rows_past_retention_delete(*, budget_seconds: float | None = None, batch: int | None = None) -> Swept:
    """Beat: delete what is past retention and exported, batch by batch, within the budget."""
    budget = settings.RETENTION_BUDGET_SECONDS if budget_seconds is None else budget_seconds
    size = batch or settings.RETENTION_BATCH_ROWS
    deadline = time.monotonic() + budget
    marks = {m.table: m for m in ExportWatermark.objects.all()}
    swept = Swept()
    for table, sql in _DELETES.items():
        params = {"batch": size, "orphan_days": settings.RETENTION_ORPHAN_DAYS,
                  "day": timedelta(seconds=settings.RETENTION_DAY_SECONDS)}
        if (exported := _WATERMARK[table]) is not None:
            mark = marks.get(exported)
            if mark is None or mark.position <= 0:
                continue  # nothing exported yet: nothing may go
            params |= {"upto": mark.position, "as_of": mark.updated_at}
        removed = 0
        while True:
            if time.monotonic() >= deadline:
                swept.done = False
                break
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute(sql, params)
                went = cur.rowcount
                if went:
                    _count(table, went)
            removed += went
            if went < size:
                break
        swept.removed[table] = removed
        if not swept.done:
            break
    if any(swept.removed.values()):
        log.info("retention: removed %s%s", ", ".join(f"{n} {t}" for t, n in swept.removed.items() if n),
                 "" if swept.done else " (budget spent; the next run goes on)")
    return swept


def _count(table: str, removed: int) -> None:
    """Inside the batch's transaction: the day's count for the table grows by `removed`."""
    name = RetentionDay._meta.db_table
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {name} (day, source, removed) VALUES (%s, %s, %s) "
            f"ON CONFLICT (day, source) DO UPDATE SET removed = {name}.removed + EXCLUDED.removed",
            [timezone.now().date(), table, removed],
        )
