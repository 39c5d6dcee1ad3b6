"""A standby takes over exactly the ranges it stands by for (messaging.federation.takeover.take), on
the one-database ring, with domain-03's users split three ways:

    domain-01 ── domain-02      ANZ-3000000..3999999: standby domain-04 (CAROL)
        │            │          ANZ-4000000..4999999: standby domain-02 (ERIN)
    domain-04 ── domain-03      ANZ-5000000..5999999: no standby        (FRANK)

When domain-03 is lost, domain-04 serves CAROL and domain-02 serves ERIN, each with the copy of her
mailbox it holds, and both at once; FRANK waits for his home, as a user without a standby does.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps_registry.models import Domain, Takeover, UserDistribution
from apps_registry.selectors import app_snapshot, app_snapshots_clear
from apps_registry.services import distribution_create
from messaging.federation.models import StandbyCopy
from messaging.federation.takeover.records import network_accept, network_gossip
from messaging.federation.takeover.take import hand_back, takeover_watch
from messaging.models import Delivery
from messaging.routing.tasks import standby_sweep
from tests.messaging.federation.test_takeover import ALICE, heard, login, lost

pytestmark = pytest.mark.django_db

CAROL, ERIN, FRANK = "ANZ-3000007", "ANZ-4000007", "ANZ-5000007"  # all homed on 03


@pytest.fixture
def split_ring(net_ring):
    """domain-03's range in three: standby domain-04, standby domain-02, no standby."""
    home, d02, d04 = (Domain.objects.get(name=n) for n in ("domain-03", "domain-02", "domain-04"))
    UserDistribution.objects.filter(domain=home).update(range_to=3_999_999, standby=d04)
    distribution_create(app=net_ring.app, domain=home, range_from=4_000_000, range_to=4_999_999, standby=d02)
    distribution_create(app=net_ring.app, domain=home, range_from=5_000_000, range_to=5_999_999)
    app_snapshots_clear()
    return net_ring


def serving(net, at: str) -> dict[str, str]:
    """Where domain `at` sends each of the three users' logins and messages."""
    with net.at(at):
        app_snapshots_clear()
        app = app_snapshot("ANZ")
        return {user: app.home_of(user) for user in (CAROL, ERIN, FRANK)}


def mailboxes(net, at: str) -> dict[str, list[str]]:
    with net.at(at):
        return {user: list(Delivery.objects.filter(recipient=user, forward_to="").order_by("seq")
                           .values_list("message__content", flat=True))
                for user in (CAROL, ERIN, FRANK) if Delivery.objects.filter(recipient=user, forward_to="").exists()}


def tell(net, sender: str, *receivers: str) -> None:
    """`sender`'s gossip of the takeovers it holds reaches each receiver."""
    with net.at(sender):
        told = {"heard": {}, "takeovers": network_gossip()["takeovers"]}
    for receiver in receivers:
        with net.at(receiver):
            assert network_accept(told, sender=sender).refused == []


