"""A standby domain takes its home's users over when the home is lost, and hands them back when it
returns (messaging.federation.takeover.take), on the one-database ring: domain-03's users stand by on
domain-04; domain-01 and domain-02 are the third domains that may witness.

    domain-01 ── domain-02
        │            │
    domain-04 ── domain-03      CAROL is homed on 03, standing by on 04
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from apps_registry.models import Domain, Takeover
from apps_registry.selectors import TAKEOVER_LOOK_SECONDS, app_snapshot, app_snapshot_known, app_snapshots_clear
from foundation.handoff import GOSSIP_TASK
from foundation.transport.sockets import run_async
from messaging.channels.models import Subscription
from messaging.channels.services import subscription_add
from messaging.federation.models import DomainHeard, LinkHealth, StandbyCopy, StandbyFeed
from messaging.federation.order import Arrival, arrivals_put_in_order
from messaging.federation.presence_gossip import presence_gossip
from messaging.federation.senders.queue import forward_sweep
from messaging.federation.standby.mailbox_merge import Copied, mailbox_merge
from messaging.federation.takeover import take
from messaging.federation.takeover.fence import cut_off, fence, fence_forget
from messaging.federation.takeover.records import epoch_next, network_accept, network_gossip
from messaging.federation.takeover.take import given_back, hand_back, take_over, takeover_watch
from messaging.gateway.authentication import client_authenticate
from messaging.models import Delivery, Message
from messaging.routing.router import deliveries_route
from messaging.routing.tasks import standby_flush_on_stop, standby_sweep

pytestmark = pytest.mark.django_db

ALICE, BOB, CAROL, DAVE = "ANZ-17", "ANZ-1000003", "ANZ-3000007", "ANZ-6000001"  # homed on 01, 02, 03, 04


def told_by_04(net) -> dict:
    """What domain-04's gossip tells its neighbours of the takeovers it holds."""
    with net.at("domain-04"):
        return {"heard": {}, "takeovers": network_gossip()["takeovers"]}


def login(user: str, app_id: str):
    """AUTH_CLIENT at the domain in use, with what its web node has cached fresh (so the login reads nothing)."""
    app_snapshots_clear()
    app_snapshot("ANZ")
    fence_forget()
    fence()
    return run_async(client_authenticate(app_id=app_id, user_id=user, token=""), timeout=30)


def copy_now(net, at: str = "domain-03") -> None:
    with net.at(at):
        standby_sweep()
    net.pump()


def heard(net, at: str, of: str, seconds_ago: float, *, like: str | None = None) -> None:
    """`at` last heard a newer word of `of` that long ago: `of`'s clock then (the word came at once),
    or (`like`) the last one that domain heard of `of`, come late."""
    when = timezone.now() - timedelta(seconds=seconds_ago)
    version = int(when.timestamp() * 1e9)
    if like is not None:
        with net.at(like):
            version = DomainHeard.objects.get(domain=of).version
    with net.at(at):
        DomainHeard.objects.update_or_create(domain=of, defaults={"version": version, "heard_at": when})


def lost(net, home: str = "domain-03") -> None:
    """The home is down: calls to it fail, its neighbours have seen its links down for a minute,
    and nobody has heard of it for as long."""
    net.down.add(home)
    for n in ("domain-01", "domain-02", "domain-04"):
        heard(net, n, home, 60)
    for neighbour in ("domain-02", "domain-04"):
        with net.at(neighbour):
            LinkHealth.objects.update_or_create(peer=home, defaults={
                "up": False, "down_since": timezone.now() - timedelta(seconds=60), "last_error": f"{home}: refused"})


def taken_over_and_back(net) -> None:
    """domain-03 lost, its users taken over by domain-04, and domain-03 answering again (still held)."""
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
    net.down.clear()


def handed_back_and_told(net) -> None:
    """domain-04 hands carol back, and domain-03 hears so from its gossip."""
    with net.at("domain-04"):
        assert hand_back("domain-03")["state"] == "handed back"
        record = network_gossip()["takeovers"]
    with net.at("domain-03"):
        network_accept({"heard": {}, "takeovers": record}, sender="domain-04")


