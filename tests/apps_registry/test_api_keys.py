from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from apps_registry.models import ApiKey
from apps_registry.services import api_key_authenticate, api_key_create, api_key_revoke
from tests.factories import make_app

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


def test_a_key_is_stored_only_as_a_hash_with_a_visible_prefix():
    key, raw = api_key_create(app=make_app(), name="billing server")
    stored = ApiKey.objects.get(pk=key.pk)
    assert raw.startswith(stored.prefix + ".")
    assert raw not in (stored.key_hash, stored.prefix)
    assert len(stored.key_hash) == 64
    assert api_key_authenticate(raw_key=raw).app.app_name == "ANZ"


def test_a_wrong_or_truncated_key_is_refused():
    _, raw = api_key_create(app=make_app(), name="k")
    assert api_key_authenticate(raw_key=raw[:-1] + ("A" if raw[-1] != "A" else "B")) is None
    assert api_key_authenticate(raw_key=raw.split(".")[0]) is None
    assert api_key_authenticate(raw_key="") is None


def test_a_revoked_key_stops_working_and_use_is_recorded():
    key, raw = api_key_create(app=make_app(), name="k")
    api_key_authenticate(raw_key=raw)
    assert ApiKey.objects.get(pk=key.pk).last_used_at is not None
    api_key_revoke(api_key=key)
    assert api_key_authenticate(raw_key=raw) is None


def test_admin_shows_a_new_key_once(client):
    app = make_app()
    client.force_login(User.objects.create_superuser("ops", password="pw-ops-12345"))
    response = client.post("/admin/apps_registry/apikey/add/", {"app": app.pk, "name": "crm"}, follow=True)
    page = response.content.decode()
    assert "shown only this once" in page
    raw = page.split("<code id='new-api-key'>")[1].split("</code>")[0]
    assert api_key_authenticate(raw_key=raw) is not None
    key = ApiKey.objects.get()
    again = client.get(f"/admin/apps_registry/apikey/{key.pk}/change/").content.decode()
    assert raw not in again and key.prefix in again


def test_admin_action_revokes(client):
    key, raw = api_key_create(app=make_app(), name="k")
    client.force_login(User.objects.create_superuser("ops", password="pw-ops-12345"))
    client.post("/admin/apps_registry/apikey/", {"action": "revoke", "_selected_action": [key.pk]})
    assert api_key_authenticate(raw_key=raw) is None


@pytest.mark.django_db(transaction=True)
def test_apikey_command_prints_the_key_as_its_last_line():
    import os

    from django.conf import settings

    from tests.processes import database_url_for_tests

    make_app(app_name="CLIKEY", app_id="cli-key-app", master="CLIKEY-1")
    env = {**os.environ, "DATABASE_URL": database_url_for_tests(), "REDIS_URL": settings.REDIS_URL}
    result = subprocess.run([sys.executable, "manage.py", "apikey", "create", "CLIKEY", "--name", "crm"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    raw = result.stdout.strip().splitlines()[-1]
    key = api_key_authenticate(raw_key=raw)
    assert (key.app.app_name, key.name) == ("CLIKEY", "crm")
    unknown = subprocess.run([sys.executable, "manage.py", "apikey", "create", "NOPE"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
    assert unknown.returncode != 0 and "no client app named 'NOPE'" in unknown.stderr
