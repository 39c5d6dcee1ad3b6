"""Every "one at a time" of the platform, in one module: the Postgres advisory lock and the Redis
lease, side by side. Neither ever waits: whoever finds the key taken is told so and goes away (its
work is someone else's now, or the next run's). The one lock that waits, `in_turn(key)`, serialises
short statements of one key inside the caller's own transaction (a user's requests counted and stored
one at a time).

**`one_at_a_time(key)`: the Postgres advisory lock**, for work on the database: one sender per link
(foundation.outbound's skeleton, messaging.federation's held rows), one analytics export, one report
of a kind. A transaction-level advisory lock (`pg_try_advisory_xact_lock`) taken in a transaction of
a connection kept for locks (one per thread), and ended (rolled back) when the work it guards ends.
A transaction is one server session also behind a pooler in transaction mode, so lock and unlock can
never land on different sessions; and it can never outlive its work: the block ends it, and a dead
worker's connection ends it. The work itself runs on the thread's ordinary (Django) connection,
committing as it goes. The transaction reads nothing and writes nothing: it holds no snapshot (READ
COMMITTED), so it never holds back vacuum.

**`lease(name, ttl=...)`: the Redis lease** (SET NX PX, through redis-py's Lock, whose release
deletes the key only while it still holds the holder's token), for work whose truth is in Redis: the
node reaper (presence.dead_nodes) reads which nodes' keys are gone. A holder that dies frees it
after `ttl` seconds; a run slower than that may overlap the next one, so `ttl` is well past a run.

Marks set with SET NX that are not locks stay where they are used, and say so: a link sender's
wake-up on its way (foundation.handoff: one task handed over per mark, whatever runs it takes its
own lock here) and a signed call's nonce (foundation.signed_calls: a replay is refused, nothing is
held). tests/config/test_side_doors.py finds advisory-lock SQL or a Redis lease anywhere else.

This module imports no app: foundation is below every layer.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection

from foundation.patches.django import connection_new
from foundation.transport.redis_clients import sync_client

log = logging.getLogger(__name__)

LEASE_KEY = "sb:lock:{name}"


def in_turn_many(keys: list[str]) -> None:
    """`in_turn` for several keys at once, one statement, taken in sorted order (two callers with
    overlapping keys queue up instead of deadlocking)."""
    if keys:
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(k, 0)) "
                        "FROM (SELECT DISTINCT unnest(%s::text[]) AS k ORDER BY 1) AS keys", [keys])


def in_turn(key: str) -> None:
    """Wait for `key`'s turn in the caller's transaction (a transaction-level advisory lock on its
    Django connection, ended with that transaction): what runs after it under the same key in
    other transactions waits for this one to commit or roll back. For a few statements only: it
    holds a connection's transaction open while it waits."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [key])


def in_turn_shared_sql(key_sql: str) -> str:
    """A trigger's statement (plpgsql) for writers that may go together but not beside one `in_turn`
    of the key the SQL expression `key_sql` computes: it waits while that turn is held elsewhere,
    and holds it off, shared with the other writers, until its own transaction ends."""
    return f"PERFORM pg_advisory_xact_lock_shared(hashtextextended({key_sql}, 0))"


# --- the Postgres advisory lock -------------------------------------------------------------------

_locks = threading.local()
_lock_connections: weakref.WeakSet = weakref.WeakSet()
_lock_connections_guard = threading.Lock()


def _lock_connection():
    conn = getattr(_locks, "conn", None)
    if conn is None or conn.closed or getattr(_locks, "dsn_name", None) != connection.settings_dict.get("NAME"):
        conn = connection_new()
        conn.autocommit = False
        _locks.conn = conn
        _locks.dsn_name = connection.settings_dict.get("NAME")
        with _lock_connections_guard:
            _lock_connections.add(conn)
    return conn


def lock_connections_close() -> None:
    """Close every lock connection of this process (a test session, before its database is dropped)."""
    with _lock_connections_guard:
        conns = list(_lock_connections)
        _lock_connections.clear()
    for conn in conns:
        try:
            conn.close()
        except Exception:  # noqa: BLE001  (closing what may already be broken)
            pass
    _locks.conn = None


@contextmanager
def one_at_a_time(key: str) -> Iterator[bool]:
    """Yields whether this thread holds `key` now (never waits): one holder per key across every
    process on the database, until the block ends (see the module docstring). Not re-entrant
    within a thread: nest only different keys."""
    depth = getattr(_locks, "depth", 0)
    if depth:
        raise RuntimeError(f"one_at_a_time({key!r}) inside another one_at_a_time of this thread")
    conn = _lock_connection()
    try:
        row = conn.execute("SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))", [key]).fetchone()
    except Exception:
        _lock_connection_drop(conn)
        raise
    held = bool(row[0])
    _locks.depth = 1
    try:
        yield held
    finally:
        _locks.depth = 0
        try:
            conn.rollback()  # ends the transaction: the lock goes with it
        except Exception:  # noqa: BLE001  (a broken connection released the lock already)
            _lock_connection_drop(conn)


def _lock_connection_drop(conn) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001
        pass
    _locks.conn = None


def lock_held_elsewhere(key: str) -> bool:
    """Whether some session holds `key` now in this database (the console; tests). A bigint
    advisory key shows in pg_locks as its high and low 32 bits (classid, objid), with objsubid 1;
    advisory locks belong to a database (another database's holder of the same key is not one)."""
    with connection.cursor() as cur:
        cur.execute(
            "WITH k AS (SELECT hashtextextended(%s, 0) AS h)"
            " SELECT EXISTS (SELECT 1 FROM pg_locks, k WHERE locktype = 'advisory' AND granted AND objsubid = 1"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND classid = ((h >> 32) & 4294967295)::oid AND objid = (h & 4294967295)::oid)", [key])
        return bool(cur.fetchone()[0])



# --- the Redis lease ------------------------------------------------------------------------------


@contextmanager
def lease(name: str, *, ttl: int) -> Iterator[bool]:
    """Yields whether this process holds the cluster-wide lease `name` now (never waits), for at most
    `ttl` seconds; released when the block ends (a lease that expired under a very slow run has
    nothing to undo: logged)."""
    lock = sync_client().lock(LEASE_KEY.format(name=name), timeout=ttl, blocking=False)
    if not lock.acquire():
        yield False
        return
    try:
        yield True
    finally:
        try:
            lock.release()
        except Exception:  # noqa: BLE001  (expired, and perhaps taken by the next holder: not ours to free)
            log.warning("lease %s had expired before its release", name)
