from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps_registry.config_io import config_import
from apps_registry.models import ClientApp
from tests.apps_registry.test_routing import EXAMPLE
from tests.factories import make_app, make_domain

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_superuser("ops", password="pw-ops-12345"))
    return client


def test_anonymous_visitors_are_sent_to_the_login_page(client):
    response = client.get("/admin/apps_registry/clientapp/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_a_non_staff_user_cannot_reach_the_console(client):
    client.force_login(User.objects.create_user("eve", password="pw-eve-12345"))
    assert client.get("/admin/apps_registry/clientapp/").status_code == 302


def test_an_operator_creates_an_app_with_a_distribution(operator):
    domain = make_domain()
    response = operator.post("/admin/apps_registry/clientapp/add/", {
        "app_name": "KIWI", "app_id": "kiwi-app", "master_user_id": "KIWI-1", "confirmation_enabled": "on",
        "auth_mode": "none", "auth_timeout_ms": 3000, "max_content_bytes": 65536, "max_group_recipients": 100,
        "rate_limit_per_second": 50, "rate_limit_burst": 100, "retention_days": 30, "max_delivery_attempts": 10,
        "public_channel_patterns": "[]",
        "distributions-TOTAL_FORMS": 1, "distributions-INITIAL_FORMS": 0,
        "distributions-0-domain": domain.pk, "distributions-0-range_from": 0, "distributions-0-range_to": "",
        "api_keys-TOTAL_FORMS": 0, "api_keys-INITIAL_FORMS": 0,
    })
    assert response.status_code == 302, response.content.decode()[:2000]
    assert ClientApp.objects.get(app_name="KIWI").distributions.count() == 1


def test_overlapping_rows_in_the_admin_form_get_a_validation_message(operator):
    domain = make_domain()
    response = operator.post("/admin/apps_registry/clientapp/add/", {
        "app_name": "KIWI", "app_id": "kiwi-app", "master_user_id": "KIWI-1",
        "auth_mode": "none", "auth_timeout_ms": 3000, "max_content_bytes": 65536, "max_group_recipients": 100,
        "rate_limit_per_second": 50, "rate_limit_burst": 100, "retention_days": 30, "max_delivery_attempts": 10,
        "public_channel_patterns": "[]",
        "distributions-TOTAL_FORMS": 2, "distributions-INITIAL_FORMS": 0,
        "distributions-0-domain": domain.pk, "distributions-0-range_from": 0, "distributions-0-range_to": 100,
        "distributions-1-domain": domain.pk, "distributions-1-range_from": 50, "distributions-1-range_to": "",
        "api_keys-TOTAL_FORMS": 0, "api_keys-INITIAL_FORMS": 0,
    })
    assert response.status_code == 200
    assert "overlaps" in response.content.decode()
    assert not ClientApp.objects.filter(app_name="KIWI").exists()


def test_the_standalone_distribution_form_names_the_clash(operator):
    app = make_app(range_from=0, range_to=999)
    response = operator.post("/admin/apps_registry/userdistribution/add/", {
        "app": app.pk, "domain": make_domain("domain-02").pk, "range_from": 10, "range_to": 20})
    assert response.status_code == 200
    assert "overlap the distribution 0…999 on domain-01" in response.content.decode()


def test_auth_url_mode_without_a_url_is_explained(operator):
    response = operator.post("/admin/apps_registry/clientapp/add/", {
        "app_name": "KIWI", "app_id": "kiwi-app", "master_user_id": "KIWI-1", "auth_mode": "auth_url",
        "auth_timeout_ms": 3000, "max_content_bytes": 65536, "max_group_recipients": 100,
        "rate_limit_per_second": 50, "rate_limit_burst": 100, "retention_days": 30, "max_delivery_attempts": 10,
        "public_channel_patterns": "[]", "distributions-TOTAL_FORMS": 0, "distributions-INITIAL_FORMS": 0,
        "api_keys-TOTAL_FORMS": 0, "api_keys-INITIAL_FORMS": 0,
    })
    assert "needs an auth URL" in response.content.decode()


def test_the_domain_graph_page_draws_the_network_and_previews_a_route(operator):
    config_import(text=EXAMPLE.read_text())
    page = operator.get("/admin/apps_registry/domain/graph/?user_id=ANZ-6000001&from=domain-01").content.decode()
    assert page.count('class="domain"') == 4
    assert page.count("<line") == 4
    assert "domain-01 -&gt; domain-04" in page
    assert page.count('class="link on-route"') == 1
