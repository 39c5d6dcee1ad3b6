"""What a stranger can reach: metrics and the demo page (admin logins: tests/config/test_admin_login.py; proxy
    headers: test_forwarded.py)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


@pytest.fixture
def production_like(settings):
    settings.DEBUG = False
    settings.METRICS_TOKEN = "scrape-token-123"
    settings.METRICS_ALLOWED_IPS = []
    settings.DEMO_ENABLED = False
    return settings


def test_metrics_answer_only_a_scraper_with_the_token_or_from_an_allowed_address(client, production_like):
    assert client.get("/metrics").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    scraped = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token-123")
    assert scraped.status_code == 200 and b"switchboard_dead_letters" in scraped.content
    production_like.METRICS_ALLOWED_IPS = ["127.0.0.0/8"]
    assert client.get("/metrics").status_code == 200


def test_the_demo_page_is_off_unless_enabled(client, production_like):
    assert client.get("/demo/").status_code == 404
    production_like.DEMO_ENABLED = True
    assert client.get("/demo/").status_code == 200


def test_production_settings_disable_the_demo_and_the_open_metrics_allow_list(monkeypatch):
    import importlib

    monkeypatch.setenv("DATABASE_URL", "postgresql://u:p@db.example:5432/switchboard")
    monkeypatch.setenv("REDIS_URL", "redis://redis.example:6379/0")
    production = importlib.import_module("config.settings.production")
    production = importlib.reload(production)
    assert production.DEMO_ENABLED is False and production.METRICS_ALLOWED_IPS == []
