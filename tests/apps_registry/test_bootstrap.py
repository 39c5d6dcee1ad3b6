"""`manage.py bootstrap`: the admin login always, the open demo app only where the demo is enabled."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.contrib.auth.models import User
from django.core.management import call_command

from apps_registry.models import AuthMode, ClientApp, Domain

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


def _bootstrap() -> str:
    out = StringIO()
    call_command("bootstrap", stdout=out)
    return out.getvalue()


def test_where_the_demo_is_off_bootstrap_makes_the_admin_login_and_this_domain_but_no_demo_app(settings):
    settings.DEMO_ENABLED, settings.ADMIN_PASSWORD = False, "a-chosen-admin-password"
    User.objects.filter(username=settings.ADMIN_USERNAME).delete()  # a fresh database (a system test may have made one)
    said = _bootstrap()
    assert "demo app not created: DEMO_ENABLED is off" in said
    assert not ClientApp.objects.exists()
    assert User.objects.get(username=settings.ADMIN_USERNAME).check_password("a-chosen-admin-password")
    assert Domain.objects.filter(name=settings.DOMAIN_NAME).exists()


def test_where_the_demo_is_on_bootstrap_makes_the_open_demo_app_of_the_readme(settings):
    settings.DEMO_ENABLED = True
    assert "demo app ANZ (appId app-id-343, master ANZ-123223)" in _bootstrap()
    demo = ClientApp.objects.get(app_name="ANZ")
    assert demo.auth_mode == AuthMode.NONE and demo.distributions.count() == 1
    _bootstrap()  # twice is harmless
    assert ClientApp.objects.count() == 1


def test_docker_composes_migrate_service_runs_bootstrap_with_production_settings_and_the_demo_off():
    migrate = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["migrate"]
    assert "manage.py bootstrap" in " ".join(migrate["command"])
    assert migrate["environment"]["DJANGO_SETTINGS_MODULE"] == "config.settings.production"
    assert migrate["environment"]["DEMO_ENABLED"] == "false"
