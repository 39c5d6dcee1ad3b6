"""The Pusher HTTP API: signed queries checked, events stored on the Switchboard channels, channels
and presence members told (the official library drives it in tests/system/test_pusher_node.py)."""

from __future__ import annotations

import json
import time

import pytest

from apps_registry.pusher_credentials import PusherCredentials
from apps_registry.selectors import app_snapshots_clear
from messaging.channels.services import channel_history
from tests.factories import make_app
from tests.pusher import signed_query

pytestmark = pytest.mark.django_db
KEY, SECRET, APP_ID = "k-anz", "s-anz-secret", "4242"


@pytest.fixture
def app():
    anz = make_app()
    PusherCredentials.objects.filter(app=anz).update(key=KEY, secret=SECRET, pusher_app_id=APP_ID)
    app_snapshots_clear()
    return anz


def post(client, path: str, body: dict, **sign):
    raw = json.dumps(body).encode()
    query = signed_query("POST", path, body=raw, key=sign.pop("key", KEY), secret=sign.pop("secret", SECRET), **sign)
    return client.post(f"{path}?{query}", data=raw, content_type="application/json")


def get(client, path: str, params: dict | None = None):
    return client.get(f"{path}?{signed_query('GET', path, params, key=KEY, secret=SECRET)}")


def history(app, channel: str) -> list[dict]:
    return [json.loads(i.content) for i in channel_history(app_id=app.pk, channel=channel, after=0)]


def test_an_event_is_stored_on_each_channel_it_names(client, app):
    response = post(client, f"/apps/{APP_ID}/events",
                    {"name": "OrderShipped", "data": '{"id":1}', "channels": ["orders", "private-orders.1"]})
    assert response.status_code == 200 and response.json() == {}
    assert history(app, "pusher.orders") == [{"event": "OrderShipped", "data": '{"id":1}'}]
    assert history(app, "pusher.private-orders.1") == [{"event": "OrderShipped", "data": '{"id":1}'}]


def test_an_excluded_socket_is_kept_with_the_event(client, app):
    post(client, f"/apps/{APP_ID}/events", {"name": "e", "data": "d", "channel": "c", "socket_id": "12.34"})
    assert history(app, "pusher.c") == [{"event": "e", "data": "d", "socket_id": "12.34"}]


def test_a_batch_is_stored_in_order(client, app):
    batch = [{"channel": "c", "name": f"e{i}", "data": str(i)} for i in range(3)]
    assert post(client, f"/apps/{APP_ID}/batch_events", {"batch": batch}).status_code == 200
    assert [e["event"] for e in history(app, "pusher.c")] == ["e0", "e1", "e2"]


@pytest.mark.parametrize(("sign", "status", "reason"), [
    ({"secret": "wrong"}, 401, "Invalid signature"),
    ({"key": "other"}, 401, "Invalid auth_key"),
    ({"timestamp": time.time() - 601}, 401, "Timestamp expired"),
])
def test_a_request_not_signed_by_the_app_or_stale_is_refused(client, app, sign, status, reason):
    response = post(client, f"/apps/{APP_ID}/events", {"name": "e", "data": "d", "channel": "c"}, **sign)
    assert response.status_code == status and reason in response.content.decode()
    assert history(app, "pusher.c") == []


def test_a_body_that_is_not_the_one_signed_is_refused(client, app):
    path = f"/apps/{APP_ID}/events"
    query = signed_query("POST", path, body=b'{"name":"e","data":"d","channel":"c"}', key=KEY, secret=SECRET)
    response = client.post(f"{path}?{query}", data=b'{"name":"e","data":"evil","channel":"c"}',
                           content_type="application/json")
    assert response.status_code == 401 and "body_md5" in response.content.decode()


def test_an_unknown_app_id_is_404(client, app):
    assert post(client, "/apps/999/events", {"name": "e", "data": "d", "channel": "c"}).status_code == 404


@pytest.mark.parametrize(("body", "status"), [
    ({"name": "e", "data": "x" * 10241, "channel": "c"}, 413),
    ({"name": "e", "data": {"not": "a string"}, "channel": "c"}, 400),
    ({"name": "e", "data": "d", "channels": [f"c{i}" for i in range(101)]}, 400),
    ({"name": "e", "data": "d", "channel": "bad name"}, 400),
    ({"data": "d", "channel": "c"}, 400),
])
def test_bad_events_are_refused_as_the_api_documents(client, app, body, status):
    assert post(client, f"/apps/{APP_ID}/events", body).status_code == status


def test_an_unoccupied_channel_and_the_empty_channel_list(client, app):
    assert get(client, f"/apps/{APP_ID}/channels/orders", {"info": "subscription_count"}).json() == {
        "occupied": False, "subscription_count": 0}
    assert get(client, f"/apps/{APP_ID}/channels").json() == {"channels": {}}
    assert get(client, f"/apps/{APP_ID}/channels/presence-room/users").json() == {"users": []}
    assert get(client, f"/apps/{APP_ID}/channels/orders/users").status_code == 400
    assert get(client, f"/apps/{APP_ID}/channels", {"info": "user_count"}).status_code == 400


def test_disabled_credentials_are_403(client, app):
    PusherCredentials.objects.filter(app=app).update(enabled=False)
    app_snapshots_clear()
    assert post(client, f"/apps/{APP_ID}/events", {"name": "e", "data": "d", "channel": "c"}).status_code == 403


def test_the_apps_api_rate_limit_applies_to_the_pusher_api_too(client, app):
    from apps_registry.models import ClientApp

    ClientApp.objects.filter(pk=app.pk).update(api_rate_limit_per_second=0.1, api_rate_limit_burst=2)
    app_snapshots_clear()
    statuses = [get(client, f"/apps/{APP_ID}/channels").status_code for _ in range(4)]
    assert statuses[:2] == [200, 200] and statuses[-1] == 429