def mailbox(net, at: str) -> list[tuple[str, str]]:
    with net.at(at):
        return list(Delivery.objects.filter(recipient=CAROL).order_by("seq").values_list("message__content", "state"))


def held_by(net, at: str) -> str | None:
    with net.at(at):
        row = Takeover.objects.filter(home__name="domain-03", held=True).values_list("holder__name", flat=True)
        return row.first()


def test_a_standby_takes_over_a_lost_home_only_when_a_third_domain_agrees_it_is_silent(standby_ring):
    net = standby_ring
    for i in range(3):
        net.send(ALICE, CAROL, f"before {i}")
    net.pump()
    net.deliver(CAROL, at="domain-03")
    net.send(ALICE, CAROL, "unread")
    net.pump()
    copy_now(net)
    net.down.add("domain-03")
    net.send(DAVE, CAROL, "waiting at 04", at="domain-04")  # on the link to domain-03, which fails
    net.pump()
    lost(net)
    heard(net, "domain-01", "domain-03", 1)  # domain-01 still hears domain-03 (through domain-02)
    with net.at("domain-04"):
        assert takeover_watch() == {"domain-03": "not taken: domain-01 heard domain-03 within 30 s"}
    assert held_by(net, "domain-04") is None
    heard(net, "domain-01", "domain-03", 60)
    with net.at("domain-04"):
        assert takeover_watch() == {"domain-03": "taken"}
        assert app_snapshot("ANZ").home_of(CAROL) == "domain-04"
    assert mailbox(net, "domain-04") == [("before 0", "delivered"), ("before 1", "delivered"),
                                         ("before 2", "delivered"), ("unread", "pending"),
                                         ("waiting at 04", "pending")]  # after the copy: the home had it first
    with net.at("domain-04"):
        assert list(StandbyFeed.objects.values_list("standby", "new")) == [("domain-03", True)]  # the home has it not
    # Told around with the next gossip; every domain sends carol's messages to domain-04 from then on.
    with net.at("domain-04"):
        presence_gossip()
    with net.at("domain-01"):
        presence_gossip()
    net.pump()
    assert [held_by(net, n) for n in ("domain-01", "domain-02", "domain-04")] == ["domain-04"] * 3
    net.send(BOB, CAROL, "during", at="domain-02")
    net.pump()
    assert mailbox(net, "domain-04")[-1] == ("during", "pending")


def sent_round_then_taken_over(net) -> None:
    """domain-04 sends carol "round" while domain-03 is lost (it routes round: through domain-01 and
    domain-02, where it waits for domain-03), then takes domain-03's users over."""
    lost(net)
    net.send(DAVE, CAROL, "round", at="domain-04")
    net.pump()
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"


def test_the_holders_web_node_serves_the_users_it_took_over_from_its_next_look_at_the_takeovers(standby_ring):
    """The takeover is written by domain-04's worker; its web node has the app cached from before (carol
    lives in domain-03). A login reads that cache without a query only until the node's next look at
    the takeovers' epoch (TAKEOVER_LOOK_SECONDS); then it reads the app again (`app_snapshot`, on a
    thread: run here), which has carol served at domain-04. Before, the cache answered logins until it
    expired (SNAPSHOT_TTL): carol was refused at her holder for up to 5 s after the takeover (4 s of a
    fault run's 15 s without a login)."""
    net = standby_ring
    lost(net)
    heard(net, "domain-04", "domain-01", 0)  # (not cut off)
    with net.at("domain-04"):
        app_snapshots_clear()
        app_snapshot("ANZ")
        fence_forget()
        fence()
        refused = run_async(client_authenticate(app_id=net.app.app_id, user_id=CAROL, token=""), timeout=30)
        assert refused.reason == "user lives in domain-03; connect to that domain"
        Takeover.objects.create(home=Domain.objects.get(name="domain-03"), holder=Domain.objects.get(name="domain-04"),
                                held=True, epoch=epoch_next(None), taken_at=timezone.now(), learned_at=timezone.now())
        time.sleep(TAKEOVER_LOOK_SECONDS + 0.1)
        assert app_snapshot_known("ANZ") == (False, None)  # the login asks the database
        assert app_snapshot("ANZ").home_of(CAROL) == "domain-04"


