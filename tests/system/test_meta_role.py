"""The meta role between real processes: a web node serving the test database's configuration as
the meta domain (domain-01), and a mirror domain (domain-09) with its own database that pulls it
with `manage.py meta_pull` and serves its users with a web node of its own."""

from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest
from django.db import connection

from apps_registry.models import Domain, UserDistribution
from tests.processes import ROOT, ModuleRequest, ProcessFactory, database_url_for_tests
from tests.wsclient import WsClient, wait_for

pytestmark = pytest.mark.system
SECRET = "meta-secret-of-the-test-network"


def _admin_url(name: str) -> str:
    db = connection.settings_dict
    return f"postgresql://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{name}"


@pytest.fixture(scope="module")
def mirror_db(demo_network):
    """A second database on the same Postgres, migrated: the mirror domain's own."""
    name = f"{connection.settings_dict['NAME']}_mirror"
    with psycopg.connect(_admin_url("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    url = database_url_for_tests().rsplit("/", 1)[0] + f"/{name}"
    migrate = _manage(url, "migrate", "--no-input")
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    yield url
    with psycopg.connect(_admin_url("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _manage(database_url: str, *argv: str, **env: str) -> subprocess.CompletedProcess:
    """A management command of the mirror domain, with the environment its processes get."""
    full_env = ProcessFactory(ModuleRequest("test_meta_role")).env(DATABASE_URL=database_url, DOMAIN_NAME="domain-09",
                                                                    **env)
    return subprocess.run([sys.executable, "manage.py", *argv], cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=300)


def _committed(django_db_blocker, fn):
    with django_db_blocker.unblock():
        return fn()


def _reply(node, user_id: str) -> dict:
    with WsClient(node.ws_url) as client:
        return client.auth(user_id)["data"]


def test_a_mirror_pulls_the_metas_configuration_and_its_web_node_follows_a_change(
        processes, demo_network, mirror_db, django_db_blocker):
    meta = processes.web("meta", META_SECRET=SECRET)
    _committed(django_db_blocker, lambda: Domain.objects.filter(name="domain-01").update(urls=[meta.ws_url]))
    try:
        pulled = _manage(mirror_db, "meta_pull", META_URL=meta.url, META_SECRET=SECRET)
        assert pulled.returncode == 0, pulled.stdout + pulled.stderr
        assert "configuration applied" in pulled.stdout

        mirror = processes.web("mirror", DATABASE_URL=mirror_db, DOMAIN_NAME="domain-09", META_URL=meta.url,
                               META_SECRET=SECRET)
        assert _reply(mirror, "ANZ-9000001")["isAuthenticated"] is True  # homed here, per the meta
        assert _reply(mirror, "ANZ-5")["redirect"] == meta.ws_url  # homed in the meta's domain

        # The meta's operator moves users 9000000 and up to domain-01; the next pull brings it here,
        # and the running web node follows within its snapshot lifetime.
        _committed(django_db_blocker, lambda: UserDistribution.objects.filter(range_from=9000000).update(
            domain=Domain.objects.get(name="domain-01")))
        assert "configuration applied" in _manage(mirror_db, "meta_pull", META_URL=meta.url,
                                                  META_SECRET=SECRET).stdout
        wait_for(lambda: _reply(mirror, "ANZ-9000001").get("redirect") == meta.ws_url, timeout=15, interval=0.2)

        again = _manage(mirror_db, "meta_pull", META_URL=meta.url, META_SECRET=SECRET)
        assert again.returncode == 0 and "configuration unchanged" in again.stdout

        forged = _manage(mirror_db, "meta_pull", META_URL=meta.url, META_SECRET="not-the-network-secret")
        assert forged.returncode == 1
        assert "meta pull failed" in forged.stderr and "answered 403" in forged.stderr and "bad signature" in forged.stderr
    finally:
        def restore():
            Domain.objects.filter(name="domain-01").update(urls=[])
            UserDistribution.objects.filter(range_from=9000000).update(domain=Domain.objects.get(name="domain-09"))
        _committed(django_db_blocker, restore)
