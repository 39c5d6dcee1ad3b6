"""Cluster-wide "one at a time" for analytics runs: Postgres advisory locks, held by the database
session, so a process that dies releases them with its connection."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection

EXPORT_LOCK = 0x5BA7A1E7
REPORT_LOCK = {"presence": 0x5BA7A1E8, "backlog": 0x5BA7A1E9}


@contextmanager
def advisory_lock(key: int) -> Iterator[bool]:
    """Yields whether the lock was taken (never waits); releases it at the end."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_lock(%s)", [key])
        taken = bool(cur.fetchone()[0])
    try:
        yield taken
    finally:
        if taken:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s)", [key])
