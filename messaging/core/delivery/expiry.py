"""Where retention ends what was never delivered: undelivered rows older than their app's
retention_days become expired (the hourly beat task)."""

from __future__ import annotations

from django.db import connection

from messaging.core.delivery.sql import EXPIRABLE, EXPIRED


def deliveries_expire() -> int:
    """Undelivered rows older than their app's retention become expired."""
    with connection.cursor() as cur:  # hourly: nothing to gain from preparing it
        cur.execute(
            f"""
            UPDATE messaging_delivery d SET state = {EXPIRED}, expired_at = now(), next_attempt_at = NULL, claim = NULL
              FROM apps_registry_clientapp a
             WHERE a.id = d.app_id AND d.state IN {EXPIRABLE}
               AND d.created_at < now() - make_interval(days => a.retention_days)
            """
        )
        return cur.rowcount
