"""A domain's users with a standby domain have a live copy of their mailboxes there: every message
stored for them and every change of its delivery state, in order, caught up after the standby was
away. In the ring, domain-03's users stand by on domain-04 (issue 27's `make network` plan).

    domain-01 ── domain-02
        │            │
    domain-04 ── domain-03      CAROL is homed on 03, standing by on 04
"""

from __future__ import annotations

import pytest

from apps_registry.models import Domain, UserDistribution
from messaging.channels.services import subscription_add, subscription_remove
from messaging.federation.models import LinkHealth, StandbyCopy, StandbyFeed, StandbySubscription
from messaging.federation.standby.copy import StandbySender, copies_accept, copy_lag
from messaging.federation.standby.handback_feed import feed_send_last
from messaging.models import Delivery
from messaging.routing.tasks import standby_sweep
from tests.network import held_by_another_worker

pytestmark = pytest.mark.django_db

ALICE, BOB, CAROL = "ANZ-17", "ANZ-1000003", "ANZ-3000007"  # homed on 01, 02 and 03


@pytest.fixture
def standby_ring(net_ring):
    UserDistribution.objects.filter(domain__name="domain-03").update(standby=Domain.objects.get(name="domain-04"))
    return net_ring


def copy_now(net) -> None:
    """domain-03's beat wakes its standby sender; the copy goes."""
    with net.at("domain-03"):
        standby_sweep()
    net.pump()


def copies(net) -> list[tuple[str, int, str, str]]:
    with net.at("domain-04"):
        return list(StandbyCopy.objects.order_by("seq").values_list("recipient", "seq", "content", "state"))


def home_mailbox(net) -> list[tuple[str, int, str, str]]:
    with net.at("domain-03"):
        return list(Delivery.objects.filter(recipient=CAROL).order_by("seq")
                    .values_list("recipient", "seq", "message__content", "state"))


def test_every_message_stored_for_a_user_and_its_delivery_state_are_copied_to_the_standby(standby_ring):
    sent = [standby_ring.send(ALICE, CAROL, f"m{i}") for i in range(3)]
    standby_ring.send(BOB, CAROL, "from 02", at="domain-02")
    standby_ring.pump()
    copy_now(standby_ring)
    assert copies(standby_ring) == home_mailbox(standby_ring)
    assert sorted(content for _, _, content, _ in copies(standby_ring)) == ["from 02", "m0", "m1", "m2"]
    with standby_ring.at("domain-04"):
        first = StandbyCopy.objects.get(content="m0")
        assert (first.home, first.sender, first.origin_domain, first.origin_message_id) == \
            ("domain-03", ALICE, "domain-01", sent[0])
    standby_ring.deliver(CAROL, at="domain-03")
    copy_now(standby_ring)
    assert [state for *_, state in copies(standby_ring)] == ["delivered"] * 4
    assert copies(standby_ring) == home_mailbox(standby_ring)
    with standby_ring.at("domain-03"):
        assert not StandbyFeed.objects.exists()  # all taken
    with standby_ring.at("domain-04"):
        assert Delivery.objects.filter(recipient=CAROL).count() == 0  # inert: nothing to route or deliver there


def test_a_standby_that_was_away_catches_up_in_order(standby_ring):
    standby_ring.down.add("domain-04")
    for i in range(5):
        standby_ring.send(ALICE, CAROL, f"while away {i}")
    standby_ring.pump()
    copy_now(standby_ring)
    with standby_ring.at("domain-03"):
        waiting, lag = copy_lag()["domain-04"]
        assert waiting == 5 and lag >= 0
        assert set(StandbyFeed.objects.values_list("attempts", flat=True)) == {1}  # one failed call, counted
        assert "connection refused" in StandbyFeed.objects.first().last_error
    assert copies(standby_ring) == []
    standby_ring.down.clear()
    with standby_ring.at("domain-03"):
        LinkHealth.objects.update(up=True, down_since=None, retry_at=None, failures=0)
    copy_now(standby_ring)
    assert [content for _, _, content, _ in copies(standby_ring)] == [f"while away {i}" for i in range(5)]
    with standby_ring.at("domain-03"):
        assert copy_lag() == {}


def test_users_without_a_standby_and_messages_passing_through_are_not_copied(standby_ring):
    standby_ring.send(ALICE, BOB, "to 02")  # BOB's distribution names no standby
    standby_ring.send(ALICE, CAROL, "to 03 through 02")
    standby_ring.pump()
    for domain in ("domain-01", "domain-02"):
        with standby_ring.at(domain):
            assert not StandbyFeed.objects.exists()  # CAROL's copies at 01 and 02 are not her mailbox
    with standby_ring.at("domain-03"):
        assert StandbyFeed.objects.count() == 1


