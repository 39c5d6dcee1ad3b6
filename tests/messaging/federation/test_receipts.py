"""Receipts end: a receipt carries the domains it passed through, never goes back to one of them,
and waits (on a table) while its origin cannot be reached; played on the seed's four-domain ring."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from messaging.core.delivery.receipt_queue import receipts_queue_items
from messaging.federation.links import link_failed
from messaging.federation.models import LinkHealth, ReceiptForward
from messaging.federation.senders.queue import forward_sweep
from messaging.federation.wire.transport import FORWARD_PATH

pytestmark = pytest.mark.django_db

AT_01, AT_03 = "ANZ-17", "ANZ-3000001"  # homed in domain-01 and domain-03
DOMAINS = ("domain-01", "domain-02", "domain-03", "domain-04")


def down_for_long(net, here: str, peer: str) -> None:
    """`here` has not reached `peer` for longer than LINK_DOWN_AFTER_SECONDS."""
    with net.at(here):
        link_failed(peer=peer, error=f"{peer}: connection refused")
        LinkHealth.objects.filter(peer=peer).update(down_since=timezone.now() - timedelta(hours=1))


def receipt_calls(net, a: str, b: str) -> int:
    """Calls carrying receipts from `a` to `b` so far."""
    return sum(1 for c in net.calls if (c.sender, c.peer, c.path) == (a, b, FORWARD_PATH) and c.payload.get("receipts"))


def every_domain_sweeps(net, rounds: int) -> None:
    """The beat's forward sweep at every domain, each link's backoff over, `rounds` times."""
    for _ in range(rounds):
        for domain in DOMAINS:
            with net.at(domain):
                LinkHealth.objects.update(retry_at=None)
                forward_sweep()
        net.pump()


def test_receipts_whose_origin_is_away_wait_instead_of_circulating_and_arrive_when_it_returns(net_ring):
    sent = [net_ring.send(AT_03, AT_01, f"m{i}", at="domain-03") for i in range(5)]
    net_ring.pump()
    assert len(net_ring.mailbox("domain-01", AT_01)) == 5
    net_ring.down.add("domain-03")  # stopped
    for neighbour in ("domain-02", "domain-04"):
        down_for_long(net_ring, neighbour, "domain-03")
    net_ring.deliver(AT_01, at="domain-01")  # the domain-01 user fetches them
    net_ring.pump()
    every_domain_sweeps(net_ring, rounds=5)
    # One call took the receipts from domain-01 to domain-02; none came back, none went round.
    assert receipt_calls(net_ring, "domain-01", "domain-02") == 1
    assert receipt_calls(net_ring, "domain-02", "domain-01") == 0
    assert receipt_calls(net_ring, "domain-01", "domain-04") == 0
    with net_ring.at("domain-02"):
        waiting = list(ReceiptForward.objects.values_list("peer", "path"))
    assert waiting == [("domain-03", "domain-01,domain-02")] * 5  # waiting on the way forward
    net_ring.down.discard("domain-03")  # back
    every_domain_sweeps(net_ring, rounds=1)
    with net_ring.at("domain-03"):
        from messaging.models import Delivery

        states = list(Delivery.objects.filter(message_id__in=sent).values_list("state", flat=True))
    assert states == ["delivered"] * 5


def test_a_receipt_is_never_queued_back_to_a_domain_it_passed_through(net_ring):
    down_for_long(net_ring, "domain-02", "domain-03")
    receipt = {"origin_domain": "domain-03", "origin_message_id": 7, "recipient": AT_01, "state": "delivered",
               "at": timezone.now().isoformat(), "domain": "domain-01", "error": "", "path": ["domain-01"]}
    with net_ring.at("domain-02"):
        receipts_queue_items([receipt])
        [(peer, path)] = ReceiptForward.objects.values_list("peer", "path")
    # The way round (back through domain-01, then domain-04) is not taken: it waits on its down link.
    assert (peer, path) == ("domain-03", "domain-01,domain-02")


def test_a_receipt_past_the_hop_limit_is_applied_but_not_passed_on(net_ring, settings):
    settings.FORWARD_HOP_LIMIT = 2
    receipt = {"origin_domain": "domain-03", "origin_message_id": 7, "recipient": AT_01, "state": "delivered",
               "at": timezone.now().isoformat(), "domain": "domain-01", "error": "",
               "path": ["domain-01", "domain-04"]}
    with net_ring.at("domain-02"):
        assert receipts_queue_items([receipt]) == 0
        assert not ReceiptForward.objects.exists()
