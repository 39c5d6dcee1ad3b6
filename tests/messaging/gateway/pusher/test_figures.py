"""The console's Pusher figures per app, beside the native ones: the admin's dashboard reads them
cluster-wide from Redis at page time (messaging.gateway.pusher.figures), over the in-process node."""

from __future__ import annotations

import json
import re
import time

import pytest
from django.contrib.auth.models import User

from foundation.asyncdb import run_db
from messaging.gateway.pusher import figures
from messaging.gateway.pusher.node import pusher_node
from messaging.gateway.pusher.services import channels_occupied
from tests.messaging.gateway.pusher.test_pusher_door import Pusher
from tests.pusher import ANZ_APP_ID, signed_query

pytestmark = pytest.mark.django_db


def anz_pk(node) -> int:
    from apps_registry.selectors import app_snapshot

    return node.loop.run(run_db(app_snapshot, "ANZ")).pk


def trigger(client, body: dict) -> None:
    path = f"/apps/{ANZ_APP_ID}/events"
    raw = json.dumps(body).encode()
    response = client.post(f"{path}?{signed_query('POST', path, body=raw)}", data=raw, content_type="application/json")
    assert response.status_code == 200, response.content


def pusher_row(page: str, app_name: str) -> tuple[int, int, int]:
    row = re.search(rf'<tr id="app-{app_name}">(.*?)</tr>', page, re.S).group(1)
    return tuple(int(re.search(rf'class="num {cls}">(\d+)<', row).group(1))  # type: ignore[return-value]
                 for cls in ("pusher-connections", "pusher-channels", "pusher-published"))


def test_the_dashboard_shows_each_apps_pusher_connections_channels_and_events_published(node, client, redis_client):
    pk = anz_pk(node)
    redis_client.delete(figures.NODES, *redis_client.keys(f"sb:pusher:pub:{pk}:*"))  # other runs' figures
    reader, other = Pusher(node), Pusher(node)
    reader.subscribe("console.feed")
    other.subscribe("console.other")
    trigger(client, {"name": "tick", "data": "1", "channels": ["console.feed", "console.other"]})
    trigger(client, {"name": "tick", "data": "2", "channel": "console.feed"})
    assert reader.recv("tick")["data"] == "1"
    node.loop.run(pusher_node().heartbeat())  # what every node's heartbeat writes

    client.force_login(User.objects.create_superuser("operator", password="x"))
    page = client.get("/admin/").content.decode()

    assert 'id="live-per-app"' in page
    connections, channels, published = pusher_row(page, "ANZ")
    assert connections == pusher_node().by_app[pk] >= 2  # (the module's earlier clients are open too)
    assert channels == len(channels_occupied(pk)) >= 2
    assert published == 3  # the HTTP API counts one per channel


def test_a_nodes_connections_stop_counting_when_its_heartbeat_stops(node, settings):
    app = 10**9  # an app no other node counts
    settings.PUSHER_FIGURES_TTL_SECONDS = 1
    node.loop.run(figures.node_connections_write(node_id="gone-node", by_app={app: 5}))
    assert figures.figures_read([app])[app].connections == 5
    time.sleep(1.5)  # no heartbeat of gone-node since
    assert figures.figures_read([app])[app].connections == 0
