from __future__ import annotations

import pytest
import yaml

from apps_registry.config_entries import ConfigError
from apps_registry.config_io import config_export, config_import
from apps_registry.pusher_credentials import PusherCredentials
from apps_registry.selectors import app_snapshot_by_pusher_app_id, app_snapshot_by_pusher_key, app_snapshots_clear
from tests.factories import make_app

pytestmark = pytest.mark.django_db

FILE = """
domains: [{name: domain-01, urls: ["ws://localhost:8000/ws"]}]
domainLinks: []
clientApps:
  - appName: ANZ
    appId: app-id-343
    masterUserId: ANZ-1
    authMode: none
    userDistributions: [{domainName: domain-01, from: 0}]
    pusher: {appId: "4242", key: anz-pusher-key, secret: anz-pusher-secret-0123456789, clientEvents: true}
"""


def test_a_new_app_gets_its_own_pusher_credentials():
    anz, kiwi = make_app(), make_app("KIWI", app_id="kiwi-app", master="KIWI-1")
    assert anz.pusher.key != kiwi.pusher.key and anz.pusher.pusher_app_id != kiwi.pusher.pusher_app_id
    assert len(anz.pusher.secret) >= 32 and anz.pusher.pusher_app_id.isdigit()
    assert anz.pusher.client_events is False


def test_a_web_node_finds_the_app_by_its_pusher_key_and_the_api_by_its_pusher_app_id():
    app = make_app()
    app_snapshots_clear()
    snapshot = app_snapshot_by_pusher_key(app.pusher.key)
    assert (snapshot.app_name, snapshot.pusher_secret) == ("ANZ", app.pusher.secret)
    assert app_snapshot_by_pusher_app_id(app.pusher.pusher_app_id).app_name == "ANZ"
    assert app_snapshot_by_pusher_key("nobody-has-this-key") is None


def test_the_config_file_sets_the_credentials_and_exports_the_secret_only_when_asked():
    config_import(text=FILE)
    creds = PusherCredentials.objects.get(app__app_name="ANZ")
    assert (creds.pusher_app_id, creds.key, creds.secret, creds.client_events) == (
        "4242", "anz-pusher-key", "anz-pusher-secret-0123456789", True)
    plain = yaml.safe_load(config_export())["clientApps"][0]["pusher"]
    assert plain == {"appId": "4242", "key": "anz-pusher-key", "clientEvents": True}
    full = yaml.safe_load(config_export(include_secrets=True))["clientApps"][0]["pusher"]
    assert full["secret"] == "anz-pusher-secret-0123456789"


def test_a_file_without_the_secret_keeps_the_apps_secret():
    config_import(text=FILE)
    config_import(text=FILE.replace(", secret: anz-pusher-secret-0123456789", ""))
    assert PusherCredentials.objects.get(app__app_name="ANZ").secret == "anz-pusher-secret-0123456789"


def test_a_pusher_key_another_app_has_is_refused():
    other = make_app("KIWI", app_id="kiwi-app", master="KIWI-1")
    with pytest.raises(ConfigError, match=f"key '{other.pusher.key}' already belongs to another app"):
        config_import(text=FILE.replace("anz-pusher-key", other.pusher.key))


def test_the_console_shows_the_secret_once_when_it_is_rotated(operator):
    app = make_app()
    old = app.pusher.secret
    page = operator.get(f"/admin/apps_registry/pushercredentials/{app.pusher.pk}/change/").content.decode()
    assert app.pusher.key in page and old not in page
    response = operator.post("/admin/apps_registry/pushercredentials/", {
        "action": "rotate_secret", "_selected_action": [app.pusher.pk]}, follow=True)
    new = PusherCredentials.objects.get(pk=app.pusher.pk).secret
    assert new != old and new in response.content.decode()
    assert new not in operator.get(f"/admin/apps_registry/pushercredentials/{app.pusher.pk}/change/").content.decode()