def test_a_message_that_went_round_towards_the_lost_home_comes_back_to_the_holder_once(standby_ring):
    net = standby_ring
    sent_round_then_taken_over(net)
    for n in ("domain-01", "domain-02"):
        with net.at(n):
            network_accept(told_by_04(net), sender="domain-04")
            forward_sweep()
    net.pump()
    for n in ("domain-01", "domain-02"):
        with net.at(n):
            forward_sweep()
    net.pump()
    assert mailbox(net, "domain-04") == [("round", "pending")]


def test_a_message_the_holder_sent_round_comes_back_by_another_way_into_the_mailbox_once(standby_ring):
    net = standby_ring
    sent_round_then_taken_over(net)
    # domain-03 answers again (still held), and domain-02 can reach the holder only through it
    net.down.discard("domain-03")
    net.cut_link("domain-01", "domain-02")
    for n in ("domain-02", "domain-03", "domain-04"):
        with net.at(n):
            network_accept(told_by_04(net), sender="domain-04")
            LinkHealth.objects.filter(peer="domain-03").update(up=True, down_since=None, retry_at=None, last_error="")
    with net.at("domain-03"):  # it learned before the message was sent (the test's database clock stands still)
        Takeover.objects.update(learned_at=timezone.now() - timedelta(minutes=1))
    for _ in range(2):
        for n in ("domain-02", "domain-03"):
            with net.at(n):
                forward_sweep()
        net.pump()
    # domain-04's record of sending it to domain-01 is the mailbox row now: the message reached carol,
    # and the home gets it with the hand-back
    assert mailbox(net, "domain-04") == [("round", "pending")]
    with net.at("domain-04"):
        row = Delivery.objects.get(recipient=CAROL)
        assert list(StandbyFeed.objects.values_list("standby", "delivery_id", "new")) == [("domain-03", row.id, True)]


def test_a_home_that_is_only_cut_off_from_its_standby_is_not_taken_over(standby_ring):
    net = standby_ring
    net.cut_link("domain-03", "domain-04")
    for n in ("domain-01", "domain-02"):
        heard(net, n, "domain-03", 1)
    heard(net, "domain-04", "domain-03", 2)  # its word comes round through 02 and 01
    with net.at("domain-04"):
        LinkHealth.objects.filter(peer="domain-03").update(down_since=timezone.now() - timedelta(minutes=5))
        assert takeover_watch() == {}
    assert held_by(net, "domain-04") is None


def test_the_holder_hands_back_once_the_home_has_every_change_and_nothing_comes_twice(standby_ring, settings):
    net = standby_ring
    net.send(ALICE, CAROL, "before")
    net.pump()
    with net.at("domain-03"):
        subscription_add(app_id=net.app.pk, subscriber=CAROL, channel="news")
    copy_now(net)
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
        assert list(Subscription.objects.filter(subscriber=CAROL).values_list("channel", flat=True)) == ["news"]
        subscription_add(app_id=net.app.pk, subscriber=CAROL, channel="sport")
    net.send(ALICE, CAROL, "during")  # domain-01 learned of the takeover
    with net.at("domain-01"):
        network_accept(told_by_04(net), sender="domain-04")
    net.pump()
    net.deliver(CAROL, at="domain-04")  # she read both at domain-04
    net.down.clear()
    settings.FORWARD_BATCH_SIZE = 1  # more changes waiting than one call takes: the hand-back sends them itself
    with net.at("domain-04"):
        assert StandbyFeed.objects.filter(standby="domain-03").count() > 1
        assert hand_back("domain-03")["state"] == "handed back"  # not waiting for the worker's sender
        assert not StandbyFeed.objects.exists()
        assert not Delivery.objects.filter(recipient=CAROL).exists()  # cleared: the home has them
        assert sorted(StandbyCopy.objects.filter(recipient=CAROL).values_list("content", "state")) == [
            ("before", "delivered"), ("during", "delivered")]  # standing by again, from what it held
        assert not Subscription.objects.filter(subscriber=CAROL).exists()
    assert mailbox(net, "domain-03") == [("before", "delivered"), ("during", "delivered")]
    with net.at("domain-03"):
        assert sorted(Subscription.objects.filter(subscriber=CAROL).values_list("channel", flat=True)) == [
            "news", "sport"]
        assert not StandbyFeed.objects.exists()  # the merge fed nothing back


