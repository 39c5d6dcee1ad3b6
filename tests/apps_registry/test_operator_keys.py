"""Operator keys: created from the shell and shown once, stored hashed, refused when wrong or
revoked, and never interchangeable with an app's API key."""

from __future__ import annotations

import hashlib

import pytest
from django.core.management import call_command

from apps_registry.models import OperatorKey
from apps_registry.services import operator_key_create, operator_key_revoke

pytestmark = pytest.mark.django_db

SELFTEST = "/api/v1/operator/selftest"


def test_creating_a_key_prints_it_once_and_stores_only_its_digest(capsys):
    call_command("operator_key", "create", "ci")
    out, err = capsys.readouterr()
    raw = out.strip()
    key = OperatorKey.objects.get(name="ci")
    assert raw.startswith(key.prefix + ".") and "shown once" in err
    assert key.key_hash == hashlib.sha256(raw.encode()).hexdigest() and raw not in key.key_hash

    call_command("operator_key", "list")
    listing = capsys.readouterr().out
    assert key.prefix in listing and raw not in listing


def test_a_revoked_key_is_refused_by_the_operator_api(anonymous_http, capsys):
    key, raw = operator_key_create(name="ci")
    call_command("operator_key", "revoke", key.prefix)
    response = anonymous_http.post(SELFTEST, json={}, headers={"Authorization": f"Bearer {raw}"})
    assert response.status_code == 401 and response.json()["error"] == "invalid_operator_key"


def test_a_wrong_key_or_none_is_refused_by_the_operator_api(anonymous_http):
    _, raw = operator_key_create(name="ci")
    wrong = raw[:-2] + ("AA" if not raw.endswith("AA") else "BB")
    refused = anonymous_http.post(SELFTEST, json={}, headers={"Authorization": f"Bearer {wrong}"})
    missing = anonymous_http.post(SELFTEST, json={})
    assert refused.status_code == 401 and refused.json()["error"] == "invalid_operator_key"
    assert missing.status_code == 401 and missing.json()["error"] == "unauthenticated"
    assert refused.headers["WWW-Authenticate"].startswith("Bearer")


def test_an_apps_api_key_cannot_call_the_operator_api(anonymous_http, anz_key):
    response = anonymous_http.delete(f"{SELFTEST}/ANZ", headers={"Authorization": f"Bearer {anz_key}"})
    assert response.status_code == 401 and response.json()["error"] == "invalid_operator_key"
    started = anonymous_http.post(SELFTEST, json={"app": "ANZ"}, headers={"Authorization": f"Bearer {anz_key}"})
    assert started.status_code == 401


def test_an_operator_key_cannot_call_the_app_api(anonymous_http, anz):
    _, raw = operator_key_create(name="ci")
    response = anonymous_http.post("/api/v1/messages", json={"to": "ANZ-1", "content": "x"},
                                   headers={"Authorization": f"Bearer {raw}"})
    assert response.status_code == 401 and response.json()["error"] == "invalid_api_key"


def test_a_valid_key_starts_and_ends_a_run(anonymous_http, anz):
    key, raw = operator_key_create(name="ci")
    auth = {"Authorization": f"Bearer {raw}"}
    started = anonymous_http.post(SELFTEST, json={}, headers=auth)
    assert started.status_code == 201, started.text
    name = started.json()["name"]
    assert anonymous_http.delete(f"{SELFTEST}/{name}", headers=auth).status_code == 204
    assert anonymous_http.delete(f"{SELFTEST}/{name}", headers=auth).status_code == 404
    key.refresh_from_db()
    assert key.last_used_at is not None


def test_the_console_lists_operator_keys_and_revokes_them_but_does_not_create_them(operator):
    key, raw = operator_key_create(name="laptop")
    listing = operator.get("/admin/apps_registry/operatorkey/")
    assert key.prefix in listing.content.decode() and raw not in listing.content.decode()
    assert operator.get("/admin/apps_registry/operatorkey/add/").status_code == 403
    operator.post("/admin/apps_registry/operatorkey/", {"action": "revoke", "_selected_action": [key.pk]})
    key.refresh_from_db()
    assert not key.is_active
    assert operator_key_revoke(operator_key=key).revoked_at == key.revoked_at
