"""The platform the comparison starts (`--start-platform`, `make bench`) runs on a database and a
Redis of its own, never on the operator's, and both are gone after the run."""

from __future__ import annotations

import os

import httpx
import psycopg
import pytest
import redis

from analytics.bench_sandbox import DATABASE_PREFIX, MARKER_TABLE, database_of
from bench.platform_proc import platform_processes
from bench.servers import free_port


def _contents(url: str) -> dict[str, int]:
    """Every table of the database at `url` with its row count."""
    with psycopg.connect(url) as conn:
        tables = [name for (name,) in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename")]
        return {name: conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0] for name in tables}


def _databases(url: str) -> set[str]:
    """The benchmarks' databases on the server (other test workers make and drop databases of their own)."""
    with psycopg.connect(url) as conn:
        return {name for (name,) in conn.execute("SELECT datname FROM pg_database") if name.startswith(DATABASE_PREFIX)}


@pytest.mark.timeout(600)
def test_the_benchmark_platform_runs_on_a_database_and_redis_of_its_own(tmp_path, benchmarks_alone):
    operator_db = os.environ["DATABASE_URL"]  # what `make run` in this checkout uses
    operator_redis = redis.Redis.from_url(os.environ["REDIS_URL"])
    before, databases, redis_keys = _contents(operator_db), _databases(operator_db), operator_redis.dbsize()

    with platform_processes(free_port(), tmp_path, worker_concurrency=1) as running:
        assert httpx.get(running.url.replace("ws://", "http://").replace("/ws", "/readyz")).status_code == 200
        assert database_of(running.database_url) not in databases
        with psycopg.connect(running.database_url) as conn:
            assert conn.execute(f"SELECT count(*) FROM {MARKER_TABLE}").fetchone() == (1,)
            assert conn.execute("SELECT count(*) FROM apps_registry_clientapp").fetchone() >= (1,)  # bootstrapped here
        assert running.redis_url != os.environ["REDIS_URL"]

    assert _contents(operator_db) == before
    assert _databases(operator_db) == databases
    assert operator_redis.dbsize() == redis_keys
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(running.redis_url, socket_connect_timeout=1).ping()