def test_a_message_stored_at_the_holder_as_it_took_over_goes_home_at_the_hand_back(standby_ring):
    """A message stored at the standby for the home's user while the takeover was being recorded: its
    row was made before the takeover could be seen (so not fed to the home), and routing, after it,
    left it in her mailbox there, where she read it. Handed back, the home has it (a fault run found
    such a message in the holder's copy alone: the home was fed only its delivery, without the
    message)."""
    net = standby_ring
    lost(net)
    net.send(DAVE, CAROL, "stored as the takeover was recorded", at="domain-04")  # not routed yet
    with net.at("domain-04"):
        assert list(Delivery.objects.filter(recipient=CAROL).values_list("state", "forward_to")) == [("pending", "")]
        assert not StandbyFeed.objects.exists()
        take_over("domain-03")
    net.pump()
    net.deliver(CAROL, at="domain-04")
    assert mailbox(net, "domain-04") == [("stored as the takeover was recorded", "delivered")]
    net.down.clear()
    with net.at("domain-04"):
        assert hand_back("domain-03")["state"] == "handed back"
    assert mailbox(net, "domain-03") == [("stored as the takeover was recorded", "delivered")]


def test_a_feed_longer_than_one_look_sends_waits_for_the_next_look_and_goes_home_then(standby_ring, settings,
                                                                                     monkeypatch):
    net = standby_ring
    copy_now(net)
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
    with net.at("domain-01"):
        network_accept(told_by_04(net), sender="domain-04")
    for i in range(3):
        net.send(ALICE, CAROL, f"during {i}")
    net.pump()
    net.down.clear()
    settings.FORWARD_BATCH_SIZE = 1
    monkeypatch.setattr(take, "HAND_BACK_DRAIN_SECONDS", 0.0)  # one call a look, then the last call's turn
    with net.at("domain-04"):
        waiting = StandbyFeed.objects.filter(standby="domain-03").count()
        first = hand_back("domain-03")
        assert first["state"] == "waiting" and 0 < first["changes_waiting"] < waiting
        assert held_by(net, "domain-04") == "domain-04"
    monkeypatch.setattr(take, "HAND_BACK_DRAIN_SECONDS", 5.0)
    with net.at("domain-04"):
        assert hand_back("domain-03")["state"] == "handed back"
        assert not StandbyFeed.objects.exists()
    assert mailbox(net, "domain-03") == [("during 0", "pending"), ("during 1", "pending"), ("during 2", "pending")]


def test_a_home_given_its_users_back_keeps_a_message_it_forwarded_whose_only_mailbox_row_was_the_holders(
        standby_ring):
    net = standby_ring
    taken_over_and_back(net)
    # The home, back but still held, stored a message for carol. Its copy reached the holder first and
    # was merged there, so the forward that followed was a duplicate: here, a record of it only.
    sent = net.send("ANZ-3000001", CAROL, "came both ways", at="domain-03")
    with net.at("domain-03"):
        Delivery.objects.filter(message_id=sent).update(state="forwarded", forward_to="domain-04")
    with net.at("domain-04"):
        mailbox_merge([Copied(app_id=net.app.pk, recipient=CAROL, origin_domain="domain-03", origin_message_id=sent,
                              state="pending", message={"sender": "ANZ-3000001", "content": "came both ways"})])
    handed_back_and_told(net)  # the holder's rows of carol's are cleared
    net.pump()
    assert mailbox(net, "domain-03") == [("came both ways", "pending")]


