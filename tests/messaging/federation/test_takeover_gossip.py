"""Who may tell a domain that a home's users are served elsewhere (messaging.federation.takeover.records,
`record_refusal`), on the one-database ring: domain-03's users stand by on domain-04.

    domain-01 ── domain-02
        │            │
    domain-04 ── domain-03      CAROL is homed on 03, standing by on 04

A neighbour's gossip may move a home's users only to the home's standby, never tells the standby
what it holds, and cannot push an epoch so far ahead that genuine records stop winning.
"""

from __future__ import annotations

import json
import time

import pytest
from django.test import Client

from apps_registry.models import Domain, Takeover
from apps_registry.selectors import app_snapshot, app_snapshots_clear
from foundation import signed_calls
from messaging.federation.presence_gossip import presence_gossip
from messaging.federation.takeover.records import network_accept, network_gossip
from messaging.federation.takeover.take import hand_back, take_over
from messaging.federation.wire.transport import FORWARD_PATH
from tests.messaging.federation.test_takeover import CAROL, held_by, lost

pytestmark = pytest.mark.django_db

BIGINT_MAX = 2**63 - 1


def record(*, holder: str = "domain-04", held: bool = True, epoch: int | None = None) -> dict:
    return {"home": "domain-03", "holder": holder, "held": held,
            "epoch": time.time_ns() // 1000 if epoch is None else epoch, "taken_at": "2026-11-28T00:00:00Z"}


def told(net, at: str, sender: str, *records: dict) -> dict:
    """A signed forwarding call from `sender` to `at` carrying `records`, through `at`'s view: its answer."""
    body = json.dumps({"network": {"takeovers": list(records)}}).encode()
    headers = signed_calls.signed_headers(secret=net.link_of(at, sender).shared_secret, sender=sender, method="POST",
                                          path=FORWARD_PATH, body=body)
    with net.at(at):
        answer = Client().post(FORWARD_PATH, data=body, content_type="application/json", headers=headers)
    assert answer.status_code == 200, answer.content
    return answer.json()


def home_of_carol(net, at: str) -> str:
    with net.at(at):
        app_snapshots_clear()
        return app_snapshot("ANZ").home_of(CAROL)


def test_a_neighbour_cannot_move_a_homes_users_to_a_domain_that_is_not_their_standby(standby_ring):
    net = standby_ring
    answer = told(net, "domain-02", "domain-01", record(holder="domain-01"))
    assert held_by(net, "domain-02") is None
    assert home_of_carol(net, "domain-02") == "domain-03"  # her messages still go home
    assert answer["takeovers_refused"] == [
        {"index": 0, "reason": "domain-01 is not a standby of domain-03's users here"}]


def test_a_home_cannot_be_said_to_hold_its_own_users(standby_ring):
    net = standby_ring
    answer = told(net, "domain-02", "domain-03", record(holder="domain-03"))
    assert held_by(net, "domain-02") is None
    assert answer["takeovers_refused"] == [{"index": 0, "reason": "domain-03 cannot hold its own users"}]


def test_no_neighbour_tells_the_standby_which_users_it_holds(standby_ring):
    net = standby_ring
    answer = told(net, "domain-04", "domain-01", record())  # "you hold domain-03's users" (it never took them)
    assert held_by(net, "domain-04") is None
    assert answer["takeovers_refused"] == [
        {"index": 0, "reason": "only domain-04 records which users domain-04 holds"}]
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
    answer = told(net, "domain-04", "domain-01", record(held=False, epoch=time.time_ns() // 1000 + 10**6))
    assert held_by(net, "domain-04") == "domain-04"  # a forged hand-back gives nothing away
    assert answer["takeovers_refused"][0]["reason"] == "only domain-04 records which users domain-04 holds"


def test_the_standbys_genuine_record_is_taken_from_any_neighbour_that_relays_it(standby_ring):
    net = standby_ring
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
        genuine = network_gossip()["takeovers"]
    with net.at("domain-01"):  # from its holder
        assert network_accept({"heard": {}, "takeovers": genuine}, sender="domain-04").changed == 1
    answer = told(net, "domain-02", "domain-01", *genuine)  # relayed by a third domain
    assert "takeovers_refused" not in answer
    assert held_by(net, "domain-02") == "domain-04"


def test_an_epoch_of_2_63_minus_1_is_refused_and_the_standby_still_takes_over_and_hands_back(standby_ring):
    net = standby_ring
    at_standby = told(net, "domain-04", "domain-01", record(held=False, epoch=BIGINT_MAX))
    at_neighbour = told(net, "domain-01", "domain-04", record(epoch=BIGINT_MAX))
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"
        genuine = network_gossip()["takeovers"]
    assert at_standby["takeovers_refused"] == [{"index": 0, "reason": (
        f"epoch {BIGINT_MAX} is more than 300 s ahead of domain-04's clock (an epoch is its writer's clock in "
        "microseconds)")}]
    assert at_neighbour["takeovers_refused"][0]["reason"].startswith(f"epoch {BIGINT_MAX} is more than 300 s ahead")
    assert "takeovers_refused" not in told(net, "domain-01", "domain-04", *genuine)
    assert held_by(net, "domain-01") == "domain-04"
    net.down.clear()
    with net.at("domain-04"):
        assert hand_back("domain-03")["state"] == "handed back"
        back = network_gossip()["takeovers"]
    assert back[0]["epoch"] > genuine[0]["epoch"]
    told(net, "domain-01", "domain-04", *back)
    assert held_by(net, "domain-01") is None


def test_a_row_stored_with_an_epoch_far_ahead_before_the_rule_wedges_nothing(standby_ring):
    net = standby_ring
    for at in ("domain-01", "domain-04"):  # what an earlier version took from a neighbour's gossip
        with net.at(at):
            Takeover.objects.create(home=Domain.objects.get(name="domain-03"), holder=Domain.objects.get(name="domain-04"),
                                    held=False, epoch=BIGINT_MAX, taken_at="2026-11-28T00:00:00Z")
    lost(net)
    with net.at("domain-04"):
        assert take_over("domain-03")["state"] == "taken"  # its next epoch is its clock's, not 2^63
        genuine = network_gossip()["takeovers"]
    assert genuine[0]["epoch"] < BIGINT_MAX
    told(net, "domain-01", "domain-04", *genuine)
    assert held_by(net, "domain-01") == "domain-04"  # the genuine record replaces the impossible one


def test_the_domain_whose_gossip_is_refused_logs_which_neighbour_refused_what(standby_ring, caplog):
    net = standby_ring
    with net.at("domain-01"):  # a record domain-01 should never have taken (an earlier version took anything)
        Takeover.objects.create(home=Domain.objects.get(name="domain-03"), holder=Domain.objects.get(name="domain-01"),
                                held=True, epoch=time.time_ns() // 1000, taken_at="2026-11-28T00:00:00Z")
        assert presence_gossip() == {"domain-02": "ok", "domain-04": "ok"}
    refusals = [r.getMessage() for r in caplog.records if "refused takeover records" in r.getMessage()]
    assert refusals[0].startswith("domain-02 refused takeover records domain-01 told it: [{'index': 0, 'reason': "
                                  "\"domain-01 is not a standby of domain-03's users here\"}]")
    assert held_by(net, "domain-02") is None
