"""Admin logins are throttled per username and address, with a wait that doubles: an attacker
slows only themselves, and never locks the real admin out."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache

from config import admin_login

pytestmark = pytest.mark.django_db

PASSWORD = "the-right-password-1"
ATTACKER = "198.51.100.66"
ADMIN_DESK = "192.0.2.10"


@pytest.fixture
def ops(settings):
    cache.clear()
    settings.ADMIN_LOGIN_FREE_FAILURES = 2
    settings.ADMIN_LOGIN_FREE_FAILURES_PER_ADDRESS = 20
    settings.ADMIN_LOGIN_BACKOFF_SECONDS = 60
    settings.ADMIN_LOGIN_BACKOFF_MAX_SECONDS = 200
    return User.objects.create_superuser("ops", password=PASSWORD)


@pytest.fixture
def clock(monkeypatch):
    """The throttle's clock, moved on by hand: waits pass without the test sleeping."""
    class Clock:
        now = 1_000_000.0

        def advance(self, seconds: float) -> None:
            self.now += seconds

    clock = Clock()
    monkeypatch.setattr(admin_login, "_now", lambda: clock.now)
    return clock


def log_in(client, password: str, address: str, username: str = "ops"):
    return client.post("/admin/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


def test_an_attacker_failing_for_admin_does_not_stop_the_real_admin_logging_in_from_elsewhere(client, ops, clock):
    for _ in range(10):
        log_in(client, "guess", ATTACKER)
    assert log_in(client, "guess", ATTACKER).status_code == 429
    assert log_in(client, PASSWORD, ADMIN_DESK).status_code == 302


def test_after_the_free_failures_each_failure_doubles_the_wait_up_to_the_cap(client, ops, clock):
    for _ in range(2):
        assert log_in(client, "guess", ATTACKER).status_code == 200  # the form again, with its error
    waits = []
    for _ in range(4):
        assert log_in(client, "guess", ATTACKER).status_code == 200
        refused = log_in(client, "guess", ATTACKER)
        assert refused.status_code == 429 and b"Too many failed logins" in refused.content
        waits.append(int(refused["Retry-After"]))
        clock.advance(waits[-1])
    assert waits == [60, 120, 200, 200]


def test_during_the_wait_even_the_right_password_is_refused_and_after_it_logs_in(client, ops, clock):
    for _ in range(3):
        log_in(client, "guess", ADMIN_DESK)
    assert log_in(client, PASSWORD, ADMIN_DESK).status_code == 429
    clock.advance(61)
    assert log_in(client, PASSWORD, ADMIN_DESK).status_code == 302


def test_one_address_trying_many_usernames_is_slowed_too(client, ops, clock, settings):
    settings.ADMIN_LOGIN_FREE_FAILURES_PER_ADDRESS = 5
    for i in range(6):
        assert log_in(client, "guess", ATTACKER, username=f"user{i}").status_code == 200
    assert log_in(client, "guess", ATTACKER, username="someone-else").status_code == 429
    assert log_in(client, PASSWORD, ADMIN_DESK).status_code == 302
