"""A neighbour that is slow rather than down, over real HTTP (messaging.federation.wire.transport.HttpWire):
every call to it ends at its deadline, whatever it sends, and the link's sender lets go of the link."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from apps_registry.models import Domain
from foundation.handoff import ROUTE_TASK
from foundation.locks import lock_held_elsewhere
from messaging.federation.models import LinkHealth
from messaging.federation.senders.outbox import link_forward, link_lock_key
from messaging.federation.wire.transport import MAX_ANSWER_BYTES, HttpWire, wire_use
from messaging.models import Delivery
from tests.neighbour import FakeNeighbour, wait_until

pytestmark = pytest.mark.django_db

NEAR = "ANZ-1000005"  # homed in domain-02


@pytest.fixture
def over_http(net, settings):
    """domain-01 of the harness, calling domain-02 over real HTTP."""
    settings.FORWARD_TIMEOUT_SECONDS = 2.0
    previous = wire_use(HttpWire())
    yield net
    wire_use(previous)


def queued(net, n: int = 3) -> list[int]:
    ids = [net.send("ANZ-17", NEAR, f"m{i}") for i in range(n)]
    net.pump(only=ROUTE_TASK)  # routed: queued on the link to domain-02, its sender not woken yet
    return ids


def test_a_neighbour_answering_one_byte_a_second_is_cut_off_at_the_deadline_and_the_link_is_let_go(over_http):
    with FakeNeighbour(drip_every=1.0) as dripping:
        Domain.objects.filter(name="domain-02").update(urls=[dripping.url])
        queued(over_http)
        seen_held: list[bool] = []

        def watch() -> None:
            wait_until(lambda: dripping.requests, 5)
            seen_held.append(lock_held_elsewhere(link_lock_key("domain-02")))
            connection.close()

        watcher = threading.Thread(target=watch)
        watcher.start()
        started = time.monotonic()
        outcome = link_forward(peer="domain-02")
        elapsed = time.monotonic() - started
        watcher.join(5)
    assert seen_held == [True]  # held while the call was in flight
    assert outcome["error"] == "domain-02: no answer within 2 s" and outcome["failed"] == 3
    assert 2.0 <= elapsed < 3.5  # the deadline bounds the whole exchange, not each read
    assert not lock_held_elsewhere(link_lock_key("domain-02"))
    rows = Delivery.objects.filter(recipient=NEAR)
    assert {(r.state, r.attempts, r.last_error) for r in rows} == {
        ("forwarding", 1, "forwarding to domain-02 failed: no answer within 2 s")}
    assert LinkHealth.objects.get(peer="domain-02").up is False


def test_an_answer_larger_than_the_cap_is_a_failed_call_not_a_read_of_any_size(over_http):
    with FakeNeighbour(answer={"stored": 3, "padding": "x" * (MAX_ANSWER_BYTES + 10)}) as verbose:
        Domain.objects.filter(name="domain-02").update(urls=[verbose.url])
        queued(over_http)
        outcome = link_forward(peer="domain-02")
    assert outcome["failed"] == 3 and f"more than {MAX_ANSWER_BYTES} bytes" in outcome["error"]
    assert not lock_held_elsewhere(link_lock_key("domain-02"))


def test_a_neighbour_that_never_answers_costs_one_deadline_and_the_queue_waits_in_order(over_http):
    with FakeNeighbour(delay=60) as silent:
        Domain.objects.filter(name="domain-02").update(urls=[silent.url])
        sent = queued(over_http)
        started = time.monotonic()
        outcome = link_forward(peer="domain-02")
        assert time.monotonic() - started < 3.5
    assert outcome["error"] == "domain-02: no answer within 2 s"
    assert link_forward(peer="domain-02")["skipped"] == "held back"
    waiting = Delivery.objects.filter(recipient=NEAR).order_by("seq")
    assert [d.message_id for d in waiting] == sent and {d.state for d in waiting} == {"forwarding"}