def test_a_forward_to_the_holder_it_took_for_a_duplicate_as_it_handed_back_goes_into_the_mailbox_at_the_next_look(
        standby_ring):
    net = standby_ring
    taken_over_and_back(net)
    handed_back_and_told(net)
    net.pump()  # the home's given_back has run
    # A forward to the holder still on its way as the holder handed back: the former holder, serving
    # carol no more, took it for a duplicate of its own record of passing the message on. Here: a
    # record of it only, made after given_back looked.
    sent = net.send("ANZ-3000001", CAROL, "in flight", at="domain-03")
    with net.at("domain-03"):
        Delivery.objects.filter(message_id=sent).update(state="forwarded", forward_to="domain-04")
        takeover_watch()  # the home's next look
    net.pump()
    assert mailbox(net, "domain-03") == [("in flight", "pending")]


def test_a_former_holder_feeds_the_home_nothing_of_what_it_stores_on_its_way_to_the_homes_users(standby_ring):
    net = standby_ring
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
    net.send(DAVE, CAROL, "while held", at="domain-04")
    net.down.clear()
    with net.at("domain-04"):
        assert list(StandbyFeed.objects.values_list("standby", flat=True)) == ["domain-03"]  # a change the home lacks
        assert hand_back("domain-03")["state"] == "handed back"
        net.send(DAVE, CAROL, "after", at="domain-04")  # forwarded to the home: no copy of it goes there too
        assert not StandbyFeed.objects.exists()


def test_a_home_given_its_users_back_copies_their_mailboxes_to_the_standby_again_as_it_has_them(standby_ring):
    net = standby_ring
    net.send(ALICE, CAROL, "before")
    net.pump()
    copy_now(net)
    net.send(ALICE, CAROL, "tail")  # stored at home, never copied: the home is lost next
    net.pump()
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
    net.send(DAVE, CAROL, "during", at="domain-04")
    net.pump()
    net.down.clear()
    with net.at("domain-04"):
        assert hand_back("domain-03")["state"] == "handed back"  # "during" went home with it
        record = network_gossip()["takeovers"]
    with net.at("domain-03"):
        network_accept({"heard": {}, "takeovers": record}, sender="domain-04")  # the home learns it has its users back
    copy_now(net)
    with net.at("domain-03"):
        home = list(Delivery.objects.filter(recipient=CAROL, forward_to="").order_by("seq")
                    .values_list("seq", "message__content", "state"))
    with net.at("domain-04"):
        standing_by = list(StandbyCopy.objects.filter(recipient=CAROL).order_by("seq")
                           .values_list("seq", "content", "state"))
    assert [content for _, content, _ in home] == ["before", "tail", "during"]
    assert standing_by == home  # the home's numbering and states, the tail included


def test_a_home_not_yet_told_of_its_hand_back_learns_it_from_the_holders_next_message(standby_ring):
    net = standby_ring
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
    with net.at("domain-04"):
        told = network_gossip()["takeovers"]
    with net.at("domain-03"):  # the home knows it is held
        assert network_accept({"heard": {}, "takeovers": told}, sender="domain-04").changed == 1
    net.down.clear()
    with net.at("domain-04"):
        assert hand_back("domain-03")["state"] == "handed back"  # its gossip to domain-03 is not sent
    assert held_by(net, "domain-03") == "domain-04"
    net.send(DAVE, CAROL, "just after", at="domain-04")  # domain-04 routes it home now
    net.pump(skip=GOSSIP_TASK)  # its gossip is late
    assert held_by(net, "domain-03") is None  # the call said so, before its message was stored
    assert mailbox(net, "domain-03") == [("just after", "pending")]  # not sent back to domain-04
    assert mailbox(net, "domain-04") == [("just after", "forwarded")]  # its record of sending it home, once


