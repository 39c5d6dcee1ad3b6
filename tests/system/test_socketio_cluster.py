"""Socket.IO through HAProxy in front of three web nodes (`make run WEB_NODES=3`'s configuration):
a polling session keeps to its node, and a node's death moves its clients to another, recovered,
with nothing sent meanwhile lost."""

from __future__ import annotations

import signal
import time

import pytest

from presence.models import Session
from tests.cluster import Cluster, live_nodes
from tests.sioclients import NodeClient
from tests.wsclient import WsClient, wait_for

pytestmark = [pytest.mark.system, pytest.mark.django_db]


@pytest.fixture(scope="module")
def cluster(module_processes, tmp_path_factory):
    return Cluster(module_processes, tmp_path_factory.mktemp("sio-lb"), SOCKETIO_PING_INTERVAL="1",
                   SOCKETIO_PING_TIMEOUT="2")


def _url(cluster: Cluster) -> str:
    return f"http://127.0.0.1:{cluster.port}"


def test_a_polling_session_keeps_to_its_node_through_the_balancer(cluster):
    with NodeClient() as alice, NodeClient() as bob:
        assert alice.connect(_url(cluster), "ANZ-43001", opts={"transports": ["polling"]})["event"] == "connect"
        assert bob.connect(_url(cluster), "ANZ-43002", opts={"transports": ["polling"]})["event"] == "connect"
        deadline = time.monotonic() + 4  # a few heartbeats' worth of polls and posts, at least
        sent = 0
        while time.monotonic() < deadline:
            assert alice.call("message", {"to": "ANZ-43002", "content": f"p-{sent}"})["id"].isdigit()
            sent += 1
            time.sleep(0.2)
        got = {bob.wait_event("message")["args"][0]["content"] for _ in range(sent)}
        assert got == {f"p-{i}" for i in range(sent)}
        assert not [e for e in alice.seen + bob.seen if e.get("event") in ("disconnect", "connect_error")]


@pytest.mark.parametrize("transports", [["polling"], ["websocket"]], ids=["polling", "websocket"])
def test_a_draining_node_closes_its_socketio_clients_transport_and_they_recover_on_another(cluster, transports):
    user = "ANZ-4302" + str(len(transports[0]))
    with NodeClient() as bob:
        first = bob.connect(_url(cluster), user, opts={"transports": transports})
        wait_for(lambda: user in live_nodes([user]))
        draining = live_nodes([user])[user]
        cluster.nodes[draining].popen.send_signal(signal.SIGTERM)
        gone = bob.wait_event("disconnect", timeout=30)
        # Not "io server disconnect", after which the client would stay away. A poll that reaches the node
        # after it stopped listening (or another node, which does not know the session) is a "transport
        # error" rather than a "transport close": either way the client comes back.
        assert gone["reason"] in ("transport close", "transport error")
        again = bob.wait_event("connect", timeout=30)
        assert again["recovered"] is True and again["id"] != first["id"]
        assert Session.objects.filter(user_id=user, disconnected_at__isnull=True).exclude(node_id=draining).exists()
        with WsClient(cluster.ws_url) as alice:
            alice.auth("ANZ-43029")
            alice.message(user, "after the drain")
            assert bob.wait_event("message", timeout=20)["args"][0]["content"] == "after the drain"
    cluster.restart(draining)


def test_a_killed_node_moves_its_socketio_clients_to_another_recovered_with_nothing_lost(cluster):
    with NodeClient() as bob:
        first = bob.connect(_url(cluster), "ANZ-43011")
        wait_for(lambda: "ANZ-43011" in live_nodes(["ANZ-43011"]))
        doomed = live_nodes(["ANZ-43011"])["ANZ-43011"]
        cluster.nodes[doomed].kill()
        wait_for(lambda: cluster.states().get(doomed) == "DOWN", timeout=15)
        with WsClient(cluster.ws_url) as alice:
            alice.auth("ANZ-43012")
            for i in range(3):
                alice.message("ANZ-43011", f"after-the-kill-{i}")
            again = bob.wait_event("connect", timeout=30)
            assert again["recovered"] is True and again["id"] != first["id"]
            got = sorted(bob.wait_event("message", timeout=20)["args"][0]["content"] for _ in range(3))
            assert got == [f"after-the-kill-{i}" for i in range(3)]
        assert Session.objects.filter(user_id="ANZ-43011", disconnected_at__isnull=True).exclude(
            node_id=doomed).exists()  # its session now on a live node
