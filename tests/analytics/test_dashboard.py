"""The dashboard's live figures, from cheap live queries."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from analytics.selectors import dashboard_live
from tests.analytics.conftest import tenant

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def routing_queue(redis_client):
    queue = settings.CELERY_TASK_ROUTES["messaging.tasks.route_deliveries"]["queue"]
    redis_client.delete(queue)
    yield queue
    redis_client.delete(queue)


def test_connected_users_and_connections_per_node_come_from_live_sessions(activity):
    anz = tenant("ANZ")
    web1, web2 = activity.node("web-1", "domain-01"), activity.node("web-2", "domain-01")
    now = timezone.now()
    activity.session(anz, "ANZ-1", web1, now)
    activity.session(anz, "ANZ-1", web2, now)  # the same user on two nodes
    activity.session(anz, "ANZ-2", web1, now)
    activity.session(anz, "ANZ-3", web1, now - timedelta(hours=1), now - timedelta(minutes=5))  # gone

    live = dashboard_live()

    assert (live.connected_users, live.connections) == (2, 3)
    assert [(n.node_id, n.domain, n.connections, n.users) for n in live.nodes] == [
        ("web-1", "domain-01", 2, 2), ("web-2", "domain-01", 1, 1)]


def test_message_rates_states_dead_letters_and_the_oldest_pending_are_shown(activity):
    anz = tenant("ANZ")
    now = timezone.now()
    activity.delivery(anz, now - timedelta(seconds=20), state="delivered", delivered_at=now - timedelta(seconds=10))
    activity.delivery(anz, now - timedelta(seconds=5))
    activity.delivery(anz, now - timedelta(hours=3))  # the oldest pending
    activity.delivery(anz, now - timedelta(minutes=30), state="retrying", attempts=1)
    activity.delivery(anz, now - timedelta(hours=2), state="dead", attempts=3, last_error="timeout")
    activity.delivery(anz, now - timedelta(hours=5), state="delivered", delivered_at=now - timedelta(hours=4))
    with connection.cursor() as cur:
        cur.execute("ANALYZE messaging_delivery")  # the estimates of delivered/expired come from statistics

    live = dashboard_live()

    assert live.accepted_last_minute == 2
    assert live.delivered_last_minute == 1
    states = {s.state: (s.count, s.exact) for s in live.states}
    assert states == {"pending": (2, True), "sent": (0, True), "retrying": (1, True), "dead": (1, True),
                      "delivered": (2, False), "expired": (0, False)}
    assert live.dead_letters == 1
    assert live.oldest_pending_known and abs(live.oldest_pending - (now - timedelta(hours=3))) < timedelta(seconds=1)


def test_routing_queue_depth_is_the_length_of_the_brokers_routing_list(redis_client, routing_queue):
    redis_client.rpush(routing_queue, "task-1", "task-2", "task-3")
    assert dashboard_live().routing_queue == 3
