"""Pusher's webhooks on Switchboard's: named, never implied by "*", and called in Pusher's format."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from messaging.webhooks.delivery import Claimed, call_prepared
from messaging.webhooks.models import WebhookDelivery
from messaging.webhooks.selectors import webhook_events_forget
from messaging.webhooks.services import WebhookNotice, webhook_endpoint_create, webhooks_record
from tests.factories import make_app

pytestmark = pytest.mark.django_db
OCCUPIED = WebhookNotice(app_id=0, event="pusher.channel_occupied", data={"channel": "c", "time_ms": 5})


def _record(app) -> int:
    webhook_events_forget()
    return webhooks_record(notices=[WebhookNotice(app_id=app.pk, event=OCCUPIED.event, data=OCCUPIED.data)])


def test_every_event_means_every_switchboard_event_not_pushers():
    app = make_app()
    webhook_endpoint_create(app_id=app.pk, url="https://hooks.example/all")
    assert _record(app) == 0


def test_an_endpoint_that_names_a_pusher_event_gets_it_beside_every_switchboard_event():
    app = make_app()
    endpoint, _ = webhook_endpoint_create(app_id=app.pk, url="https://hooks.example/p",
                                          events=["*", "pusher.channel_occupied"])
    assert endpoint.events == ["*", "pusher.channel_occupied"]
    assert _record(app) == 1
    assert WebhookDelivery.objects.get().event == "pusher.channel_occupied"


def test_a_pusher_call_is_pushers_body_signed_with_the_apps_pusher_secret():
    claimed = Claimed(app_id=1, url="https://hooks.example/p", secret="whsec", event="pusher.member_added",
                      payload={"id": "x", "created": 1, "data": {"channel": "presence-a", "user_id": "u", "time_ms": 7}},
                      attempts=0, pusher_key="key", pusher_secret="secret")
    body, headers = call_prepared(claimed, "x")
    assert json.loads(body) == {"time_ms": 7, "events": [{"name": "member_added", "channel": "presence-a",
                                                          "user_id": "u"}]}
    assert headers["X-Pusher-Key"] == "key"
    assert headers["X-Pusher-Signature"] == hmac.new(b"secret", body, hashlib.sha256).hexdigest()