def test_each_standby_takes_over_only_the_ranges_it_stands_by_for_and_both_may_hold_one_home(split_ring):
    net = split_ring
    for user in (CAROL, ERIN, FRANK):
        net.send(ALICE, user, f"before, for {user}")
    net.pump()
    with net.at("domain-03"):
        standby_sweep()
    net.pump()
    with net.at("domain-04"):
        assert list(StandbyCopy.objects.values_list("recipient", flat=True)) == [CAROL]
    with net.at("domain-02"):
        assert list(StandbyCopy.objects.values_list("recipient", flat=True)) == [ERIN]
    lost(net)
    for standby in ("domain-02", "domain-04"):
        heard(net, standby, "domain-01", 0)  # not cut off themselves

    with net.at("domain-04"):
        assert takeover_watch() == {"domain-03": "taken"}
    tell(net, "domain-04", "domain-01", "domain-02")
    # domain-04 serves CAROL only: ERIN and FRANK stand by elsewhere or nowhere, and still live at home.
    assert serving(net, "domain-04") == {CAROL: "domain-04", ERIN: "domain-03", FRANK: "domain-03"}
    assert serving(net, "domain-01") == {CAROL: "domain-04", ERIN: "domain-03", FRANK: "domain-03"}
    with net.at("domain-04"):
        assert login(CAROL, net.app.app_id).ok
        refused = login(ERIN, net.app.app_id)
        assert not refused.ok and refused.reason == "user lives in domain-03; connect to that domain"
        assert not login(FRANK, net.app.app_id).ok

    # domain-02, ERIN's standby, takes hers over too: domain-04 holding CAROL's range is no obstacle.
    with net.at("domain-02"):
        assert takeover_watch() == {"domain-03": "taken"}
        assert login(ERIN, net.app.app_id).ok
    tell(net, "domain-02", "domain-01", "domain-04")
    tell(net, "domain-04", "domain-02")
    expected = {CAROL: "domain-04", ERIN: "domain-02", FRANK: "domain-03"}
    assert [serving(net, n) for n in ("domain-01", "domain-02", "domain-04")] == [expected] * 3
    assert mailboxes(net, "domain-04") == {CAROL: [f"before, for {CAROL}"]}
    assert mailboxes(net, "domain-02") == {ERIN: [f"before, for {ERIN}"]}

    # New messages go where each user is served; FRANK's waits for his home.
    for user in (CAROL, ERIN, FRANK):
        net.send(ALICE, user, f"during, for {user}")
    net.pump()
    assert mailboxes(net, "domain-04") == {CAROL: [f"before, for {CAROL}", f"during, for {CAROL}"]}
    assert mailboxes(net, "domain-02") == {ERIN: [f"before, for {ERIN}", f"during, for {ERIN}"]}

    # domain-03 returns; domain-04 gives CAROL back, and domain-02 still serves ERIN until it does too.
    net.down.discard("domain-03")
    for n in ("domain-02", "domain-04"):
        heard(net, n, "domain-03", 0)
    with net.at("domain-04"):
        assert hand_back("domain-03")["state"] == "closing"
        Takeover.objects.filter(holder__name="domain-04").update(
            returning_since=timezone.now() - timedelta(minutes=1))  # the grace is over
        assert hand_back("domain-03")["state"] == "handed back"
    net.pump()
    tell(net, "domain-04", "domain-01", "domain-02", "domain-03")
    net.pump()
    assert serving(net, "domain-01") == {CAROL: "domain-03", ERIN: "domain-02", FRANK: "domain-03"}
    with net.at("domain-02"):
        assert Takeover.objects.filter(home__name="domain-03", holder__name="domain-02", held=True).exists()
    assert mailboxes(net, "domain-04") == {}
    assert CAROL in mailboxes(net, "domain-03") and f"during, for {CAROL}" in mailboxes(net, "domain-03")[CAROL]


def test_the_console_and_metrics_show_each_standbys_takeover_of_a_home_and_each_hands_back_its_own(
        split_ring, operator, client):
    net = split_ring
    lost(net)
    for standby in ("domain-02", "domain-04"):
        heard(net, standby, "domain-01", 0)
        with net.at(standby):
            assert takeover_watch() == {"domain-03": "taken"}
    tell(net, "domain-02", "domain-01", "domain-04")
    tell(net, "domain-04", "domain-01", "domain-02")
    with net.at("domain-01"):
        page = operator.get("/admin/apps_registry/takeover/").content.decode()
        text = client.get("/metrics", REMOTE_ADDR="127.0.0.1").content.decode()
    assert "domain-02 (taken over)" in page and "domain-04 (taken over)" in page
    for holder in ("domain-02", "domain-04"):
        assert f'switchboard_takeover_held{{holder="{holder}",home="domain-03"}} 1.0' in text
        assert f'switchboard_takeover_last_taken_timestamp_seconds{{holder="{holder}",home="domain-03"}}' in text
    with net.at("domain-04"):  # the console's hand-back, asked at domain-04 for both rows
        ids = list(Takeover.objects.order_by("holder__name").values_list("pk", flat=True))
        answer = operator.post("/admin/apps_registry/takeover/", {"action": "hand_back_now", "_selected_action": ids},
                               follow=True).content.decode()
    assert "Domain-03: not held here (its holder is domain-02)" in answer
    assert "Domain-03: closing" in answer  # its own: domain-04 begins to hand carol back
    with net.at("domain-02"):
        assert Takeover.objects.get(holder__name="domain-02").returning_since is None  # erin's stay at domain-02
