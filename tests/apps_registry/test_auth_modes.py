"""No open tenant by accident: what a new app requires, what is refused, what `check --deploy` names."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ValidationError

from apps_registry.models import AuthMode, ClientApp
from tests.factories import make_app

pytestmark = pytest.mark.django_db


def _deploy_warnings(check_id: str) -> list[str]:
    return [m.msg for m in run_checks(include_deployment_checks=True) if m.id == check_id]


def test_a_new_app_requires_signed_tokens_with_a_secret_of_its_own():
    kiwi = ClientApp.objects.create(app_name="KIWI", app_id="kiwi-app", master_user_id="KIWI-1")
    moa = ClientApp.objects.create(app_name="MOA", app_id="moa-app", master_user_id="MOA-1")
    assert (kiwi.auth_mode, moa.auth_mode) == (AuthMode.SIGNED_TOKEN, AuthMode.SIGNED_TOKEN)
    assert len(kiwi.token_secret) >= 32 and kiwi.token_secret != moa.token_secret


def test_auth_url_mode_with_the_url_switched_off_does_not_validate():
    app = ClientApp(app_name="KIWI", app_id="kiwi-app", master_user_id="KIWI-1", auth_mode=AuthMode.AUTH_URL,
                    auth_url="https://auth.example.com/check", auth_enabled=False)
    with pytest.raises(ValidationError, match="every login is refused"):
        app.full_clean()
    app.auth_enabled = True
    app.full_clean()


def test_check_deploy_names_every_app_anyone_may_log_in_to():
    make_app()  # auth mode none
    make_app(app_name="BNZ", app_id="app-id-bnz", master="BNZ-1", auth_mode=AuthMode.NONE)
    make_app(app_name="SAFE", app_id="app-id-safe", master="SAFE-1", auth_mode=AuthMode.SIGNED_TOKEN)
    assert _deploy_warnings("switchboard.W010") == [
        "App ANZ has auth mode 'none': anyone who knows the appId can log in as any user of this app, "
        "including its master user.",
        "App BNZ has auth mode 'none': anyone who knows the appId can log in as any user of this app, "
        "including its master user.",
    ]
    assert [m for m in run_checks() if m.id == "switchboard.W010"] == []  # only under --deploy


def test_check_deploy_names_an_auth_url_app_whose_url_is_switched_off():
    make_app(auth_mode=AuthMode.AUTH_URL, auth_url="https://auth.example.com/check", auth_enabled=False)
    assert _deploy_warnings("switchboard.W011") == [
        "App ANZ uses an external auth URL that is switched off: every login to it is refused."]
    assert _deploy_warnings("switchboard.W010") == []
