"""Where a node is declared dead: its sessions end, presence forgets it, the master hears of it."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from channels.layers import get_channel_layer
from django.utils import timezone

from foundation.outbound import claim_token
from foundation.transport.sockets import run_async
from messaging.core.delivery.claims import deliveries_claim
from messaging.core.delivery.lost_nodes import lost_nodes_settle
from messaging.core.store import message_send
from messaging.models import Delivery
from presence import cache
from presence.lost_nodes import node_restart_cleanup, nodes_reap
from presence.models import Node, Session
from tests.factories import make_app

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _empty_cache(redis_client):
    redis_client.flushdb()


def _node(node_id: str, silent_for: int) -> Node:
    at = timezone.now() - timedelta(seconds=silent_for)
    return Node.objects.create(node_id=node_id, domain="domain-01", started_at=at, heartbeat_at=at)


def _connect(app, user: str, node: Node, channel: str) -> Session:
    run_async(cache.connection_add(user_id=user, channel_name=channel, node_id=node.node_id, acks=False, limit=10))
    return Session.objects.create(app=app, user_id=user, node=node, channel_name=channel,
                                  connected_at=node.started_at, last_seen_at=node.started_at)


def _new_channel() -> str:
    return run_async(get_channel_layer().new_channel())


def _next_event(channel: str) -> dict:
    return run_async(asyncio.wait_for(get_channel_layer().receive(channel), 5))


def test_a_silent_node_is_declared_dead_and_the_master_hears_its_users_leave():
    app = make_app()
    dead, alive = _node("web-dead", silent_for=60), _node("web-alive", silent_for=0)
    master_channel = _new_channel()
    _connect(app, "ANZ-123223", alive, master_channel)
    _connect(app, "ANZ-5", dead, "ghost-1")
    _connect(app, "ANZ-6", dead, "ghost-2")
    _connect(app, "ANZ-6", alive, "still-here")

    reaped = nodes_reap()

    assert [(r.node_id, r.sessions, r.users) for r in reaped] == [("web-dead", 2, [(app.pk, "ANZ-5"), (app.pk, "ANZ-6")])]
    assert reaped[0].offline == [(app.pk, "ANZ-5")]  # messaging announces these to the webhooks
    assert Node.objects.get(pk="web-dead").stopped_at is not None
    assert not Session.objects.filter(node_id="web-dead", disconnected_at__isnull=True).exists()
    assert cache.connections_of_many(["ANZ-5", "ANZ-6"]) == {
        "ANZ-5": [], "ANZ-6": [cache.LiveConnection("still-here", "web-alive", False)]}
    event = _next_event(master_channel)  # ANZ-6 is still online elsewhere: only ANZ-5 is announced
    assert event["frame"] == '{"type":"USER_DISCONNECTED","data":{"userId":"ANZ-5"}}'
    assert nodes_reap() == []  # already done


def test_a_node_whose_redis_key_is_alive_is_not_reaped_on_postgres_lag_alone():
    _node("web-slow-db", silent_for=60)
    run_async(cache.node_heartbeat(node_id="web-slow-db", ttl=20, held=[]))
    assert nodes_reap() == []


def test_messaging_requeues_what_was_in_flight_to_the_users_of_a_dead_node():
    app = make_app()
    node = _node("web-dead", silent_for=60)
    _connect(app, "ANZ-5", node, "ghost")
    sent = message_send(app_id=app.pk, sender="ANZ-1", recipients=["ANZ-5"], content="in flight")
    waiting = message_send(app_id=app.pk, sender="ANZ-1", recipients=["ANZ-5"], content="never routed")
    deliveries_claim(delivery_ids=list(sent.delivery_ids), token=claim_token())

    assert lost_nodes_settle(reaped=nodes_reap()) == 1

    row = Delivery.objects.get(pk=sent.delivery_ids[0])
    assert (row.state, row.attempts, row.claim) == ("retrying", 0, None)
    assert row.next_attempt_at <= timezone.now()
    assert Delivery.objects.get(pk=waiting.delivery_ids[0]).state == "pending"


def test_a_node_restarting_under_its_old_id_ends_the_sessions_of_its_previous_life():
    app = make_app()
    node = _node("web-1", silent_for=0)
    _connect(app, "ANZ-5", node, "old-socket")
    reaped = node_restart_cleanup(node_id="web-1")
    assert reaped is not None and reaped.users == [(app.pk, "ANZ-5")]
    assert cache.connections_of_many(["ANZ-5"]) == {"ANZ-5": []}
    assert node_restart_cleanup(node_id="web-1") is None
