"""Routing around trouble and each link's health (messaging.network.links, probes), on the seed's
four-domain ring played from domain-01."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps_registry.models import Domain, DomainLink
from messaging.network import probes
from messaging.network.links import link_failed, link_received, link_succeeded, links_down, next_hop
from messaging.network.models import LinkHealth
from messaging.network.transport import PeerError
from tests.messaging.network.one_db_ring import as_domain, link

pytestmark = pytest.mark.django_db


def down_for(peer: str, seconds: float) -> None:
    """The link to `peer` has failed since `seconds` ago."""
    link_failed(peer=peer, error=f"{peer}: connection refused")
    LinkHealth.objects.filter(peer=peer).update(down_since=timezone.now() - timedelta(seconds=seconds))


def disable(links, a: str, b: str) -> None:
    DomainLink.objects.filter(pk=link(links, a, b).pk).update(enabled=False)


# --- next_hop ------------------------------------------------------------------------------------


def test_the_next_hop_is_the_first_step_of_the_shortest_path(ring):
    with as_domain("domain-01"):
        assert next_hop("domain-02") == "domain-02"
        assert next_hop("domain-04") == "domain-04"
        assert next_hop("domain-03") in ("domain-02", "domain-04")  # two hops either way round


def test_a_disabled_link_is_routed_around(ring):
    disable(ring, "domain-01", "domain-02")
    with as_domain("domain-01"):
        assert next_hop("domain-02") == "domain-04"  # 01 -> 04 -> 03 -> 02
    with as_domain("domain-04"):
        assert next_hop("domain-02", visited=["domain-01"]) == "domain-03"


def test_a_link_down_past_the_threshold_is_routed_around(ring, settings):
    settings.LINK_DOWN_AFTER_SECONDS = 15
    with as_domain("domain-01"):
        down_for("domain-02", 16)
        assert links_down() == {"domain-02"}
        assert next_hop("domain-02") == "domain-04"


def test_a_link_down_for_less_than_the_threshold_is_still_used(ring, settings):
    settings.LINK_DOWN_AFTER_SECONDS = 15
    with as_domain("domain-01"):
        down_for("domain-02", 3)
        assert links_down() == set()
        assert next_hop("domain-02") == "domain-02"  # waits on its own link: a blip is not a detour


def test_a_link_that_answers_again_is_used_again_at_once(ring):
    with as_domain("domain-01"):
        down_for("domain-02", 60)
        assert next_hop("domain-02") == "domain-04"
        link_succeeded(peer="domain-02")
        assert next_hop("domain-02") == "domain-02"


def test_domains_already_passed_through_are_never_chosen(ring):
    with as_domain("domain-04"):
        # An item 01 handed to 04 for 02 (01's link to 02 being down) goes on via 03, not back to 01.
        assert next_hop("domain-02") == "domain-01"
        assert next_hop("domain-02", visited=["domain-01"]) == "domain-03"


def test_with_no_other_path_the_down_link_is_kept(ring):
    disable(ring, "domain-03", "domain-04")
    with as_domain("domain-01"):
        down_for("domain-02", 60)
        # 01 -> 04 leads nowhere but back: the item waits on the link to 02, retried there.
        assert next_hop("domain-02") == "domain-02"
        assert next_hop("domain-03") == "domain-02"


def test_with_only_visited_domains_left_the_way_back_is_taken_rather_than_none(ring):
    disable(ring, "domain-02", "domain-03")
    with as_domain("domain-04"):
        assert next_hop("domain-02", visited=["domain-01"]) == "domain-01"


def test_an_unreachable_or_unknown_domain_has_no_next_hop(ring):
    Domain.objects.create(name="domain-09")
    with as_domain("domain-01"):
        assert next_hop("domain-09") is None
        assert next_hop("domain-77") is None
    disable(ring, "domain-01", "domain-02")
    disable(ring, "domain-01", "domain-04")
    with as_domain("domain-01"):
        assert next_hop("domain-03") is None


# --- health --------------------------------------------------------------------------------------


def test_a_link_is_down_since_its_first_failure_in_a_row_and_backs_off(ring, settings):
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


@pytest.fixture
def pings(monkeypatch):
    """The probes' pings, answered by the table `answers` (peer -> domain name, or an error)."""
    answers: dict[str, str | Exception] = {}

    def send(call, *, timeout=None):
        answer = answers.get(call.peer, call.peer)
        if isinstance(answer, Exception):
            raise answer
        return {"domain": answer}

    monkeypatch.setattr(probes, "peer_call_send", send)
    return answers


def test_a_probe_pings_every_neighbour_over_an_enabled_link_and_records_its_state(ring, pings, monkeypatch):
    recovered = []
    monkeypatch.setattr(probes.handoff, "link_recovered_enqueue", recovered.append)
    disable(ring, "domain-01", "domain-04")
    pings["domain-02"] = PeerError("domain-02: connection refused")
    with as_domain("domain-01"):
        results = probes.links_probe()
    assert [(r.peer, r.ok, r.error) for r in results] == [("domain-02", False, "domain-02: connection refused")]
    assert not LinkHealth.objects.filter(peer="domain-04").exists()  # disabled: not probed
    assert LinkHealth.objects.get(peer="domain-02").up is False
    del pings["domain-02"]
    with as_domain("domain-01"):
        [result] = probes.links_probe()
    assert result.ok and result.recovered
    assert LinkHealth.objects.get(peer="domain-02").up is True
    assert recovered == ["domain-02"]  # its queues go now, not at their next retry


def test_a_ping_answered_by_another_domain_is_a_failure(ring, pings):
    pings["domain-02"] = "domain-07"
    with as_domain("domain-01"):
        results = {r.peer: r for r in probes.links_probe()}
    assert not results["domain-02"].ok and "answered by domain-07" in results["domain-02"].error
    assert results["domain-04"].ok


def test_the_neighbours_are_pinged_in_parallel_so_a_dead_one_does_not_hold_up_the_others(ring, monkeypatch):
    import time

    def send(call, *, timeout=None):
        time.sleep(0.5)
        if call.peer == "domain-02":
            raise PeerError("domain-02: no answer within 0.5 s")
        return {"domain": call.peer}

    monkeypatch.setattr(probes, "peer_call_send", send)
    with as_domain("domain-01"):
        started = time.monotonic()
        results = probes.links_probe()
        elapsed = time.monotonic() - started
    assert [r.ok for r in results] == [False, True]
    assert elapsed < 0.9  # one at a time would take 1 s
