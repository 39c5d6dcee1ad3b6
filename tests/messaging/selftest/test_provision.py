"""The platform's side of a selftest run: a throwaway app homed on this node's domain, or unused
throwaway users of a named app; ending the run removes exactly what it was given."""

from __future__ import annotations

from datetime import timedelta

import jwt
import pytest
from django.utils import timezone

from apps_registry.models import ApiKey, ClientApp, SelftestRun
from apps_registry.selectors import app_snapshot
from apps_registry.services import api_key_authenticate
from messaging.models import Mailbox, Message
from messaging.selftest.provision import SelftestRefused, selftest_begin, selftest_end
from tests.factories import make_app, make_domain

pytestmark = pytest.mark.django_db


def test_a_run_without_an_app_gets_a_throwaway_app_whose_users_live_on_this_domain(settings):
    make_domain(settings.DOMAIN_NAME)
    grant = selftest_begin()
    app = app_snapshot(grant.app_name)
    assert grant.app_created and grant.app_name.startswith("selftest_") and grant.domain == settings.DOMAIN_NAME
    for user_id, token in [*grant.users.items(), (grant.master, grant.master_token)]:
        assert app.home_domain(int(user_id.rpartition("-")[2])) == settings.DOMAIN_NAME
        assert jwt.decode(token, app.token_secret, algorithms=["HS256"])["sub"] == user_id
    assert grant.client_subscriptions and grant.channel_token and grant.api_key.startswith("sb_")

    assert selftest_end(name=grant.name) is True
    assert not ClientApp.objects.filter(app_name=grant.app_name).exists()
    assert not SelftestRun.objects.exists()


def test_the_key_a_run_is_given_stops_working_when_its_tokens_do_even_if_nobody_ends_the_run(settings):
    make_domain(settings.DOMAIN_NAME)
    grant = selftest_begin()
    key = api_key_authenticate(raw_key=grant.api_key)
    token_expiry = jwt.decode(grant.users[next(iter(grant.users))], app_snapshot(grant.app_name).token_secret,
                              algorithms=["HS256"])["exp"]
    assert key is not None and abs(key.expires_at.timestamp() - token_expiry) < 5
    ApiKey.objects.filter(pk=key.pk).update(expires_at=timezone.now() - timedelta(seconds=1))  # the run's hour is over
    assert api_key_authenticate(raw_key=grant.api_key) is None
    assert ApiKey.objects.get(pk=key.pk).state == "expired"


def test_a_run_on_a_named_app_uses_unused_users_and_leaves_the_app_as_it_was():
    anz = make_app(app_name="ANZ", range_to=999)
    Mailbox.objects.create(app=anz, user_id="ANZ-7")  # a user somebody uses
    keys_before = ApiKey.objects.count()
    grant = selftest_begin(app_name="ANZ")
    assert not grant.app_created and len(grant.users) == 3 and "ANZ-7" not in grant.users
    assert grant.master is None and "not homed" in grant.master_skipped
    [a, b, _] = grant.users
    Message.objects.create(app=anz, sender=a, content="throwaway", created_at=timezone.now())
    Mailbox.objects.create(app=anz, user_id=b)

    selftest_end(name=grant.name)
    assert ClientApp.objects.filter(app_name="ANZ").exists()
    assert ApiKey.objects.count() == keys_before
    assert list(Mailbox.objects.values_list("user_id", flat=True)) == ["ANZ-7"]
    assert not Message.objects.filter(sender=a).exists()


def test_an_app_without_a_master_has_its_presence_check_skipped_honestly():
    make_app(app_name="NOM", master="")
    grant = selftest_begin(app_name="NOM")
    assert grant.master is None and grant.master_skipped == "app has no master"


def test_an_auth_url_app_or_an_unknown_one_is_refused():
    make_app(app_name="AUU", auth_mode="auth_url", auth_url="https://auth.example/check", auth_enabled=True)
    with pytest.raises(SelftestRefused) as refused:
        selftest_begin(app_name="AUU")
    assert refused.value.code == "auth_url_app"
    with pytest.raises(SelftestRefused) as unknown:
        selftest_begin(app_name="NOPE")
    assert unknown.value.status == 404


def test_the_console_ends_a_run_its_client_left_behind(operator, settings):
    make_domain(settings.DOMAIN_NAME)
    grant = selftest_begin()
    run = SelftestRun.objects.get(name=grant.name)
    assert grant.name in operator.get("/admin/apps_registry/selftestrun/").content.decode()
    operator.post("/admin/apps_registry/selftestrun/", {"action": "end", "_selected_action": [run.pk]})
    assert not SelftestRun.objects.exists()
    assert not ClientApp.objects.filter(app_name=grant.app_name).exists()
