"""Push open mode (apps_registry.models.ClientApp.push_open): the push seed's clients send no key and
name no app; an operator may mark one app whose public channels serve them unchanged. Off by
default, at most one app, never served in production, and refused there by `check --deploy`."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from django.db import IntegrityError, transaction

from apps_registry.checks import check_push_open_app
from apps_registry.config_io import ConfigError, config_export, config_import
from apps_registry.models import ClientApp
from apps_registry.selectors import app_snapshots_clear
from messaging.gateway.streams.identity import StreamRefused, stream_identity
from messaging.models import ChannelMessage
from tests.factories import make_app

pytestmark = pytest.mark.django_db
SEED_PUBLISH = {"channel": "qwerty", "message": "a message to channel 'qwerty'"}


@pytest.fixture
def open_app(anz):
    """ANZ marked push open, every channel but users' own public (what the seed's clients need)."""
    ClientApp.objects.filter(pk=anz.pk).update(push_open=True, public_channel_patterns=["*"])
    app_snapshots_clear()
    return anz


def _deploy_messages(check_id: str) -> list[str]:
    return [m.msg for m in run_checks(include_deployment_checks=True) if m.id == check_id]


# --- POST /messages ---------------------------------------------------------------------------------


def test_without_an_open_app_a_publish_without_a_key_is_refused(anonymous_http, anz):
    answer = anonymous_http.post("/messages", json=SEED_PUBLISH)
    assert answer.status_code == 401 and answer.json()["error"] == "unauthenticated"


def test_the_seeds_publish_without_a_key_goes_to_the_open_apps_channel(anonymous_http, open_app):
    answer = anonymous_http.post("/messages", json=SEED_PUBLISH)
    assert answer.status_code == 202 and answer.json() == {"subscribers": 0}
    stored = ChannelMessage.objects.get()
    assert (stored.channel.app_id, stored.channel.name, stored.content, stored.publisher) == (
        open_app.pk, "qwerty", "a message to channel 'qwerty'", "open")


def test_without_a_key_only_public_channels_that_are_not_a_users_own_take_publishes(anonymous_http, open_app):
    ClientApp.objects.filter(pk=open_app.pk).update(public_channel_patterns=["news.*", "@*"])
    app_snapshots_clear()
    private = anonymous_http.post("/messages", json={"channel": "secret", "message": "x"})
    assert private.status_code == 403 and private.json() == {
        "error": "forbidden", "detail": "channel 'secret' is not public: publish on it with an API key"}
    users_own = anonymous_http.post("/messages", json={"channel": "@ANZ-7", "message": "x"})
    assert users_own.status_code == 403 and "a user's own" in users_own.json()["detail"]
    assert anonymous_http.post("/messages", json={"channel": "news.f1", "message": "x"}).status_code == 202
    assert list(ChannelMessage.objects.values_list("channel__name", flat=True)) == ["news.f1"]


def test_a_key_still_decides_when_there_is_an_open_app(wsgi_app, open_app, bnz, bnz_key, anonymous_http):
    with_key = anonymous_http.post("/messages", json={"channel": "secret", "message": "x"},
                                   headers={"Authorization": f"Bearer {bnz_key}"})
    assert with_key.status_code == 202
    assert ChannelMessage.objects.get().channel.app_id == bnz.pk  # the key's app, any of its channels
    wrong = anonymous_http.post("/messages", json=SEED_PUBLISH, headers={"Authorization": "Bearer sb_no.such"})
    assert wrong.status_code == 401  # a wrong key is not served as the open app


def test_a_production_node_never_serves_the_open_mode(anonymous_http, open_app, settings):
    settings.PRODUCTION = True
    assert anonymous_http.post("/messages", json=SEED_PUBLISH).status_code == 401
    with pytest.raises(StreamRefused) as refused:
        stream_identity({"channels": "qwerty"})
    assert refused.value.status == 401


# --- the streams ------------------------------------------------------------------------------------


def test_a_stream_that_names_no_app_reads_the_open_apps_public_channels(open_app):
    identity = stream_identity({"channels": "xyz,qwerty"})
    assert (identity.app.pk, identity.channels, identity.user_id) == (open_app.pk, ("xyz", "qwerty"), None)
    ClientApp.objects.filter(pk=open_app.pk).update(public_channel_patterns=["news.*"])
    app_snapshots_clear()
    with pytest.raises(StreamRefused) as refused:
        stream_identity({"channels": "xyz"})
    assert (refused.value.status, refused.value.detail) == (403, "channel 'xyz' is neither public nor granted")


def test_a_stream_that_names_no_app_is_refused_without_an_open_app(anz):
    with pytest.raises(StreamRefused) as refused:
        stream_identity({"channels": "qwerty"})
    assert refused.value.status == 401


# --- one open app, and the checks -------------------------------------------------------------------


def test_a_new_app_is_not_open_and_at_most_one_app_may_be(anz, bnz):
    assert ClientApp.objects.filter(push_open=True).count() == 0
    ClientApp.objects.filter(pk=anz.pk).update(push_open=True)
    with pytest.raises(IntegrityError), transaction.atomic():
        ClientApp.objects.filter(pk=bnz.pk).update(push_open=True)
    bnz.push_open = True
    with pytest.raises(Exception, match="at most one app may"):
        bnz.full_clean()


def test_check_deploy_names_the_open_app_and_refuses_it_in_production(open_app, settings):
    assert _deploy_messages("switchboard.W033") == [
        "App ANZ has push open mode: the push service's endpoints serve requests without credentials as this "
        "app's: anyone may publish on its public channels with POST /messages without an API key, and read them "
        "on /sse/messages and /ws/messages without ?app= or a token. Fine for development and demos, never for a "
        "public node."]
    assert [m for m in run_checks() if m.id in ("switchboard.W033", "switchboard.E033")] == []  # only --deploy
    settings.PRODUCTION = True
    [error] = check_push_open_app(None)
    assert error.id == "switchboard.E033" and error.is_serious()  # --fail-level ERROR: the node does not start
    assert "App ANZ has push open mode" in error.msg and "Production never serves it" in error.msg


def test_check_deploy_is_quiet_without_an_open_app(anz, settings):
    assert _deploy_messages("switchboard.W033") == []
    settings.PRODUCTION = True
    assert check_push_open_app(None) == []


# --- configuration as code --------------------------------------------------------------------------

_FILE = """
domains: [{{name: domain-01, urls: ["ws://127.0.0.1:8001"]}}]
clientApps:
  - {{appName: ANZ, appId: app-id-343, masterUserId: ANZ-1, authMode: none{anz}}}
  - {{appName: BNZ, appId: app-id-bnz, masterUserId: BNZ-1, authMode: none{bnz}}}
