"""Webhooks end to end: a real web node, worker and beat call a real local receiver, signed, for
users coming and going, a message dying and a channel filling and emptying; a receiver that keeps
failing is retried with backoff until the call is dead."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from apps_registry.models import ClientApp, Domain, UserDistribution
from apps_registry.selectors import app_snapshots_clear
from messaging.models import WebhookDelivery
from messaging.webhooks.services import webhook_endpoint_create
from tests.processes import FAST_FAILURE_ENV, start_beat
from tests.webhook_receiver import WebhookReceiver, event_for
from tests.wsclient import WsClient, wait_for

pytestmark = pytest.mark.system

WEBHOOK_ENV = {
    "WEBHOOKS_ALLOW_HTTP": "true",  # the receivers are plain-HTTP servers on 127.0.0.1
    "WEBHOOK_SWEEP_SECONDS": "1",
    "WEBHOOK_RETRY_BASE_SECONDS": "0.5",
    "WEBHOOK_RETRY_MAX_SECONDS": "1",
    "WEBHOOK_MAX_ATTEMPTS": "3",
    "WEBHOOK_TIMEOUT_SECONDS": "3",
    # A message never ACKed dies (one attempt, app WHK) this long after its push: the shortest there is.
    "DELIVERY_ACK_TIMEOUT": "1",
}


@pytest.fixture(scope="module")
def receivers():
    with WebhookReceiver() as good, WebhookReceiver(status=500) as failing:
        yield SimpleNamespace(good=good, failing=failing)


@pytest.fixture(scope="module")
def hooked(demo_network, django_db_blocker, receivers):
    """Two apps of this module's own, committed (the demo network's teardown removes them):
    WHK lets clients subscribe to its public `news.*` channels, gives a delivery one attempt, and
    has an endpoint for every event at the good receiver; WHF has an endpoint for user.connected
    at a receiver that always answers 500."""
    with django_db_blocker.unblock():
        here = Domain.objects.get(name="domain-01")
        whk = ClientApp.objects.create(app_name="WHK", app_id="app-id-whk", master_user_id="WHK-1", auth_mode="none",
                                       client_subscriptions_allowed=True, public_channel_patterns=["news.*"],
                                       max_delivery_attempts=1)
        UserDistribution.objects.create(app=whk, domain=here, range_from=0, range_to=None)
        whf = ClientApp.objects.create(app_name="WHF", app_id="app-id-whf", master_user_id="WHF-1", auth_mode="none")
        UserDistribution.objects.create(app=whf, domain=here, range_from=0, range_to=None)
        _, secret = webhook_endpoint_create(app_id=whk.pk, url=receivers.good.url)
        _, failing_secret = webhook_endpoint_create(app_id=whf.pk, url=receivers.failing.url,
                                                    events=["user.connected"])
        app_snapshots_clear()
    return SimpleNamespace(secret=secret, failing_secret=failing_secret)


@pytest.fixture(scope="module")
def cluster(module_processes, hooked, tmp_path_factory):
    env = {**FAST_FAILURE_ENV, **WEBHOOK_ENV}
    web = module_processes.web("web", **env)
    module_processes.worker("worker", **env)
    module_processes.webhook_worker("hooks", **env)
    start_beat(module_processes, tmp_path_factory.mktemp("beat"), **env)
    return web


def _auth(ws: WsClient, user_id: str, **extra) -> None:
    app_id = "app-id-whk" if user_id.startswith("WHK-") else "app-id-whf"
    assert ws.auth(user_id, app_id=app_id, **extra)["data"]["isAuthenticated"] is True


@pytest.mark.django_db
def test_a_user_coming_online_and_going_offline_is_told_to_the_apps_endpoint_signed(cluster, hooked, receivers):
    with WsClient(cluster.ws_url) as first, WsClient(cluster.ws_url) as second:
        _auth(first, "WHK-1001")
        [connected] = receivers.good.wait_for(event_for("user.connected", userId="WHK-1001"))
        _auth(second, "WHK-1001")  # not the first connection: nothing new to tell
        first.close()
        time.sleep(1.5)
        assert receivers.good.matching(event_for("user.disconnected", userId="WHK-1001")) == []
    [disconnected] = receivers.good.wait_for(event_for("user.disconnected", userId="WHK-1001"))

    assert len(receivers.good.matching(event_for("user.connected", userId="WHK-1001"))) == 1
    for call, event in ((connected, "user.connected"), (disconnected, "user.disconnected")):
        assert call.signed_with(hooked.secret)
        assert call.headers["switchboard-event"] == event and call.headers["content-type"] == "application/json"
        assert call.headers["switchboard-delivery"] == call.json["id"]
        assert call.json["app"] == "app-id-whk" and call.json["event"] == event
        assert call.json["data"] == {"userId": "WHK-1001", "domain": "domain-01"}
    assert connected.json["created"] <= disconnected.json["created"]
    ids = [connected.json["id"], disconnected.json["id"]]
    wait_for(lambda: set(WebhookDelivery.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"delivered"})


@pytest.mark.django_db
def test_a_message_that_dies_is_told_to_the_apps_endpoint(cluster, hooked, receivers):
    with WsClient(cluster.ws_url) as sender, WsClient(cluster.ws_url) as sink:
        _auth(sink, "WHK-2002", acks=True)  # takes the message and never acknowledges it
        _auth(sender, "WHK-2001", acks=True)
        sender.message("WHK-2002", "never acknowledged", clientMessageId="c-dies")
        accepted = sender.recv_type("MESSAGE_ACCEPTED")
        assert sink.recv_type("MESSAGE")["data"]["content"] == "never acknowledged"
        [call] = receivers.good.wait_for(event_for("message.dead_lettered", recipient="WHK-2002"), timeout=30)
    assert call.signed_with(hooked.secret)
    data = call.json["data"]
    assert data["messageId"] == accepted["data"]["id"] and data["attempts"] == 1
    assert data["lastError"].startswith("not confirmed within")


@pytest.mark.django_db
def test_a_channels_first_subscriber_and_the_last_leaving_are_told_to_the_apps_endpoint(cluster, hooked, receivers):
    occupied, vacated = event_for("channel.occupied", channel="news.sport"), \
        event_for("channel.vacated", channel="news.sport")
    with WsClient(cluster.ws_url) as alice, WsClient(cluster.ws_url) as bob:
        _auth(alice, "WHK-3001")
        _auth(bob, "WHK-3002")
        alice.send("SUBSCRIBE", {"channel": "news.sport"})
        alice.recv_type("SUBSCRIBED")
        [first] = receivers.good.wait_for(occupied)
        bob.send("SUBSCRIBE", {"channel": "news.sport"})
        bob.recv_type("SUBSCRIBED")
        alice.send("UNSUBSCRIBE", {"channel": "news.sport"})
        alice.recv_type("UNSUBSCRIBED")
        time.sleep(1.5)
        assert receivers.good.matching(vacated) == []  # bob still reads it
        bob.send("UNSUBSCRIBE", {"channel": "news.sport"})
        bob.recv_type("UNSUBSCRIBED")
        [last] = receivers.good.wait_for(vacated)
    assert len(receivers.good.matching(occupied)) == 1
    assert first.signed_with(hooked.secret) and last.signed_with(hooked.secret)
    assert first.json["app"] == last.json["app"] == "app-id-whk"


@pytest.mark.django_db
def test_an_endpoint_that_keeps_failing_is_retried_with_backoff_until_the_call_is_dead(cluster, hooked, receivers):
    with WsClient(cluster.ws_url) as ws:
        _auth(ws, "WHF-4001")
        calls = receivers.failing.wait_for(event_for("user.connected", userId="WHF-4001"), count=3, timeout=30)
    delivery_id = calls[0].json["id"]
    assert {c.headers["switchboard-delivery"] for c in calls} == {delivery_id}
    assert len({c.body for c in calls}) == 1 and all(c.signed_with(hooked.failing_secret) for c in calls)
    assert calls[1].at - calls[0].at >= 0.25  # backed off (0.5 s base with jitter, then the sweep)
    wait_for(lambda: WebhookDelivery.objects.filter(pk=delivery_id, state="dead").exists(), timeout=15)
    row = WebhookDelivery.objects.get(pk=delivery_id)
    assert (row.attempts, row.last_status) == (3, 500) and row.last_error.startswith("HTTP 500")
    time.sleep(2.5)  # dead means no further calls
    assert len(receivers.failing.matching(event_for("user.connected", userId="WHF-4001"))) == 3
