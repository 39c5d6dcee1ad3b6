"""The console never renders a secret back: link secrets, app token secrets, webhook signing secrets
and API keys are nowhere in the page source of any list or change page."""

from __future__ import annotations

import pytest

from apps_registry.models import ApiKey, Domain, DomainLink
from apps_registry.services import api_key_create
from messaging.webhooks.services import webhook_endpoint_create
from tests.factories import make_app

pytestmark = pytest.mark.django_db


@pytest.fixture
def secrets_held():
    app = make_app(auth_mode="signed_token", token_secret="app-token-secret-0123456789")
    link = DomainLink.objects.create(n1=Domain.objects.get(name="domain-01"),
                                     n2=Domain.objects.create(name="domain-02"))
    endpoint, webhook_secret = webhook_endpoint_create(app_id=app.pk, url="https://anz.example.com/hooks")
    key, raw_key = api_key_create(app=app, name="crm")
    pages = [
        "/admin/apps_registry/clientapp/", f"/admin/apps_registry/clientapp/{app.pk}/change/",
        "/admin/apps_registry/domainlink/", f"/admin/apps_registry/domainlink/{link.pk}/change/",
        "/admin/messaging/webhookendpoint/", f"/admin/messaging/webhookendpoint/{endpoint.pk}/change/",
        "/admin/apps_registry/apikey/", f"/admin/apps_registry/apikey/{key.pk}/change/",
    ]
    return pages, [app.token_secret, link.shared_secret, webhook_secret, raw_key, ApiKey.objects.get().key_hash]


def test_no_page_of_the_console_holds_a_secret(operator, secrets_held):
    pages, secrets = secrets_held
    for page in pages:
        html = operator.get(page)
        assert html.status_code == 200, page
        for secret in secrets:
            assert secret not in html.content.decode(), f"{page} renders a secret"


def test_a_link_secret_can_be_replaced_and_a_blank_field_keeps_it(operator):
    here, there = Domain.objects.create(name="domain-01"), Domain.objects.create(name="domain-02")
    form = {"n1": here.pk, "n2": there.pk, "weight": 1, "enabled": "on", "shared_secret": ""}
    assert operator.post("/admin/apps_registry/domainlink/add/", form).status_code == 302
    link = DomainLink.objects.get()
    generated = link.shared_secret
    assert len(generated) >= 32  # a new link gets a random secret
    operator.post(f"/admin/apps_registry/domainlink/{link.pk}/change/", {**form, "weight": 2})
    link.refresh_from_db()
    assert (link.weight, link.shared_secret) == (2, generated)
    operator.post(f"/admin/apps_registry/domainlink/{link.pk}/change/", {**form, "shared_secret": "a-new-one-42"})
    link.refresh_from_db()
    assert link.shared_secret == "a-new-one-42"