"""


def test_push_open_mode_travels_in_the_configuration_file_and_moves_between_the_apps_it_names():
    summary = config_import(text=_FILE.format(anz=", pushOpen: true", bnz=""))
    assert summary.push_open_app == "ANZ"
    assert "pushOpen: true" in config_export()
    config_import(text=_FILE.format(anz="", bnz=", pushOpen: true"))  # moved: ANZ gives it up first
    assert list(ClientApp.objects.filter(push_open=True).values_list("app_name", flat=True)) == ["BNZ"]
    config_import(text=_FILE.format(anz="", bnz=""))
    assert not ClientApp.objects.filter(push_open=True).exists()  # an entry without it has it off


def test_a_configuration_file_gives_push_open_mode_to_one_app_at_most():
    with pytest.raises(ConfigError, match="pushOpen is true for ANZ and BNZ"):
        config_import(text=_FILE.format(anz=", pushOpen: true", bnz=", pushOpen: true"))
    with pytest.raises(ConfigError, match="pushOpen must be true or false"):
        config_import(text=_FILE.format(anz=", pushOpen: 'yes'", bnz=""))
    make_app(app_name="CNZ", app_id="app-id-cnz", master="CNZ-1", push_open=True)
    with pytest.raises(ConfigError, match="app CNZ has push open mode here and the file does not name it"):
        config_import(text=_FILE.format(anz=", pushOpen: true", bnz=""))
    assert list(ClientApp.objects.filter(push_open=True).values_list("app_name", flat=True)) == ["CNZ"]
