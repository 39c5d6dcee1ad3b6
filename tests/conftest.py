"""Shared fixtures. Every test runs on real Postgres and Redis (embedded unless the env says)."""

from __future__ import annotations

import threading
import traceback

import pytest
from django.conf import settings
from django.db import connections, transaction
from django.test import TransactionTestCase
from pytest_django import fixtures as _pytest_django_fixtures
from pytest_django import plugin as _pytest_django_plugin

# pytest-django sets up the test database only for the aliases the selected tests mark
# (django_db); a run of system tests that commit through django_db_blocker (tests/processes.py
# demo_network) and mark none would otherwise run against the development database. The default
# database is always set up.
_databases_for_setup = _pytest_django_fixtures._get_databases_for_setup


def _always_the_default_database(items):
    aliases, serialized = _databases_for_setup(items)
    return {*aliases, "default"}, serialized


_pytest_django_fixtures._get_databases_for_setup = _always_the_default_database


# pytest-django blocks database access outside django_db tests by replacing the connection class's
# ensure_connection, for every thread of the process. The platform's own threads in the test process
# (the in-process node's database lanes and heartbeat, its worker) are not the test's: blocked in the
# middle of their work, an atomic block's way out fails after its COMMIT, before autocommit is back
# on, and every later block of that thread runs inside one transaction nobody ends (its locks held
# for the rest of the run). The block applies to the test's own thread only.
def _block_the_test_thread_only(self):
    self._save_active_wrapper()
    real = self._real_ensure_connection

    def ensure_connection(conn, *args, **kwargs):
        if threading.current_thread() is threading.main_thread():
            self._blocking_wrapper()
        return real(conn, *args, **kwargs)

    self._dj_db_wrapper.ensure_connection = ensure_connection
    return _pytest_django_plugin._DatabaseBlockerContextManager(self)


_pytest_django_plugin.DjangoDbBlocker.block = _block_the_test_thread_only


# A transactional test (django_db(transaction=True)) ends with Django's `flush`: TRUNCATE of every
# table (a new file per table, about 0.2 s here), then the post_migrate signal recreating the content
# types and permissions it just emptied. Emptying the tables with DELETE (a few ms when they hold a
# test's few rows; TRUNCATE still for a table that holds thousands) leaves the same empty database
# behind, keeping the content types and permissions, which no test changes.
KEPT_TABLES = frozenset({"django_content_type", "auth_permission", "django_migrations"})
BIG_TABLE_ROWS = 2000
_flushed_tables: dict[str, list[str]] = {}
_django_fixture_teardown = TransactionTestCase._fixture_teardown


def _tables_emptied(self) -> None:
    if self.available_apps is not None or self.serialized_rollback:
        return _django_fixture_teardown(self)
    for alias in self._databases_names(include_mirrors=False):
        conn = connections[alias]
        tables = _flushed_tables.get(alias)
        if tables is None:
            tables = _flushed_tables[alias] = sorted(
                t for t in conn.introspection.django_table_names(only_existing=True, include_views=False)
                if t not in KEPT_TABLES)
        quoted = [conn.ops.quote_name(t) for t in tables]
        with conn.cursor() as cur:
            cur.execute(" UNION ALL ".join(
                f"SELECT {n}, (SELECT count(*) FROM (SELECT 1 FROM {q} LIMIT {BIG_TABLE_ROWS + 1}) x)"
                for n, q in enumerate(quoted)))
            big = {quoted[n] for n, rows in cur.fetchall() if rows > BIG_TABLE_ROWS}
        with transaction.atomic(using=alias), conn.cursor() as cur:
            cur.execute("SET CONSTRAINTS ALL DEFERRED")
            if big:
                cur.execute(f"TRUNCATE {', '.join(sorted(big))} CASCADE")
            cur.execute("".join(f"DELETE FROM {q};" for q in quoted if q not in big))


TransactionTestCase._fixture_teardown = _tables_emptied


def _left_in_a_transaction() -> list[str]:
    """The aliases whose connection on this (the test's) thread is still inside a transaction."""
    from foundation.asyncdb import connection_discard, transaction_left_open

    left = [conn for conn in connections.all(initialized_only=True) if transaction_left_open(conn)]
    for conn in left:
        connection_discard(conn)  # the server rolls it back; the next test connects afresh
    return [conn.alias for conn in left]


# Where each connection's outermost atomic block was entered: named when a transaction is found
# left open (_abandoned_transactions).
_atomic_enter = transaction.Atomic.__enter__


def _atomic_enter_noted(self):
    _atomic_enter(self)
    conn = transaction.get_connection(self.using)
    if len(conn.atomic_blocks) == 1:
        conn._entered_at = traceback.extract_stack(limit=14)[:-1]


