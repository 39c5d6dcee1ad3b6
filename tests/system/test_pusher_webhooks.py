"""Pusher-format webhooks end to end: a real web node, the webhook worker and a real receiver; the app's
endpoint names pusher.channel_occupied and pusher.channel_vacated, and a real pusher-js client that
subscribes to a channel and leaves it makes the receiver get both, in Pusher's format, signed with the
app's Pusher secret as the `pusher` server libraries' webhook check expects."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from apps_registry.selectors import app_snapshots_clear
from messaging.webhooks.services import webhook_endpoint_create
from tests.pusher import ANZ_KEY, ANZ_SECRET, PusherJs
from tests.webhook_receiver import WebhookReceiver
from tests.wsclient import wait_for

pytestmark = [pytest.mark.system, pytest.mark.django_db]
ENV = {"WEBHOOKS_ALLOW_HTTP": "true", "WEBHOOK_SWEEP_SECONDS": "1"}


@pytest.fixture(scope="module")
def receiver():
    with WebhookReceiver() as good:
        yield good


@pytest.fixture(scope="module")
def web(module_processes, demo_network, django_db_blocker, receiver):
    """ANZ's endpoint for the Pusher channel events (committed before the node starts, so its
    webhooks' cache knows it), a web node and the worker that makes webhook calls."""
    with django_db_blocker.unblock():
        webhook_endpoint_create(app_id=demo_network["anz"].pk, url=receiver.url,
                                events=["pusher.channel_occupied", "pusher.channel_vacated"])
        app_snapshots_clear()
    node = module_processes.web("web", **ENV)
    module_processes.webhook_worker("hooks", **ENV)
    return node


def pusher_events(receiver) -> list[tuple[dict, dict]]:
    """(the event, the call's headers) of each Pusher-format call received."""
    return [(event, call.headers) for call in list(receiver.calls) if "x-pusher-key" in call.headers
            for event in call.json["events"]]


def test_a_channel_a_pusher_js_client_fills_and_leaves_is_told_occupied_then_vacated_in_pushers_format(web, receiver):
    with PusherJs("127.0.0.1", web.port) as client:
        client.connected()
        assert client.subscribe("orders.hooked")["event"] == "subscribed"
        wait_for(lambda: any(e["name"] == "channel_occupied" for e, _ in pusher_events(receiver)), timeout=20)
        client.command(op="unsubscribe", channel="orders.hooked")
        wait_for(lambda: any(e["name"] == "channel_vacated" for e, _ in pusher_events(receiver)), timeout=20)

    events = [event for event, _ in pusher_events(receiver)]
    assert events == [{"name": "channel_occupied", "channel": "orders.hooked"},
                      {"name": "channel_vacated", "channel": "orders.hooked"}]
    for call in [c for c in receiver.calls if "x-pusher-key" in c.headers]:
        assert set(call.json) == {"time_ms", "events"} and isinstance(call.json["time_ms"], int)
        assert call.headers["x-pusher-key"] == ANZ_KEY
        expected = hmac.new(ANZ_SECRET.encode(), call.body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(call.headers["x-pusher-signature"], expected)
        assert not call.headers.get("switchboard-signature")  # Pusher's format only, not the native one