def test_a_home_given_its_users_back_puts_each_origins_messages_back_in_its_order(standby_ring):
    net = standby_ring
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
        told = network_gossip()["takeovers"]
    net.down.clear()

    def copied(n: int, origin: str = "domain-01") -> Copied:
        return Copied(app_id=net.app.pk, recipient=CAROL, origin_domain=origin, origin_message_id=100 + n,
                      state="pending", origin_seq=n, message={"sender": ALICE, "content": f"{origin} {n}"})

    def contents() -> list[str]:
        return [c for c, _ in mailbox(net, "domain-03")]

    with net.at("domain-03"):
        network_accept({"heard": {}, "takeovers": told}, sender="domain-04")
        mailbox_merge([copied(3), copied(1, "domain-02")])  # came here on a link's queue when it returned
        mailbox_merge([copied(1), copied(4), copied(2, "domain-02")])  # what the holder stored, copied back
    assert contents() == ["domain-01 3", "domain-02 1", "domain-01 1", "domain-01 4", "domain-02 2"]
    with net.at("domain-04"):
        assert hand_back("domain-03")["state"] == "handed back"
        told = network_gossip()["takeovers"]
    with net.at("domain-03"):
        network_accept({"heard": {}, "takeovers": told}, sender="domain-04")
        assert given_back("domain-04")["reordered"] == 2
    assert contents() == [  # domain-01's in its order, over its places; domain-02's where they were
        "domain-01 1", "domain-02 1", "domain-01 3", "domain-01 4", "domain-02 2"]
    with net.at("domain-03"):
        mailbox_merge([copied(2)])  # late: it waited on a neighbour's link
        StandbyFeed.objects.all().delete()
        takeover_watch()  # put in its place at the next look
        moved = set(StandbyFeed.objects.values_list("delivery_id", flat=True))
    assert contents() == ["domain-01 1", "domain-02 1", "domain-01 2", "domain-01 3", "domain-02 2", "domain-01 4"]
    assert len(moved) == 3  # the rows that moved go to the standby's copy with their new places


def test_a_domain_stopped_on_purpose_sends_its_standby_what_the_copy_lacks_before_its_worker_goes(standby_ring):
    net = standby_ring
    net.send(ALICE, CAROL, "just before the stop")
    net.pump()
    with net.at("domain-03"):
        assert StandbyFeed.objects.exists()
        standby_flush_on_stop(how="Cold")  # a cold stop (a second signal) waits for nothing
        assert StandbyFeed.objects.exists()
        standby_flush_on_stop(how="Warm")
        assert not StandbyFeed.objects.exists()
    with net.at("domain-04"):
        assert list(StandbyCopy.objects.values_list("content", flat=True)) == ["just before the stop"]


def test_an_arrival_held_for_its_origins_order_is_let_go_without_a_second_row_when_a_merge_placed_it(standby_ring):
    net = standby_ring

    def copy(n: int, recipient: str) -> Copied:
        return Copied(app_id=net.app.pk, recipient=recipient, origin_domain="domain-01", origin_message_id=500 + n,
                      state="pending", origin_seq=n, message={"sender": ALICE, "content": f"m{n}"})

    with net.at("domain-03"):
        mailbox_merge([copy(1, BOB), copy(2, BOB)])  # the messages are here (for another recipient)
        ids = dict(Message.objects.filter(origin_domain="domain-01").values_list("content", "id"))
        held = arrivals_put_in_order([Arrival(ids["m2"], net.app.pk, CAROL, "domain-01", 2)])
        assert held.held == 1  # the first from domain-01 to carol is still on its way
        mailbox_merge([copy(2, CAROL)])  # a copy brings it meanwhile (from carol's holder, say)
        arrivals_put_in_order([Arrival(ids["m1"], net.app.pk, CAROL, "domain-01", 1)])  # the gap fills
    assert mailbox(net, "domain-03") == [("m2", "pending"), ("m1", "pending")]  # m2 once


