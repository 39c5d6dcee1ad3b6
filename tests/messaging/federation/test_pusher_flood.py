"""Pusher events reach the network: an event published with the Pusher HTTP API on one domain is a
channel publish like any other, flooded to every domain of the ring (tests/network.py), where the
Pusher clients of the same channel read it."""

from __future__ import annotations

import json

import pytest

from apps_registry.selectors import app_snapshot
from messaging.channels.services import channel_history
from messaging.gateway.pusher import protocol as p
from messaging.gateway.pusher.services import EventToPublish, pusher_events_publish

pytestmark = pytest.mark.django_db


def test_a_pusher_event_published_on_one_domain_is_stored_on_every_domain_of_the_ring(net_ring):
    with net_ring.at("domain-01"):
        pusher_events_publish(app_id=app_snapshot("ANZ").pk, events=[
            EventToPublish(channels=["orders", "presence-room.1"], name="OrderShipped", data='{"id":1}')])
    net_ring.pump()
    for domain in ("domain-02", "domain-03", "domain-04"):
        with net_ring.at(domain):
            app = app_snapshot("ANZ")
            for channel in ("orders", "presence-room.1"):
                (item,) = channel_history(app_id=app.pk, channel=p.switchboard_channel(channel), after=0)
                assert p.envelope_read(item.content) == p.Event(name="OrderShipped", data='{"id":1}')
                assert json.loads(item.content)["event"] == "OrderShipped"
