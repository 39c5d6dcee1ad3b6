"""Django's internals, reached into on the version it was tested with (foundation.patches.versions).

1. **A handler with one middleware** (`middleware_chain_set`): the calls between domains skip the
   site's middleware chain (foundation.lean_http), so the lean handler sets what
   BaseHandler.load_middleware sets, its private `_view_middleware`, `_template_response_middleware`,
   `_exception_middleware` and `_middleware_chain`, around its private `_get_response(_async)`.
2. **A connection left in a transaction, found and reset** (`transaction_left_open`,
   `connection_discard`): a pooled database thread must not carry one call's transaction into the
   next (foundation.asyncdb), so the connection's atomic-block flags are read, and reset as
   BaseDatabaseWrapper.connect resets them.
3. **A cursor of ours, opened as Django opens its own** (`cursor_open`): the hot statements run on a
   psycopg cursor that prepares them (foundation.db), with the connection made, a broken transaction
   refused and database errors turned into Django's, as Django's CursorWrapper does.
4. **A response marked as logged** (`response_logged`): /readyz's 503 while draining is expected, not
   an error line; Django's log_response skips a response whose private `_has_been_logged` is set.
5. **A command's raw output stream** (`command_stream`): a progress bar writes carriage returns to
   the stream under a command's OutputWrapper (its private `_out`), whose `write` would end every
   update with a new line.
6. **A connection of our own, made as Django makes its own** (`connection_new`): the advisory locks
   are held on a connection apart from the thread's (foundation.locks), opened with what the psycopg
   backend's `get_connection_params` and `get_new_connection` (backend internals) build, less its
   cursor class and prepare threshold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import psycopg
from django.core.handlers.base import BaseHandler
from django.core.handlers.exception import convert_exception_to_response
from django.core.management.base import OutputWrapper
from django.db import connection
from django.http import HttpResponse

from foundation.patches.versions import require_tested

# After an upgrade, check every patch above against the new version, then change this.
TESTED_VERSIONS = {"Django": "5.2.19"}
require_tested(TESTED_VERSIONS, patcher=__name__,
               risk="on other versions a database thread can carry one call's transaction into the next, and "
                    "the calls between domains can lose their error handling")


# 1.
def middleware_chain_set(handler: BaseHandler, middleware: Callable[[Callable], Callable], is_async: bool) -> None:
    """What `handler.load_middleware(is_async)` sets, with `middleware` as the only middleware."""
    handler._view_middleware = []
    handler._template_response_middleware = []
    handler._exception_middleware = []
    view = convert_exception_to_response(handler._get_response_async if is_async else handler._get_response)
    handler._middleware_chain = convert_exception_to_response(middleware(view))


# 2.
def transaction_left_open(conn) -> bool:
    """Whether a connection of this thread is still in a transaction (three flags read, no query): an
    atomic block entered and never left, or autocommit left off, which happens when leaving the
    outermost block fails to turn it back on (its COMMIT is done, but every later block on the
    connection then runs as a savepoint of one transaction that is never committed)."""
    if conn.in_atomic_block:
        return True
    raw = conn.connection
    return raw is not None and not raw.closed and (
        not conn.autocommit or raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE)


def connection_discard(conn) -> None:
    """Close a connection of this thread that was left in a transaction (the server rolls it back),
    and reset what connect() resets, so the next use connects afresh instead of being refused as "in
    an atomic block" (the block's owner is gone and will never leave it)."""
    conn.close()
    conn.connection = None
    conn.in_atomic_block = conn.closed_in_transaction = conn.needs_rollback = False
    conn.atomic_blocks, conn.savepoint_ids = [], []


# 3.
@contextmanager
def cursor_open(cursor_class: type[psycopg.Cursor]) -> Iterator[Any]:
    """A `cursor_class` cursor on this thread's connection, in its transaction, its errors Django's."""
    connection.ensure_connection()
    connection.validate_no_broken_transaction()
    with connection.wrap_database_errors, cursor_class(connection.connection) as cur:
        yield cur


# 4.
def response_logged(response: HttpResponse) -> None:
    response._has_been_logged = True


# 5.
def command_stream(output: OutputWrapper) -> TextIO:
    return output._out


# 6.
def connection_new() -> psycopg.Connection:
    """A psycopg connection of its own to this thread's database, outside Django's transaction handling."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("prepare_threshold", None)
    return connection.get_new_connection(params)
