"""What a stranger can reach: metrics, the demo page, the admin login, proxy headers."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache

from foundation.daphne_adapter import _peer_trusted

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


def test_admin_logins_are_throttled_after_repeated_failures(client, settings):
    cache.clear()
    settings.ADMIN_LOGIN_MAX_FAILURES = 3
    User.objects.create_superuser("ops", password="the-right-password-1")
    for _ in range(3):
        response = client.post("/admin/login/", {"username": "ops", "password": "guess"})
        assert response.status_code == 200  # the form again, with its error
    refused = client.post("/admin/login/", {"username": "ops", "password": "the-right-password-1"})
    assert refused.status_code == 429 and b"Too many failed logins" in refused.content
    cache.clear()  # the window passed
    assert client.post("/admin/login/", {"username": "ops", "password": "the-right-password-1"}).status_code == 302


@pytest.mark.parametrize("peer, trusted, expected", [
    (["203.0.113.9", 5000], ["10.0.0.0/8"], False),
    (["10.1.2.3", 5000], ["10.0.0.0/8"], True),
    (["10.1.2.3", 5000], [], False),
    (None, ["10.0.0.0/8"], False),
])
def test_proxy_headers_are_believed_only_from_trusted_proxies(peer, trusted, expected):
    import ipaddress

    assert _peer_trusted(peer, [ipaddress.ip_network(n) for n in trusted]) is expected