def test_a_record_of_a_message_sent_away_is_not_pushed_when_the_message_came_back_into_the_mailbox(standby_ring):
    net = standby_ring
    copy = Copied(app_id=net.app.pk, recipient=CAROL, origin_domain="domain-01", origin_message_id=77,
                  state="pending", origin_seq=1, message={"sender": ALICE, "content": "once"})
    with net.at("domain-03"):
        mailbox_merge([copy])  # it came back from the holder, into carol's mailbox
        row = Delivery.objects.get(recipient=CAROL)
        # ... while domain-03's own record of sending it to the holder waits for a retry
        record = Delivery.objects.create(message_id=row.message_id, app_id=net.app.pk, recipient=CAROL, seq=row.seq + 1,
                                         state="retrying", forward_to="domain-04", created_at=timezone.now())
        deliveries_route([record.id, row.id])  # carol is served here again
        record.refresh_from_db()
        assert record.state == "forwarded"  # not pushed: the mailbox row is
    assert mailbox(net, "domain-03") == [("once", "pending"), ("once", "forwarded")]


def test_a_merge_stores_each_message_once_whichever_way_it_came_first(standby_ring):
    net = standby_ring
    copy = Copied(app_id=net.app.pk, recipient=CAROL, origin_domain="domain-01", origin_message_id=77,
                  state="pending", origin_seq=1, message={"sender": ALICE, "content": "once"})
    with net.at("domain-04"):
        assert mailbox_merge([copy, copy]).appended == 1
        assert mailbox_merge([copy]).appended == 0
        assert mailbox_merge([Copied(**{**copy.__dict__, "state": "delivered", "message": None})]).states == 1
        assert mailbox_merge([copy]).states == 0  # a copy never undelivers
    assert mailbox(net, "domain-04") == [("once", "delivered")]


def test_the_higher_epoch_wins_wherever_the_gossip_brings_a_takeover(standby_ring):
    net = standby_ring
    record = {"home": "domain-03", "holder": "domain-04", "held": True, "epoch": 5, "taken_at": "2026-11-28T00:00:00Z"}
    with net.at("domain-02"):
        assert network_accept({"heard": {}, "takeovers": [record]}, sender="domain-03").changed == 1
        assert network_accept({"heard": {}, "takeovers": [{**record, "held": False, "epoch": 4}]},
                              sender="domain-03").changed == 0
        assert network_accept({"heard": {}, "takeovers": [{**record, "held": False, "epoch": 6}]},
                              sender="domain-03").changed == 1
    assert held_by(net, "domain-02") is None


def test_a_home_that_has_heard_from_no_other_domain_lately_is_cut_off(standby_ring):
    net = standby_ring
    with net.at("domain-03"):
        assert cut_off()  # just started: nothing heard yet
    heard(net, "domain-03", "domain-02", 1)
    with net.at("domain-03"):
        assert not cut_off()
    heard(net, "domain-03", "domain-02", 60)
    with net.at("domain-03"):
        assert cut_off()


def test_a_holder_stops_admitting_the_users_it_hands_back_for_a_grace_before_it_gives_their_mailboxes_up(
        standby_ring, settings):
    net = standby_ring
    settings.HAND_BACK_GRACE_SECONDS = 3
    net.send(ALICE, CAROL, "before")
    net.pump()
    copy_now(net)
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
        heard(net, "domain-04", "domain-01", 0)  # not cut off itself
        assert login(CAROL, net.app.app_id).ok
    net.down.clear()
    with net.at("domain-04"):
        assert hand_back("domain-03")["state"] == "closing"
        refused = login(CAROL, net.app.app_id)
        assert not refused.ok and refused.reason == "domain-04 is handing this user back to domain-03; retry"
        assert refused.retry  # closed with 1013: clients come back (1008 would end switchboard.js)
        assert login(DAVE, net.app.app_id).ok  # its own users are admitted as ever
        assert hand_back("domain-03")["state"] == "closing"  # the grace is not over
        Takeover.objects.update(returning_since=timezone.now() - timedelta(seconds=4))
        assert hand_back("domain-03")["state"] == "handed back"
        assert login(CAROL, net.app.app_id).reason == "user lives in domain-03; connect to that domain"  # home now
    assert mailbox(net, "domain-03") == [("before", "pending")]


