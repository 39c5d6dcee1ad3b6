"""What /metrics tells about webhooks."""

from __future__ import annotations

import pytest
from django.utils import timezone

from messaging.models import WebhookDelivery
from messaging.webhooks.selectors import webhook_events_forget
from messaging.webhooks.services import WebhookNotice, webhook_endpoint_create, webhooks_record
from tests.factories import make_app

pytestmark = pytest.mark.django_db


def test_metrics_show_the_webhook_backlog_and_what_this_process_recorded(client):
    webhook_events_forget()
    app = make_app()
    webhook_endpoint_create(app_id=app.pk, url="https://hooks.example.com/sb")
    webhooks_record(notices=[WebhookNotice(app.pk, "channel.occupied", {"channel": f"c{i}"}) for i in range(3)])
    WebhookDelivery.objects.filter(pk=WebhookDelivery.objects.first().pk).update(state="dead", dead_at=timezone.now())

    text = client.get("/metrics", REMOTE_ADDR="127.0.0.1").content.decode()

    assert 'switchboard_webhook_deliveries{state="pending"} 2.0' in text
    assert 'switchboard_webhook_deliveries{state="dead"} 1.0' in text
    assert 'switchboard_webhooks_total{event="channel.occupied",outcome="recorded"}' in text
    webhook_events_forget()
