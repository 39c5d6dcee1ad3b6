from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import redis
from django.conf import settings

from devstack import embedded

ROOT = Path(__file__).resolve().parents[2]


def test_embedded_services_avoid_the_default_ports():
    state = embedded._load_state(embedded.var_dir())
    if not state:  # the suite runs against DATABASE_URL/REDIS_URL from the environment
        return
    assert state["postgres"]["port"] != 5432
    assert state["redis"]["port"] != 6379


def test_a_second_process_sees_the_same_services(tmp_path):
    # A second terminal's `manage.py shell` must find the running platform's Postgres and Redis.
    key = "switchboard:test:second-process"
    redis.Redis.from_url(settings.REDIS_URL).set(key, "hello", ex=60)
    code = f"from django.conf import settings; import redis; print(redis.Redis.from_url(settings.REDIS_URL).get('{key}').decode())"
    result = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("hello")


def test_embedded_services_keep_data_across_a_restart_and_stop_cleanly(tmp_path):
    root = tmp_path / "var"
    first = embedded.ensure_running(root=root)
    with psycopg.connect(first.database_url, autocommit=True) as conn:
        conn.execute("create table survivor (note text)")
        conn.execute("insert into survivor values ('still here')")
    redis.Redis.from_url(first.redis_url).set("survivor", "still here")

    again = embedded.ensure_running(root=root)
    assert again == first  # reused, not started twice

    assert sorted(embedded.stop(root=root)) == ["postgres", "redis"]
    assert embedded.status(root=root) == {"postgres": False, "redis": False}

    second = embedded.ensure_running(root=root)
    try:
        with psycopg.connect(second.database_url) as conn:
            assert conn.execute("select note from survivor").fetchone() == ("still here",)
        assert redis.Redis.from_url(second.redis_url).get("survivor") == b"still here"
    finally:
        embedded.stop(root=root)
