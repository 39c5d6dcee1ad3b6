"""The per-message statements as server-side prepared statements.

Django's psycopg backend binds parameters on the client and never prepares a statement: every
execution sends the whole text, which Postgres parses and plans again. For the few statements a
reliable message runs (store, claim, delivered), parsing and planning cost the backend more than
executing them: a one-message store took 0.75 ms of backend CPU with client-side binding and 0.33 ms
prepared (`docs/benchmarks.md`, "prepared statements"). `hot_cursor()` is a drop-in for
`connection.cursor()` that binds on the server and prepares each statement text once per
connection; everything else (the ORM, the admin) keeps Django's client-side binding. (psycopg
prepares only on a connection whose `prepare_threshold` is set: `service_settings` sets it.)

It is Django's own connection of this thread, so the statements take part in the caller's
transaction (`transaction.atomic`, `on_commit`), and a database error comes out as Django's
(`django.db.DataError`, `IntegrityError`, ...) with the connection marked for replacement, exactly
as through `connection.cursor()` (the cursor is opened as Django opens its own:
foundation.patches.django).

`DB_PREPARED_STATEMENTS=false` turns it off, for a connection pooler in transaction mode that does
not keep prepared statements (PgBouncer before 1.21, or without `max_prepared_statements`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection

from foundation.patches.django import cursor_open


class _PreparingCursor(psycopg.Cursor):
    """Server-side binding; every statement prepared on first use (per connection)."""

    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None,
                binary: bool | None = None) -> _PreparingCursor:
        return super().execute(query, params, prepare=True if prepare is None else prepare, binary=binary)


@contextmanager
def hot_cursor() -> Iterator[Any]:
    """A cursor for a statement run per message or per batch (see the module docstring)."""
    if not settings.DB_PREPARED_STATEMENTS:
        with connection.cursor() as cur:
            yield cur
        return
    with cursor_open(_PreparingCursor) as cur:
        yield cur
