from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from apps_registry.config_io import config_import
from apps_registry.models import ClientApp
from tests.apps_registry.test_routing import EXAMPLE
from tests.factories import make_app, make_domain

pytestmark = pytest.mark.django_db


def _app_form(**fields) -> dict:
    """The app form as a browser submits it: every field pre-filled with its default."""
    form = {
        "app_name": "KIWI", "app_id": "kiwi-app", "master_user_id": "KIWI-1", "confirmation_enabled": "on",
        "auth_mode": "none", "auth_timeout_ms": 3000, "token_secret": "", "max_content_bytes": 65536,
        "max_group_recipients": 100, "rate_limit_per_second": 50, "rate_limit_burst": 100,
        "deliveries_per_second": 200, "deliveries_burst": 400, "max_connections_per_user": 10,
        "api_rate_limit_per_second": 200, "api_rate_limit_burst": 400,
        "retention_days": 30, "max_delivery_attempts": 10, "allowed_origins": "[]",
        "max_token_lifetime_seconds": 86400, "public_channel_patterns": "[]",
        "distributions-TOTAL_FORMS": 0, "distributions-INITIAL_FORMS": 0,
        "api_keys-TOTAL_FORMS": 0, "api_keys-INITIAL_FORMS": 0,
        "request_endpoints-TOTAL_FORMS": 0, "request_endpoints-INITIAL_FORMS": 0,
    }
    form.update(fields)
    return form


def test_anonymous_visitors_are_sent_to_the_login_page(client):
    response = client.get("/admin/apps_registry/clientapp/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_a_non_staff_user_cannot_reach_the_console(client):
    client.force_login(User.objects.create_user("eve", password="pw-eve-12345"))
    assert client.get("/admin/apps_registry/clientapp/").status_code == 302


def test_an_operator_creates_an_app_with_a_distribution(operator):
    domain = make_domain()
    response = operator.post("/admin/apps_registry/clientapp/add/", _app_form(**{
        "distributions-TOTAL_FORMS": 1,
        "distributions-0-domain": domain.pk, "distributions-0-range_from": 0, "distributions-0-range_to": "",
    }))
    assert response.status_code == 302, response.content.decode()[:2000]
    assert ClientApp.objects.get(app_name="KIWI").distributions.count() == 1


def test_overlapping_rows_in_the_admin_form_get_a_validation_message(operator):
    domain = make_domain()
    response = operator.post("/admin/apps_registry/clientapp/add/", _app_form(**{
        "distributions-TOTAL_FORMS": 2,
        "distributions-0-domain": domain.pk, "distributions-0-range_from": 0, "distributions-0-range_to": 100,
        "distributions-1-domain": domain.pk, "distributions-1-range_from": 50, "distributions-1-range_to": "",
    }))
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
    response = operator.post("/admin/apps_registry/clientapp/add/", _app_form(auth_mode="auth_url"))
    assert "needs an auth URL" in response.content.decode()


def test_saving_an_open_app_warns_what_auth_mode_none_means(operator):
    make_domain()
    page = operator.post("/admin/apps_registry/clientapp/add/", _app_form(auth_mode="none"), follow=True)
    assert "KIWI has auth mode &#x27;none&#x27;: anyone who knows the appId can log in as any user of this app, " \
           "including its master user." in page.content.decode()


def test_a_new_app_in_the_console_offers_signed_tokens_and_keeps_a_generated_secret_when_left_blank(operator):
    add_page = operator.get("/admin/apps_registry/clientapp/add/").content.decode()
    assert '<option value="signed_token" selected>' in add_page
    assert "anyone who knows the appId can log in" in add_page  # the help text of auth mode
    page = operator.post("/admin/apps_registry/clientapp/add/", _app_form(auth_mode="signed_token"), follow=True)
    assert "has auth mode" not in page.content.decode()  # no open-app warning
    kiwi = ClientApp.objects.get(app_name="KIWI")
    assert kiwi.auth_mode == "signed_token" and len(kiwi.token_secret) >= 32


def test_auth_url_mode_with_the_url_switched_off_is_refused_in_the_console(operator):
    response = operator.post("/admin/apps_registry/clientapp/add/",
                             _app_form(auth_mode="auth_url", auth_url="https://auth.example.com/check"))
    assert response.status_code == 200
    assert "while it is off, every login is refused" in response.content.decode()
    assert not ClientApp.objects.filter(app_name="KIWI").exists()


def test_an_apps_token_secret_is_write_only_in_the_console(operator):
    app = make_app(auth_mode="signed_token", token_secret="s3cret-never-shown")
    page = operator.get(f"/admin/apps_registry/clientapp/{app.pk}/change/").content.decode()
    assert "s3cret-never-shown" not in page
    # Saving the form with the secret left blank keeps it; typing one replaces it.
    form = _app_form(app_name="ANZ", app_id="app-id-343", master_user_id="ANZ-123223", auth_mode="signed_token",
                     max_connections_per_user=3)
    assert operator.post(f"/admin/apps_registry/clientapp/{app.pk}/change/", form).status_code == 302
    app.refresh_from_db()
    assert (app.token_secret, app.max_connections_per_user) == ("s3cret-never-shown", 3)
    operator.post(f"/admin/apps_registry/clientapp/{app.pk}/change/", {**form, "token_secret": "rotated"})
    app.refresh_from_db()
    assert app.token_secret == "rotated"


def test_the_domain_graph_page_draws_the_network_and_previews_a_route(operator):
    config_import(text=EXAMPLE.read_text())
    page = operator.get("/admin/apps_registry/domain/graph/?user_id=ANZ-6000001&from=domain-01").content.decode()
    assert page.count('class="domain"') == 4
    assert page.count("<line") == 4
    assert "domain-01 -&gt; domain-04" in page
    assert page.count('class="link on-route"') == 1


def test_a_domains_number_is_listed_and_given_once_in_the_admin(operator):
    domain = make_domain("domain-02")
    page = operator.get(f"/admin/apps_registry/domain/{domain.pk}/change/").content.decode()
    assert 'name="number"' in page  # not given yet: the operator may give it
    response = operator.post(f"/admin/apps_registry/domain/{domain.pk}/change/",
                             {"name": "domain-02", "urls": "[]", "number": 2})
    assert response.status_code == 302, response.content.decode()[:2000]
    domain.refresh_from_db()
    assert domain.number == 2
    page = operator.get(f"/admin/apps_registry/domain/{domain.pk}/change/").content.decode()
    assert 'name="number"' not in page  # given: shown, never changed
    assert ">2<" in operator.get("/admin/apps_registry/domain/").content.decode()