def test_a_users_durable_subscriptions_are_copied_made_and_ended(standby_ring):
    with standby_ring.at("domain-03"):
        subscription_add(app_id=standby_ring.app.pk, subscriber=CAROL, channel="news")
        subscription_add(app_id=standby_ring.app.pk, subscriber=CAROL, channel="sport")
    copy_now(standby_ring)
    with standby_ring.at("domain-04"):
        assert sorted(StandbySubscription.objects.values_list("home", "subscriber", "channel")) == \
            [("domain-03", CAROL, "news"), ("domain-03", CAROL, "sport")]
    with standby_ring.at("domain-03"):
        subscription_remove(app_id=standby_ring.app.pk, subscriber=CAROL, channel="news")
    copy_now(standby_ring)
    with standby_ring.at("domain-04"):
        assert list(StandbySubscription.objects.values_list("channel", flat=True)) == ["sport"]


def test_the_standby_refuses_a_copy_of_a_user_who_does_not_stand_by_there(standby_ring):
    copy = {"delivery": 9, "app": "ANZ", "recipient": BOB, "seq": 1, "origin_seq": 1, "state": "pending",
            "attempts": 0, "created_at": "2026-11-27T10:00:00+00:00", "delivered_at": None, "dead_at": None,
            "expired_at": None, "origin_domain": "domain-01", "origin_message_id": 5,
            "message": {"sender": ALICE, "kind": "direct", "content": "x", "reference": "",
                        "confirmation_requested": False, "client_message_id": None}}
    with standby_ring.at("domain-04"):
        answer = copies_accept(sender="domain-02", payload={"copies": [copy]})
        assert answer == {"copied": 0, "refused": 1}  # BOB's home is 02, and he has no standby
        assert not StandbyCopy.objects.exists()
        answer = copies_accept(sender="domain-03", payload={"copies": [{**copy, "recipient": CAROL}]})
        assert answer == {"copied": 1, "refused": 0}


def test_the_console_and_metrics_show_the_copy_lag(standby_ring, operator, client):
    standby_ring.down.add("domain-04")
    standby_ring.send(ALICE, CAROL, "m")
    standby_ring.pump()
    with standby_ring.at("domain-03"):
        page = operator.get("/admin/messaging/linkhealth/").content.decode()
        metrics = client.get("/metrics", REMOTE_ADDR="127.0.0.1").content.decode()
    assert "1 waiting" in page
    assert 'switchboard_standby_copy_waiting{standby="domain-04"} 1.0' in metrics


def test_a_hand_backs_last_call_takes_the_whole_feed_in_one_call_or_sends_nothing(standby_ring, settings):
    for i in range(3):
        standby_ring.send(ALICE, CAROL, f"m{i}")
    standby_ring.pump()
    settings.FORWARD_BATCH_SIZE = 2  # more than one call's worth: nothing goes
    with standby_ring.at("domain-03"):
        assert feed_send_last(standby="domain-04") is False
        assert StandbyFeed.objects.count() == 3
    assert copies(standby_ring) == []
    settings.FORWARD_BATCH_SIZE = 500
    with standby_ring.at("domain-03"):
        assert feed_send_last(standby="domain-04") is True
        assert not StandbyFeed.objects.exists()
        assert feed_send_last(standby="domain-04") is True  # nothing left: nothing to send
    assert copies(standby_ring) == home_mailbox(standby_ring)


def test_a_hand_backs_last_call_waits_while_the_standbys_sender_is_at_work_on_the_feed(standby_ring):
    standby_ring.send(ALICE, CAROL, "m")
    standby_ring.pump()
    with held_by_another_worker(StandbySender("domain-04").lock_key), standby_ring.at("domain-03"):
        assert feed_send_last(standby="domain-04") is False  # the sender's own run, under its lock
        assert StandbyFeed.objects.count() == 1
    with standby_ring.at("domain-03"):
        assert feed_send_last(standby="domain-04") is True


def test_a_hand_backs_last_call_that_fails_is_counted_as_the_senders_are_and_the_feed_waits(standby_ring):
    standby_ring.send(ALICE, CAROL, "m")
    standby_ring.pump()
    standby_ring.down.add("domain-04")
    with standby_ring.at("domain-03"):
        assert feed_send_last(standby="domain-04") is False
        assert list(StandbyFeed.objects.values_list("attempts", flat=True)) == [1]
        assert LinkHealth.objects.get(peer="domain-04").failures == 1
        assert feed_send_last(standby="domain-04") is False  # the link's backoff does not hold it back: tried again
        assert list(StandbyFeed.objects.values_list("attempts", flat=True)) == [2]
