"""Where a message is routed: claims, pushes, and what happens to a push that cannot land."""

from __future__ import annotations

import asyncio

import pytest
from channels.layers import get_channel_layer
from redis import RedisError

from apps_registry.models import DomainLink
from apps_registry.services import distribution_create
from foundation.transport.sockets import run_async
from messaging.core import next_hop
from messaging.core.store import message_send
from messaging.models import Delivery
from messaging.routing import router
from presence import cache
from tests.factories import make_app, make_domain

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _empty_cache(redis_client, monkeypatch):
    redis_client.flushdb()
    monkeypatch.setattr(next_hop, "_graph_cache", None)  # the domain graph of an earlier test


@pytest.fixture
def anz():
    return make_app()


def _online(user: str, channel: str) -> None:
    run_async(cache.connection_add(user_id=user, channel_name=channel, node_id="web-1", acks=False, limit=10))


def _send(app, to: str = "ANZ-2", **kw):
    return message_send(app_id=app.pk, sender="ANZ-1", recipients=[to], content="hello", **kw)


def _row(result) -> Delivery:
    return Delivery.objects.get(pk=result.delivery_ids[0])


def test_a_message_to_an_online_user_is_pushed_to_its_connection_under_a_claim(anz):
    channel = run_async(get_channel_layer().new_channel())
    _online("ANZ-2", channel)
    sent = _send(anz)
    outcome = router.deliveries_route(list(sent.delivery_ids))
    event = run_async(asyncio.wait_for(get_channel_layer().receive(channel), 5))
    row = _row(sent)
    assert (outcome.pushed, row.state, row.attempts) == (1, "sent", 0)
    assert event["type"] == "message.deliver" and event["items"][0]["claim"] == row.claim
    assert '"content":"hello"' in event["items"][0]["frame"]


def test_an_offline_user_gets_the_message_parked_in_its_mailbox_without_an_attempt(anz):
    sent = _send(anz)
    assert router.deliveries_route(list(sent.delivery_ids)).offline == 1
    row = _row(sent)
    assert (row.state, row.attempts, row.next_attempt_at, row.claim) == ("pending", 0, None, None)


def test_a_connection_that_is_gone_counts_as_offline(anz):
    _online("ANZ-2", "specific.nobody-listens-here")  # its node died; the reaper has not run yet
    sent = _send(anz)
    assert router.deliveries_route(list(sent.delivery_ids)).offline == 1
    assert (_row(sent).state, _row(sent).attempts) == ("pending", 0)


def test_when_redis_is_away_after_the_claim_the_claim_is_released_due_at_once(anz, monkeypatch):
    sent = _send(anz)

    def redis_down(users):
        raise RedisError("connection refused")

    monkeypatch.setattr(cache, "connections_of_many", redis_down)
    assert router.deliveries_route(list(sent.delivery_ids)).released == 1
    row = _row(sent)
    assert (row.state, row.attempts, row.claim) == ("pending", 0, None)
    # due for routing again at once, not after the 30 s ack timeout plus backoff
    from django.utils import timezone

    assert row.next_attempt_at <= timezone.now()


def test_a_second_routing_task_for_the_same_rows_does_nothing(anz):
    channel = run_async(get_channel_layer().new_channel())
    _online("ANZ-2", channel)
    sent = _send(anz)
    router.deliveries_route(list(sent.delivery_ids))
    assert router.deliveries_route(list(sent.delivery_ids)) == router.RouteOutcome(0, 0, 0, 0)


def _homed_in_domain_02(anz) -> None:
    anz.distributions.filter(domain__name="domain-01").update(range_to=999_999)
    distribution_create(app=anz, domain=make_domain("domain-02"), range_from=1_000_000, range_to=None)


def test_a_message_to_a_user_homed_in_another_domain_is_queued_on_the_link_without_a_push(anz):
    _homed_in_domain_02(anz)
    DomainLink.objects.create(n1=make_domain("domain-01"), n2=make_domain("domain-02"))
    channel = run_async(get_channel_layer().new_channel())
    _online("ANZ-1000005", channel)  # a stale entry: the router does not even look
    sent = _send(anz, to="ANZ-1000005")
    outcome = router.deliveries_route(list(sent.delivery_ids))
    row = _row(sent)
    assert (outcome.elsewhere, outcome.pushed, outcome.offline) == (1, 0, 0)
    assert (row.state, row.forward_to, row.attempts, row.next_attempt_at, row.claim) == (
        "forwarding", "domain-02", 0, None, None)
    assert router.destination("ANZ-1000005") == "domain-02" and router.destination("ANZ-2") is None


def test_a_message_to_a_domain_no_link_reaches_counts_a_failed_attempt_no_route(anz):
    _homed_in_domain_02(anz)
    sent = _send(anz, to="ANZ-1000005")
    router.deliveries_route(list(sent.delivery_ids))
    row = _row(sent)
    assert (row.state, row.attempts, row.last_error) == ("retrying", 1, "no route to domain-02")
    assert row.next_attempt_at is not None  # retried with the app's backoff, dead after its attempts
