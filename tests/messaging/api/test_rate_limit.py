"""Each app's API rate limit: a token bucket in Redis shared by every web node."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps_registry.selectors import app_snapshots_clear
from messaging.intake.throttling import KEY, rate_limit_take

pytestmark = pytest.mark.django_db


@pytest.fixture
def tight(anz):
    anz.api_rate_limit_per_second = 0.5
    anz.api_rate_limit_burst = 2
    anz.save()
    app_snapshots_clear()
    return anz


def test_beyond_its_burst_an_app_is_answered_429_with_retry_after(http, tight):
    assert [http.get("/api/v1/users/ANZ-1/presence").status_code for _ in range(2)] == [200, 200]
    limited = http.get("/api/v1/users/ANZ-1/presence")
    assert limited.status_code == 429
    assert limited.json()["error"] == "rate_limited" and limited.json()["detail"]
    assert limited.headers["Retry-After"].isdigit() and 1 <= int(limited.headers["Retry-After"]) <= 2


def test_one_app_hitting_its_limit_leaves_another_alone(http, bnz_api, tight):
    while http.get("/api/v1/users/ANZ-1/presence").status_code != 429:
        pass
    assert bnz_api.presence("BNZ-1")["online"] is False


def test_the_bucket_lives_in_redis_so_every_node_draws_on_it(redis_client):
    assert rate_limit_take(app_pk=987654, rate=1.0, burst=1) == 0.0
    wait = rate_limit_take(app_pk=987654, rate=1.0, burst=1)  # another process would see the same bucket
    assert 0 < wait <= 1.0
    assert redis_client.pttl(KEY.format(app_pk=987654)) > 0  # it expires once full again
    redis_client.delete(KEY.format(app_pk=987654))


def test_the_api_limits_are_edited_in_the_apps_limits_fieldset(client, anz):
    client.force_login(User.objects.create_superuser("ops", password="pw-ops-12345"))
    page = client.get(f"/admin/apps_registry/clientapp/{anz.pk}/change/").content.decode()
    limits = page.split("Limits", 1)[1].split("Security", 1)[0]
    assert "api_rate_limit_per_second" in limits and "api_rate_limit_burst" in limits
