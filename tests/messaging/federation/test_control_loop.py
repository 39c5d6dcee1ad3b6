"""The network's control rounds (gossip, takeover watch) run on threads of their own, on time, and a
takeover's "tell the neighbours now" wakes the gossip round here instead of queueing a task."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from foundation import handoff
from foundation.locks import lease
from messaging.federation import control_loop
from messaging.federation.control_loop import Round


def _counting_round(name: str, period: float) -> tuple[Round, list[float]]:
    ran: list[float] = []
    r = Round(name, lambda: ran.append(time.monotonic()), lambda: period)
    return r, ran


def _wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.01)


@pytest.mark.django_db
def test_a_round_runs_every_period_and_at_once_when_woken():
    r, ran = _counting_round("test-every", 0.2)
    r.thread.start()
    try:
        _wait_for(lambda: len(ran) >= 3)
        gaps = [b - a for a, b in zip(ran, ran[1:], strict=False)]
        assert all(0.15 < g < 1.0 for g in gaps[:2]), gaps
        slow, slow_ran = _counting_round("test-woken", 60.0)
        slow.thread.start()
        _wait_for(lambda: len(slow_ran) == 1)
        slow.wake.set()
        _wait_for(lambda: len(slow_ran) == 2, timeout=2.0)  # not a minute later
        slow.stopping.set(), slow.wake.set()
    finally:
        r.stopping.set(), r.wake.set()


@pytest.mark.django_db
def test_a_round_another_worker_is_running_is_skipped_here(settings):
    r, ran = _counting_round("test-leased", 0.05)
    with lease(f"{settings.DOMAIN_NAME}:test-leased", ttl=30) as held:
        assert held
        r.thread.start()
        _wait_for(lambda: r.rounds >= 3)
        assert ran == []  # looked, found the lease taken, skipped
    _wait_for(lambda: len(ran) >= 1)
    r.stopping.set(), r.wake.set()


@pytest.mark.django_db
def test_gossip_now_wakes_the_round_of_this_process_and_queues_a_task_only_where_none_runs(monkeypatch):
    dispatched: list[str] = []
    monkeypatch.setattr(handoff._dispatcher, "dispatch", lambda task, *a, **k: dispatched.append(task))
    handoff.gossip_now()
    assert dispatched == [handoff.GOSSIP_TASK]
    woken = threading.Event()
    monkeypatch.setattr(control_loop, "_loop", type("L", (), {"gossip": type("G", (), {"wake": woken})()})())
    handoff.gossip_here_set(control_loop.gossip_wake)
    try:
        handoff.gossip_now()
    finally:
        handoff.gossip_here_set(None)
    assert woken.is_set() and dispatched == [handoff.GOSSIP_TASK]


# --- a domain speaks for itself only while it serves ----------------------------------------------


class _Healthz(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        body = b'{"status": "ok"}'
        self.send_response(200 if self.path == "/healthz" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.django_db
def test_a_domain_tells_its_own_clock_only_while_its_address_answers(settings):
    from apps_registry.models import Domain
    from messaging.federation.takeover.liveness import domain_serves
    from messaging.federation.takeover.records import network_gossip

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Healthz)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    here = Domain.objects.update_or_create(name=settings.DOMAIN_NAME, defaults={
        "urls": [f"ws://127.0.0.1:{port}/ws", f"http://127.0.0.1:{port}"]})[0]
    try:
        assert domain_serves()
        assert settings.DOMAIN_NAME in network_gossip(speaking=domain_serves())["heard"]
    finally:
        server.shutdown()
        server.server_close()
    # Its workers are up, its web nodes not (yet): it tells what it heard of the others, not itself.
    assert not domain_serves()
    assert settings.DOMAIN_NAME not in network_gossip(speaking=domain_serves())["heard"]
    here.urls = []
    here.save()
    assert domain_serves()  # no address to ask: as before


@pytest.mark.django_db
def test_the_live_copy_goes_out_from_the_control_loop_with_no_task_on_the_queue(standby_ring):
    from messaging.federation.models import StandbyCopy, StandbyFeed
    from tests.messaging.federation.test_takeover import ALICE, CAROL

    net = standby_ring
    net.send(ALICE, CAROL, "copied from the round")
    net.pump()  # routed to carol's home, domain-03, whose feed to domain-04 now holds the change
    with net.at("domain-03"):
        assert StandbyFeed.objects.filter(standby="domain-04").exists()
        assert control_loop.copy_round() == ["domain-04"]
        assert not StandbyFeed.objects.exists()
    with net.at("domain-04"):
        assert list(StandbyCopy.objects.values_list("content", flat=True)) == ["copied from the round"]
    assert net.waiting(handoff.STANDBY_TASK) == []  # nothing was queued for it
