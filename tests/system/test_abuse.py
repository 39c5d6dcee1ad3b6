"""Hostile clients against a real web node: a reader that stops reading, an ACK flood and a
GROUP_MESSAGE flood, all at once. The node's memory stays bounded and a well-behaved client keeps
its latency.

Stated bounds (on this two-core machine, everything on one host):
- the web node's RSS grows by less than RSS_GROWTH_LIMIT_MB while under attack;
- a well-behaved client's p95 round trip under attack stays within LATENCY_FACTOR times its p95
  before the attack (plus LATENCY_SLACK_MS: at a 10 ms baseline, scheduling noise alone moves it).
"""

from __future__ import annotations

import threading
import time

import psutil
import pytest
from django.db.models import Count
from websockets.exceptions import ConnectionClosed

from messaging.core.store import OutgoingMessage, messages_store
from messaging.models import Delivery
from tests.wsclient import SilentWs, WsClient, wait_for

pytestmark = pytest.mark.system

RSS_GROWTH_LIMIT_MB = 200
LATENCY_FACTOR = 5
LATENCY_SLACK_MS = 100
SLOW_READER = "ANZ-70001"


def _p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[max(0, int(len(ordered) * 0.95) - 1)]


def _probe(url: str, user: str, count: int, interval: float) -> list[float]:
    """Round trips (ms) of RELIABLE messages a client sends to itself."""
    samples = []
    with WsClient(url) as client:
        client.auth(user)
        for i in range(count):
            started = time.monotonic()
            client.message(user, f"probe-{i}")
            client.recv_until(lambda f, i=i: f["type"] == "MESSAGE" and f["data"]["content"] == f"probe-{i}",
                              timeout=30)
            samples.append((time.monotonic() - started) * 1000)
            time.sleep(interval)
    return samples


@pytest.fixture
def big_mailbox(django_db_blocker, demo_network):
    """1,000 messages of 60 KB waiting for the slow reader (60 MB of content), committed: the web
    node must see them (so the test itself runs outside a test transaction)."""
    with django_db_blocker.unblock():
        app = demo_network["anz"].pk
        for start in range(0, 1000, 100):
            messages_store(messages=[OutgoingMessage(app_id=app, sender="ANZ-70002", recipients=(SLOW_READER,),
                                                     content=f"{i:06d}" + "x" * 60_000)
                                     for i in range(start, start + 100)])
    yield 1000


def _ack_flood(url: str, seconds: float, outcome: dict) -> None:
    ids = [str(i) for i in range(1, 2001)]
    sent = 0
    try:
        with WsClient(url) as client:
            client.auth("ANZ-70003", acks=True)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                client.send("ACK", {"ids": ids})
                sent += 1
            outcome["closed"] = client.wait_closed(timeout=10)
    except (ConnectionClosed, TimeoutError, OSError) as exc:
        outcome["closed"] = getattr(exc, "rcvd", None) and exc.rcvd.code or "dropped"
    outcome["sent"] = sent


def _group_flood(url: str, seconds: float, outcome: dict) -> None:
    refused = 0
    try:
        with WsClient(url) as client:
            client.auth("ANZ-70004")
            deadline = time.monotonic() + seconds
            n = 0
            while time.monotonic() < deadline:
                client.send("GROUP_MESSAGE", {"to": [f"ANZ-{71000 + (n + k) % 50}" for k in range(5)],
                                              "content": "flood"})
                n += 1
                time.sleep(0.001)
            refused = sum(f["type"] == "INVALID_MESSAGE" for f in client.recv_all(quiet=1))
            outcome["closed"] = None
    except (ConnectionClosed, TimeoutError, OSError):
        outcome["closed"] = "closed"
    outcome["refused"] = refused


def test_hostile_clients_leave_the_node_bounded_and_other_clients_fast(processes, big_mailbox, django_db_blocker):
    web = processes.web("web")
    processes.worker("worker")
    node = psutil.Process(web.popen.pid)
    _probe(web.ws_url, "ANZ-70010", 10, 0.02)  # warm up
    baseline = _p95(_probe(web.ws_url, "ANZ-70010", 40, 0.05))
    rss_before = node.memory_info().rss

    # The slow reader: ACK mode, 15 fetches of 2,000, never reads a byte.
    silent = SilentWs("127.0.0.1", web.port)
    silent.send("AUTH_CLIENT", {"appId": "app-id-343", "userId": SLOW_READER, "token": "t", "acks": True})
    time.sleep(0.5)
    for _ in range(15):
        silent.send("FETCH_MISSING_MESSAGES_REQUEST", {"count": 2000})

    peak = [rss_before]
    stop = threading.Event()

    def watch_rss() -> None:
        while not stop.is_set():
            peak.append(node.memory_info().rss)
            time.sleep(0.2)

    ack_outcome: dict = {}
    group_outcome: dict = {}
    threads = [threading.Thread(target=watch_rss),
               threading.Thread(target=_ack_flood, args=(web.ws_url, 8, ack_outcome)),
               threading.Thread(target=_group_flood, args=(web.ws_url, 8, group_outcome))]
    for t in threads:
        t.start()
    under_attack = _probe(web.ws_url, "ANZ-70011", 40, 0.15)
    for t in threads[1:]:
        t.join(60)
    assert silent.closed_by_server(timeout=30)  # cut off as a slow reader
    stop.set()
    threads[0].join()
    silent.close()

    growth_mb = (max(peak) - rss_before) / 2**20
    print(f"\nRSS before {rss_before / 2**20:.0f} MB, peak growth {growth_mb:.0f} MB; probe p95 "
          f"{baseline:.0f} ms before, {_p95(under_attack):.0f} ms under attack; ack flood {ack_outcome}, "
          f"group flood {group_outcome}")
    assert growth_mb < RSS_GROWTH_LIMIT_MB
    assert _p95(under_attack) <= LATENCY_FACTOR * baseline + LATENCY_SLACK_MS
    assert ack_outcome["closed"] in (1008, 4003, "dropped")  # the ACK flood was cut off
    assert group_outcome["closed"] == "closed" or group_outcome["refused"] > 0
    # The slow reader's messages are all still there for it: nothing was lost or burned.
    with django_db_blocker.unblock():
        wait_for(lambda: not Delivery.objects.filter(recipient=SLOW_READER, state="sent").exists(), timeout=30)
        rows = Delivery.objects.filter(recipient=SLOW_READER)
        states = dict(rows.values_list("state").annotate(n=Count("id")))
        assert states.get("delivered", 0) == 0 and states.get("dead", 0) == 0
        assert sum(states.values()) == big_mailbox
        assert set(rows.values_list("attempts", flat=True)) == {0}
