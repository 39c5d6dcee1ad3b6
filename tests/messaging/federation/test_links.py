"""Routing around trouble and each link's health (messaging.federation.links, probes), on the seed's
four-domain ring played from domain-01."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from apps_registry.models import Domain
from foundation.handoff import FLOOD_TASK, FORWARD_LINK_TASK, FORWARD_RECEIPTS_TASK, STANDBY_TASK
from foundation.outgoing import Answer, OutgoingError
from messaging.core.next_hop import links_down, next_hop
from messaging.federation.links import link_failed, link_held_back, link_received, link_succeeded
from messaging.federation.models import LinkHealth
from messaging.federation.wire import probes
from messaging.federation.wire.transport import HttpWire, wire_use
from tests.neighbour import FakeNeighbour
from tests.network import OneByOneWire

pytestmark = pytest.mark.django_db


def down_for(peer: str, seconds: float) -> None:
    """The link to `peer` has failed since `seconds` ago."""
    link_failed(peer=peer, error=f"{peer}: connection refused")
    LinkHealth.objects.filter(peer=peer).update(down_since=timezone.now() - timedelta(seconds=seconds))


# --- next_hop ------------------------------------------------------------------------------------


def test_the_next_hop_is_the_first_step_of_the_shortest_path(net_ring):
    with net_ring.at("domain-01"):
        assert next_hop("domain-02") == "domain-02"
        assert next_hop("domain-04") == "domain-04"
        assert next_hop("domain-03") in ("domain-02", "domain-04")  # two hops either way round


def test_a_disabled_link_is_routed_around(net_ring):
    net_ring.disable("domain-01", "domain-02")
    with net_ring.at("domain-01"):
        assert next_hop("domain-02") == "domain-04"  # 01 -> 04 -> 03 -> 02
    with net_ring.at("domain-04"):
        assert next_hop("domain-02", visited=["domain-01"]) == "domain-03"


def test_a_link_down_past_the_threshold_is_routed_around(net_ring, settings):
    settings.LINK_DOWN_AFTER_SECONDS = 15
    with net_ring.at("domain-01"):
        down_for("domain-02", 16)
        assert links_down() == {"domain-02"}
        assert next_hop("domain-02") == "domain-04"


def test_a_link_down_for_less_than_the_threshold_is_still_used(net_ring, settings):
    settings.LINK_DOWN_AFTER_SECONDS = 15
    with net_ring.at("domain-01"):
        down_for("domain-02", 3)
        assert links_down() == set()
        assert next_hop("domain-02") == "domain-02"  # waits on its own link: a blip is not a detour


def test_a_link_that_answers_again_is_used_again_at_once(net_ring):
    with net_ring.at("domain-01"):
        down_for("domain-02", 60)
        assert next_hop("domain-02") == "domain-04"
        link_succeeded(peer="domain-02")
        assert next_hop("domain-02") == "domain-02"


def test_domains_already_passed_through_are_never_chosen(net_ring):
    with net_ring.at("domain-04"):
        # An item 01 handed to 04 for 02 (01's link to 02 being down) goes on via 03, not back to 01.
        assert next_hop("domain-02") == "domain-01"
        assert next_hop("domain-02", visited=["domain-01"]) == "domain-03"


def test_with_no_other_path_the_down_link_is_kept(net_ring):
    net_ring.disable("domain-03", "domain-04")
    with net_ring.at("domain-01"):
        down_for("domain-02", 60)
        # 01 -> 04 leads nowhere but back: the item waits on the link to 02, retried there.
        assert next_hop("domain-02") == "domain-02"
        assert next_hop("domain-03") == "domain-02"


def test_with_only_visited_domains_left_the_way_back_is_taken_rather_than_none(net_ring):
    net_ring.disable("domain-02", "domain-03")
    with net_ring.at("domain-04"):
        assert next_hop("domain-02", visited=["domain-01"]) == "domain-01"


def test_an_unreachable_or_unknown_domain_has_no_next_hop(net_ring):
    Domain.objects.create(name="domain-09")
    with net_ring.at("domain-01"):
        assert next_hop("domain-09") is None
        assert next_hop("domain-77") is None
    net_ring.disable("domain-01", "domain-02")
    net_ring.disable("domain-01", "domain-04")
    with net_ring.at("domain-01"):
        assert next_hop("domain-03") is None


# --- health --------------------------------------------------------------------------------------


def test_a_link_is_down_since_its_first_failure_in_a_row_and_backs_off(net_ring, settings):
    settings.FORWARD_RETRY_BASE_SECONDS, settings.FORWARD_RETRY_MAX_SECONDS = 1.0, 4.0
    first = link_failed(peer="domain-02", error="domain-02: connection refused")
    later = link_failed(peer="domain-02", error="domain-02: no answer within 5 s")
    assert (later.up, later.down_since, later.failures) == (False, first.down_since, 2)
    assert later.last_error == "domain-02: no answer within 5 s"
    for _ in range(5):
        later = link_failed(peer="domain-02", error="again")
    assert later.retry_at - later.last_failure_at <= timedelta(seconds=4 * 1.2)  # capped, with jitter
    link_succeeded(peer="domain-02", forwarded=3)
    link_received(peer="domain-02", count=2)
    health = LinkHealth.objects.get(peer="domain-02")
    assert (health.up, health.down_since, health.failures, health.retry_at) == (True, None, 0, None)
    assert (health.forwarded_out, health.forwarded_in, health.last_error) == (3, 2, "again")


# --- probes --------------------------------------------------------------------------------------


class PingWire(OneByOneWire):
    """Pings answered from a table: peer -> the domain name it answers as, or an error; a peer not
    in the table answers as itself."""

    def __init__(self):
        self.answers: dict[str, str | Exception] = {}

    def post(self, call, *, deadline):
        answer = self.answers.get(call.peer, call.peer)
        if isinstance(answer, Exception):
            raise answer
        return Answer(200, json.dumps({"domain": answer}).encode(), complete=True)


@pytest.fixture
def pings(net_ring):
    wire = PingWire()
    previous = wire_use(wire)
    yield wire.answers
    wire_use(previous)


def test_a_probe_pings_every_neighbour_over_an_enabled_link_and_records_its_state(net_ring, pings):
    net_ring.disable("domain-01", "domain-04")
    pings["domain-02"] = OutgoingError("cannot connect to domain-02: [Errno 111] Connection refused")
    with net_ring.at("domain-01"):
        results = probes.links_probe()
    assert [(r.peer, r.ok, r.error) for r in results] == [("domain-02", False, "domain-02: connection refused")]
    assert not LinkHealth.objects.filter(peer="domain-04").exists()  # disabled: not probed
    assert LinkHealth.objects.get(peer="domain-02").up is False
    del pings["domain-02"]
    with net_ring.at("domain-01"):
        [result] = probes.links_probe()
    assert result.ok and result.recovered
    assert LinkHealth.objects.get(peer="domain-02").up is True
    # Its queues go now, not at their next retry: deliveries, channel publishes, receipts, standby copies.
    assert [(h.task, h.args) for h in net_ring.waiting()] == [
        (FORWARD_LINK_TASK, ["domain-02"]), (FLOOD_TASK, ["domain-02"]), (FORWARD_RECEIPTS_TASK, ["domain-02"]),
        (STANDBY_TASK, ["domain-02"])]


def test_an_answered_probe_never_clears_the_backoff_a_failing_send_earned(net_ring, pings):
    # domain-02 answers pings but failed the link's last call (it erred on the batch): the batch
    # waits for the retry it earned instead of being sent, and its rows' attempts used, at each probe.
    with net_ring.at("domain-01"):
        link_failed(peer="domain-02", error="domain-02 answered 500: domain-02 failed to take the call", answered=True)
        [result] = [r for r in probes.links_probe() if r.peer == "domain-02"]
        health = LinkHealth.objects.get(peer="domain-02")
        assert result.ok and result.held_back and not result.recovered
        assert link_held_back("domain-02") and (health.up, health.failures) == (False, 1)
        assert net_ring.waiting() == []  # nothing sent at the probe
        assert "answers pings, its calls failed" in probes_state("domain-02")
        link_succeeded(peer="domain-02")  # the retry's call goes through
        assert not link_held_back("domain-02")


def test_an_answered_probe_clears_the_backoff_of_a_neighbour_that_was_out_of_reach(net_ring, pings):
    with net_ring.at("domain-01"):
        link_failed(peer="domain-02", error="domain-02: connection refused")  # a send, while it was down
        [result] = [r for r in probes.links_probe() if r.peer == "domain-02"]
        assert result.ok and result.recovered and not link_held_back("domain-02")
        assert (FORWARD_LINK_TASK, ["domain-02"]) in [(h.task, h.args) for h in net_ring.waiting()]


def probes_state(peer: str) -> str:
    from messaging.federation.selectors import link_states

    return {s.peer: s.text() for s in link_states()}[peer]


def test_a_ping_answered_by_another_domain_is_a_failure(net_ring, pings):
    pings["domain-02"] = "domain-07"
    with net_ring.at("domain-01"):
        results = {r.peer: r for r in probes.links_probe()}
    assert not results["domain-02"].ok and "answered by domain-07" in results["domain-02"].error
    assert results["domain-04"].ok


def test_a_probe_is_answered_by_the_neighbours_own_ping_endpoint(net_ring):
    net_ring.down.add("domain-04")
    with net_ring.at("domain-01"):
        results = {r.peer: r for r in probes.links_probe()}
    assert results["domain-02"].ok and not results["domain-04"].ok
    assert [(c.sender, c.peer, c.path) for c in net_ring.calls] == [
        ("domain-01", "domain-02", "/internal/v1/ping"), ("domain-01", "domain-04", "/internal/v1/ping")]


def test_the_neighbours_are_pinged_at_once_over_http_so_a_dead_one_does_not_hold_up_the_others(net_ring, settings):
    settings.LINK_PROBE_TIMEOUT_SECONDS = 0.6
    previous = wire_use(HttpWire())
    try:
        with FakeNeighbour(answer={"domain": "domain-04"}, delay=0.4) as slow, FakeNeighbour(delay=30) as dead:
            Domain.objects.filter(name="domain-02").update(urls=[dead.url])
            Domain.objects.filter(name="domain-04").update(urls=[slow.url])
            with net_ring.at("domain-01"):
                started = time.monotonic()
                results = probes.links_probe()
                elapsed = time.monotonic() - started
    finally:
        wire_use(previous)
    assert [(r.peer, r.ok) for r in results] == [("domain-02", False), ("domain-04", True)]
    assert results[0].error == "domain-02: no answer within 0.6 s"
    assert elapsed < 0.95  # one after the other would take 0.4 + 0.6 s
