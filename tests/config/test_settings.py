from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from config.settings.env import database_from_url, env_bool, env_int

ROOT = Path(__file__).resolve().parents[2]


def _check(env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "DATABASE_URL", "REDIS_URL", "DEBUG"}}
    clean.update(env)
    return subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=clean,
                          capture_output=True, text=True, timeout=120)


def test_production_with_the_default_secret_and_no_services_fails_the_system_check():
    result = _check({"DJANGO_SETTINGS_MODULE": "config.settings.production"})
    assert result.returncode != 0
    assert "switchboard.E001" in result.stderr
    assert "switchboard.E003" in result.stderr
    assert "switchboard.E004" in result.stderr


def test_production_configured_from_the_environment_passes_the_system_check():
    result = _check({
        "DJANGO_SETTINGS_MODULE": "config.settings.production",
        "SECRET_KEY": "x" * 60,
        "DATABASE_URL": "postgresql://u:p@db.internal:5432/switchboard",
        "REDIS_URL": "redis://cache.internal:6379/0",
        "ALLOWED_HOSTS": "switchboard.example.com",
    })
    assert result.returncode == 0, result.stderr


def test_an_invalid_domain_name_is_reported_with_its_check_id():
    result = _check({"DOMAIN_NAME": "not a domain!"})
    assert "switchboard.E006" in result.stderr


def test_a_master_snapshot_page_of_no_users_is_reported_with_its_check_id():
    result = _check({"PRESENCE_SNAPSHOT_PAGE": "0"})
    assert result.returncode != 0 and "switchboard.E010" in result.stderr


def test_bounds_of_the_door_between_domains_that_would_refuse_genuine_calls_are_reported_with_their_ids():
    result = _check({"NETWORK_LARGE_BODIES_PER_LINK": "0", "HTTP_BODY_TIMEOUT_SECONDS": "-1",
                     "TAKEOVER_EPOCH_MAX_AHEAD_SECONDS": "0"})
    assert result.returncode != 0
    assert all(f"switchboard.{code}" in result.stderr for code in ("E030", "E031", "E032"))


def test_secrets_can_come_from_files(tmp_path, monkeypatch):
    secret = tmp_path / "secret"
    secret.write_text("from-a-file\n")
    monkeypatch.setenv("SOMETHING_FILE", str(secret))
    from config.settings.env import env_str

    assert env_str("SOMETHING") == "from-a-file"


def test_typed_helpers_refuse_garbage(monkeypatch):
    monkeypatch.setenv("A_BOOL", "maybe")
    monkeypatch.setenv("AN_INT", "ten")
    with pytest.raises(ImproperlyConfigured):
        env_bool("A_BOOL")
    with pytest.raises(ImproperlyConfigured):
        env_int("AN_INT", 1)


def test_database_url_must_be_postgres():
    with pytest.raises(ImproperlyConfigured, match="Postgres only"):
        database_from_url("sqlite:///db.sqlite3")
    db = database_from_url("postgresql://bob:s%40cret@10.0.0.5:6543/sb?sslmode=require")
    assert (db["USER"], db["PASSWORD"], db["HOST"], db["PORT"], db["NAME"]) == ("bob", "s@cret", "10.0.0.5", "6543", "sb")
    assert db["OPTIONS"] == {"sslmode": "require"}


def test_defaults_name_this_node():
    assert settings.DOMAIN_NAME == os.environ.get("DOMAIN_NAME", "domain-01")
    assert settings.NODE_ID


def test_six_hundred_concurrent_channel_layer_calls_do_not_exhaust_the_redis_pool():
    # redis-py 8 caps an asyncio pool at 100 connections by default and then raises
    # "Too many connections"; a node with hundreds of consumers makes that many calls at once.
    from channels.layers import get_channel_layer

    async def burst():
        layer = get_channel_layer()
        names = [await layer.new_channel() for _ in range(600)]
        await asyncio.gather(*(layer.group_add("pool-test", n) for n in names))
        await asyncio.gather(*(layer.send(n, {"type": "t.ping", "i": i}) for i, n in enumerate(names)))
        received = await asyncio.gather(*(layer.receive(n) for n in names))
        await asyncio.gather(*(layer.group_discard("pool-test", n) for n in names))
        await layer.flush()
        return received

    from foundation.transport.sockets import run_async

    received = run_async(burst(), timeout=60)  # one long-lived loop, as a worker process has
    assert sorted(m["i"] for m in received) == list(range(600))


def test_production_warns_when_plain_http_webhooks_are_allowed():
    result = _check({
        "DJANGO_SETTINGS_MODULE": "config.settings.production",
        "SECRET_KEY": "x" * 60,
        "DATABASE_URL": "postgresql://u:p@db.internal:5432/switchboard",
        "REDIS_URL": "redis://cache.internal:6379/0",
        "ALLOWED_HOSTS": "switchboard.example.com",
        "WEBHOOKS_ALLOW_HTTP": "true",
    })
    assert result.returncode == 0 and "switchboard.W002" in result.stderr


PRODUCTION_ENV = {
    "DJANGO_SETTINGS_MODULE": "config.settings.production",
    "SECRET_KEY": "x" * 60,
    "DATABASE_URL": "postgresql://u:p@db.internal:5432/switchboard",
    "REDIS_URL": "redis://cache.internal:6379/0",
    "ALLOWED_HOSTS": "switchboard.example.com",
}


def test_production_warns_when_tenants_calls_may_reach_a_wide_private_network():
    result = _check({**PRODUCTION_ENV, "OUTGOING_ALLOWED_NETWORKS": "10.0.0.0/8,10.1.2.0/24"})
    assert result.returncode == 0
    warning = next(line for line in result.stderr.splitlines() if "switchboard.W003" in line)
    assert "10.0.0.0/8" in warning and "10.1.2.0/24" not in warning


def test_an_allowed_network_that_is_not_a_network_fails_the_system_check():
    result = _check({**PRODUCTION_ENV, "OUTGOING_ALLOWED_NETWORKS": "10.1.2.0/24,intranet"})
    assert result.returncode != 0 and "switchboard.E009" in result.stderr and "intranet" in result.stderr