transaction.Atomic.__enter__ = _atomic_enter_noted
ABANDONED_AFTER_SECONDS = 15
_watch: list = []


def _abandoned_transactions() -> list[str]:
    """Transactions of this process idle for longer than ABANDONED_AFTER_SECONDS: on any thread, a
    transaction nobody is working in. Each is described (its thread, where its atomic block was
    entered, its last statement) and ended on the server, so the rest of the run is not held up."""
    import gc

    import psycopg
    from django.db.backends.base.base import BaseDatabaseWrapper

    default = connections["default"]
    if not _watch:
        params = {**default.get_connection_params(), "dbname": "postgres", "application_name": "pytest-watch"}
        try:
            _watch.append(psycopg.connect(**params, autocommit=True))
        except psycopg.Error:
            _watch.append(None)  # a server whose maintenance database is out of reach: not watched
    if _watch[0] is None:
        return []
    label = default.settings_dict["OPTIONS"].get("application_name", "")
    # The test thread's own connections are left out: inside a django_db test, its transaction is
    # the test's, idle while the test waits on other processes (a long settle under load), and
    # rolled back by the fixtures' teardown; _left_in_a_transaction checks them after it.
    own = [conn.connection.info.backend_pid for conn in connections.all(initialized_only=True)
           if conn.connection is not None and not conn.connection.closed]
    rows = _watch[0].execute(
        "SELECT pid, now() - state_change, query FROM pg_stat_activity WHERE application_name = %s"
        " AND state = 'idle in transaction' AND now() - state_change > make_interval(secs => %s)"
        " AND NOT pid = ANY(%s)",
        [label, ABANDONED_AFTER_SECONDS, own]).fetchall()
    if not rows:
        return []
    wrappers = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, BaseDatabaseWrapper) and obj.connection is not None and not obj.connection.closed:
                wrappers[obj.connection.info.backend_pid] = obj
        except ReferenceError:  # a weak proxy whose object is gone
            continue
    threads = {t.ident: t.name for t in threading.enumerate()}
    found = []
    for pid, idle, query in rows:
        conn = wrappers.get(pid)
        where = "".join(traceback.format_list(getattr(conn, "_entered_at", []) or [])) or "(no atomic block recorded)\n"
        found.append(
            f"backend {pid} idle in transaction for {idle} after {query[:200]!r}; thread "
            f"{threads.get(getattr(conn, '_thread_ident', None), 'gone') if conn else '(no wrapper found)'}, "
            f"in_atomic_block={getattr(conn, 'in_atomic_block', None)}, atomic entered at:\n{where}")
        _watch[0].execute("SELECT pg_terminate_backend(%s)", [pid])
    return found


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """A test that leaves the test thread's connection inside a transaction fails here, by name,
    instead of silently holding every later test of its worker inside that transaction (their
    writes never commit; the export's horizon and other processes wait on its locks). So does one
    after which a transaction of this process on any thread has been left idle (described)."""
    abandoned = _abandoned_transactions()  # before the fixtures' teardown, which might wait on its locks
    outcome = yield
    left = _left_in_a_transaction()
    if left:
        raise AssertionError(f"{item.nodeid} left its database connection ({', '.join(left)}) inside a "
                             "transaction after teardown; rolled back")
    abandoned += _abandoned_transactions()
    if abandoned:
        raise AssertionError(f"after {item.nodeid}, transactions of this process were left open:\n"
                             + "\n".join(abandoned))
    return outcome


@pytest.fixture
def benchmarks_alone():
    """No benchmark of another test worker runs meanwhile: the benchmark tests count the benchmark
    databases on the server before and after (so every test that starts a benchmark platform takes
    this, the storm's included)."""
    import fcntl

    from devstack.embedded import var_dir

    path = var_dir() / "test-workers" / "benchmarks.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


@pytest.fixture
def redis_client():
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client
    client.close()


@pytest.fixture
def operator(client):
    """A superuser logged in to the console (the admin tests' persona)."""
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_superuser("ops", password="pw-ops-12345"))
    return client


@pytest.fixture(scope="session", autouse=True)
def _clean_test_redis():
    """The test Redis database starts empty: no presence or queued tasks from an earlier run."""
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    client.flushdb()
    client.close()


@pytest.fixture(scope="session", autouse=True)
def _pool_connections_closed_at_the_end(django_db_setup, django_db_blocker):
    """Services called through foundation.asyncdb.run_db in this process hold a connection per pool
    thread, foundation.outbound a lock connection per thread that took a lock, and /readyz one on
    its checks' thread; the test database can only be dropped once they are closed."""
    yield
    from config.health import checks_connection_close
    from foundation.asyncdb import pool_connections_close
    from foundation.locks import lock_connections_close

    pool_connections_close()
    lock_connections_close()
    checks_connection_close()
    with django_db_blocker.unblock():
        _sessions_left_on_the_test_database()