def test_a_hand_back_is_given_up_when_the_home_falls_silent_again(standby_ring, settings):
    net = standby_ring
    settings.HAND_BACK_GRACE_SECONDS = 3
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
        assert hand_back("domain-03")["state"] == "closing"
    heard(net, "domain-04", "domain-03", 4)  # between two of its gossip rounds: the hand-back goes on
    with net.at("domain-04"):
        assert takeover_watch()["domain-03"] == "closing"
        assert Takeover.objects.get(home__name="domain-03").returning_since is not None
    heard(net, "domain-04", "domain-03", 60)  # silent again
    heard(net, "domain-04", "domain-01", 60)  # ... and so is everyone: domain-04 is cut off (it starts again)
    with net.at("domain-04"):
        fence_forget()
        takeover_watch()
        assert Takeover.objects.get(home__name="domain-03").returning_since is not None  # it cannot tell
    heard(net, "domain-04", "domain-01", 0)  # it hears the others, not domain-03
    with net.at("domain-04"):
        fence_forget()
        takeover_watch()
        assert Takeover.objects.get(home__name="domain-03").returning_since is None
        assert login(CAROL, net.app.app_id).ok  # admitted here again
    assert held_by(net, "domain-04") == "domain-04"


def test_a_held_home_keeps_its_mailbox_parked_and_forwards_what_it_stores_since_to_the_holder(standby_ring):
    net = standby_ring
    net.send("ANZ-3000008", CAROL, "before the takeover", at="domain-03")
    net.pump()
    copy_now(net)
    with net.at("domain-04"):
        take_over("domain-03", manual=True)  # planned maintenance: domain-03 is up
    with net.at("domain-03"):
        network_accept(told_by_04(net), sender="domain-04")
        frozen = Delivery.objects.get(recipient=CAROL)
        deliveries_route([frozen.id])  # a retry, a fetch: it stays in her mailbox here, parked
        frozen.refresh_from_db()
        assert (frozen.state, frozen.forward_to, frozen.next_attempt_at) == ("pending", "", None)
        # The test's one transaction stores everything at its start (now()): learned "before" that,
        # as it is when the next message is stored in a transaction of its own.
        Takeover.objects.update(learned_at=frozen.created_at - timedelta(seconds=1))
    net.send("ANZ-3000008", CAROL, "after the takeover", at="domain-03")
    net.pump()
    copy_now(net)
    with net.at("domain-03"):
        assert Delivery.objects.get(message__content="after the takeover").forward_to == "domain-04"
    assert mailbox(net, "domain-04") == [("before the takeover", "pending"), ("after the takeover", "pending")]


def test_a_message_the_home_took_while_its_answer_was_lost_is_held_once(standby_ring):
    net = standby_ring
    net.send(DAVE, CAROL, "answered, answer lost", at="domain-04")
    net.pump()
    copy_now(net)
    with net.at("domain-04"):  # as if the answer had been lost: the row still waits on the link
        Delivery.objects.filter(recipient=CAROL).update(state="forwarding", forward_to="domain-03")
    lost(net)
    with net.at("domain-04"):
        take_over("domain-03")
    assert mailbox(net, "domain-04") == [("answered, answer lost", "pending")]  # the copy's, once
    net.down.clear()
    with net.at("domain-04"):
        assert hand_back("domain-03")["state"] == "handed back"


def test_a_held_home_parks_what_its_holder_copies_back_and_never_forwards_it_back(standby_ring):
    net = standby_ring
    lost(net)
    with net.at("domain-04"):
        take_over("domain-03")
    net.send(DAVE, CAROL, "while held", at="domain-04")
    net.pump()
    net.down.clear()  # domain-03 is back, and has heard that domain-04 holds its users
    with net.at("domain-03"):
        network_accept(told_by_04(net), sender="domain-04")
        # learned before the copy comes (the test's one transaction has one now(): see above)
        Takeover.objects.update(learned_at=timezone.now() - timedelta(hours=1))
    copy_now(net, at="domain-04")
    with net.at("domain-03"):
        row = Delivery.objects.get(recipient=CAROL)
        assert (row.message.content, row.state, row.forward_to, row.next_attempt_at) == ("while held", "pending", "",
                                                                                          None)
    assert mailbox(net, "domain-04") == [("while held", "pending")]  # nothing came back round
