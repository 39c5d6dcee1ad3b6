"""The console for webhook endpoints and their deliveries."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from messaging.models import WebhookDelivery, WebhookEndpoint
from messaging.webhooks.selectors import webhook_events_forget
from messaging.webhooks.services import WebhookNotice, webhook_endpoint_create, webhooks_record
from tests.factories import make_app

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_cache():
    webhook_events_forget()
    yield
    webhook_events_forget()


@pytest.fixture
def anz():
    return make_app()


def test_a_new_endpoints_secret_is_shown_once_and_never_again(operator, anz):
    page = operator.post("/admin/messaging/webhookendpoint/add/", {
        "app": anz.pk, "url": "https://hooks.example.com/sb", "events": ["user.connected", "user.disconnected"],
        "enabled": "on", "description": "presence feed"}, follow=True)
    endpoint = WebhookEndpoint.objects.get()
    shown = re.search(r"id='new-webhook-secret'>([^<]+)<", page.content.decode())
    assert shown and shown.group(1) == endpoint.secret
    assert endpoint.events == ["user.connected", "user.disconnected"] and endpoint.description == "presence feed"
    change = operator.get(f"/admin/messaging/webhookendpoint/{endpoint.pk}/change/").content.decode()
    assert endpoint.secret not in change and "shown once" in change
    assert endpoint.secret not in operator.get("/admin/messaging/webhookendpoint/").content.decode()


def test_the_form_refuses_plain_http_where_the_platform_does_not_allow_it(operator, anz, settings):
    settings.WEBHOOKS_ALLOW_HTTP = False
    page = operator.post("/admin/messaging/webhookendpoint/add/", {
        "app": anz.pk, "url": "http://hooks.example.com/sb", "events": ["*"], "enabled": "on"})
    assert page.status_code == 200 and "must use https://" in page.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_an_operator_sends_a_test_event_to_an_endpoint(operator, anz):
    endpoint, _ = webhook_endpoint_create(app_id=anz.pk, url="https://hooks.example.com/sb",
                                          events=["channel.vacated"])
    operator.post("/admin/messaging/webhookendpoint/", {"action": "send_test_event",
                                                        "_selected_action": [endpoint.pk]})
    row = WebhookDelivery.objects.get()
    assert (row.endpoint_id, row.event, row.state) == (endpoint.pk, "webhook.test", "pending")


def test_deliveries_are_filtered_shown_with_their_payload_and_dead_ones_requeued(operator, anz,
                                                                                django_assert_max_num_queries):
    other = make_app(app_name="BNZ", app_id="app-id-bnz", master="BNZ-1")
    webhook_endpoint_create(app_id=anz.pk, url="https://anz.example.com/hooks")
    webhook_endpoint_create(app_id=other.pk, url="https://bnz.example.com/hooks")
    for i in range(20):
        webhooks_record(notices=[WebhookNotice(anz.pk, "user.connected", {"userId": f"ANZ-{i}"}),
                                 WebhookNotice(other.pk, "channel.occupied", {"channel": f"news.{i}"})])
    dead = list(WebhookDelivery.objects.filter(endpoint__app=anz).values_list("id", flat=True)[:3])
    WebhookDelivery.objects.filter(pk__in=dead).update(state="dead", attempts=8, dead_at=timezone.now(),
                                                       last_error="HTTP 503: down for maintenance")

    with django_assert_max_num_queries(12):  # constant, however many rows: related rows come with the page
        listing = operator.get("/admin/messaging/webhookdelivery/").content.decode()
    assert "anz.example.com" in listing and "bnz.example.com" in listing
    only_dead = operator.get("/admin/messaging/webhookdelivery/?state__exact=dead").content.decode()
    assert only_dead.count('name="_selected_action"') == 3 and "HTTP 503" in only_dead
    by_event = operator.get("/admin/messaging/webhookdelivery/?event__exact=channel.occupied").content.decode()
    assert by_event.count('name="_selected_action"') == 20 and "anz.example.com" not in by_event
    by_app = operator.get(f"/admin/messaging/webhookdelivery/?endpoint__app__id__exact={anz.pk}").content.decode()
    assert by_app.count('name="_selected_action"') == 20 and "bnz.example.com" not in by_app
    detail = operator.get(f"/admin/messaging/webhookdelivery/{dead[0]}/change/").content.decode()
    assert "user.connected" in detail and "ANZ-" in detail and "down for maintenance" in detail

    operator.post("/admin/messaging/webhookdelivery/", {"action": "requeue", "_selected_action": dead})
    assert set(WebhookDelivery.objects.filter(pk__in=dead).values_list("state", "attempts")) == {("pending", 0)}


def test_deleting_an_endpoint_says_how_many_delivery_records_go_with_it(operator, anz):
    endpoint, _ = webhook_endpoint_create(app_id=anz.pk, url="https://hooks.example.com/sb")
    for i in range(30):
        webhooks_record(notices=[WebhookNotice(anz.pk, "user.connected", {"userId": f"ANZ-{i}"})])
    confirm = operator.get(f"/admin/messaging/webhookendpoint/{endpoint.pk}/delete/").content.decode()
    assert "30" in confirm and confirm.count("user.connected") == 0  # counted, not listed
    operator.post(f"/admin/messaging/webhookendpoint/{endpoint.pk}/delete/", {"post": "yes"})
    assert not WebhookEndpoint.objects.exists() and not WebhookDelivery.objects.exists()