def _sessions_left_on_the_test_database() -> None:
    """Any other session still on the test database at the end would make its drop fail (a bare
    "being accessed by other users" warning): named here, by its application name and last query,
    then ended, so the database is dropped and the run says what held it."""
    import warnings

    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("""SELECT pid, application_name, state, backend_start, left(query, 200) FROM pg_stat_activity
                          WHERE datname = current_database() AND pid <> pg_backend_pid()""")
        left = cursor.fetchall()
        for pid, *_ in left:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    if left:
        warnings.warn("sessions left on the test database at the end of the run (ended): "
                      + "; ".join(f"{name or '(no name)'} {state} since {started:%H:%M:%S}: {query!r}"
                                  for _, name, state, started, query in left), stacklevel=1)


@pytest.fixture(autouse=True)
def handoff(request):
    """Where this test's process hands named work (foundation.handoff): a fresh InlineDispatcher,
    run by `handoff.pump()`; for a system or browser test, the broker, as real workers serve it."""
    from foundation.handoff import CeleryDispatcher, InlineDispatcher, dispatcher_use

    real_workers = request.node.get_closest_marker("system") or request.node.get_closest_marker("browser")
    dispatcher = CeleryDispatcher() if real_workers else InlineDispatcher()
    previous = dispatcher_use(dispatcher)
    yield dispatcher
    dispatcher_use(previous)


from tests.inprocess import inprocess, inprocess_node  # noqa: E402,F401  (fixtures: a web node and a worker here)
from tests.messaging.api.fixtures import (  # noqa: E402,F401  (fixtures of the server API tests)
    anonymous_http,
    anz,
    anz_key,
    api,
    bnz,
    bnz_api,
    bnz_key,
    http,
    live_connection,
    wsgi_app,
)
from tests.processes import demo_network, module_processes, node, private_redis, processes  # noqa: E402,F401  (fixtures)


@pytest.fixture(autouse=True)
def _fresh_app_snapshots():
    """Tests create and drop apps under the same names; a process keeps app snapshots for a few
    seconds (apps_registry.selectors), so each test starts without them."""
    from apps_registry.selectors import app_snapshots_clear
    from messaging.federation.links import graph_cache_clear

    app_snapshots_clear()
    graph_cache_clear()  # the domain graph is cached for a second too (messaging.federation.links)
    yield



@pytest.fixture(autouse=True)
def _takeover_look_pinned_where_queries_are_counted(request, monkeypatch):
    """Where a test counts a request's queries, the look at the takeovers' epoch (one small query at
    most every TAKEOVER_LOOK_SECONDS, apps_registry.selectors) is not the request's cost: on a slow
    run it would fall inside the counted block now and then."""
    if {"django_assert_num_queries", "django_assert_max_num_queries"} & set(request.fixturenames):
        monkeypatch.setattr("apps_registry.selectors.TAKEOVER_LOOK_SECONDS", float("inf"))


# The modules that take longest, longest first (their tests' wall time on a 2-core machine under the
# suite, 2026-11-29: the network ring about 7 minutes, the rest 50 s to 2.5 min). Under pytest-xdist a
# module runs whole on one worker, in the order collected (`make test` passes --no-loadscope-reorder,
# which would order modules by their number of tests): started last, the ring ran alone at the end
# for minutes while the other worker had nothing left to do.
LONGEST_FIRST = [
    "tests/system/test_network_ring.py",
    "tests/system/test_rolling_restart.py",
    "tests/analytics/test_local_cluster.py",
    "tests/system/test_channel_streams.py",
    "tests/system/test_supervise.py",
    "tests/analytics/test_presence_report.py",
    "tests/system/test_cluster_failures.py",
    "tests/system/test_exchange_end_to_end.py",
    "tests/config/test_settings.py",
    "tests/system/test_presence_healing.py",
    "tests/bench/test_storm.py",
    "tests/system/test_socketio_bounds.py",
    "tests/analytics/test_bench.py",
    "tests/system/test_master_catch_up.py",
    "tests/messaging/federation/test_takeover.py",
    "tests/system/test_postgres_fault.py",
    "tests/system/test_delivery_guarantees.py",
    "tests/browser/test_switchboard_browser.py",
    "tests/system/test_api_postgres_fault.py",
    "tests/system/test_queue_intake.py",
    "tests/system/test_meta_role.py",
    "tests/system/test_socketio_node.py",
]


def pytest_collection_modifyitems(session, config, items):
    rank = {module: i for i, module in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # (stable: the rest as collected)
