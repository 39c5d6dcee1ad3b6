"""pusher-js against three web nodes (`make run WEB_NODES=3`'s HAProxy configuration): a presence
channel whose members sit on different nodes, exact after one node is killed; a draining node's
clients closed with 4200 and back through the balancer on another node, subscribed again."""

from __future__ import annotations

import signal

import pytest
import redis
from django.conf import settings

from tests.cluster import Cluster
from tests.processes import FAST_FAILURE_ENV, start_beat
from tests.pusher import PusherJs
from tests.wsclient import wait_for

pytestmark = [pytest.mark.system, pytest.mark.django_db]
HOST = "127.0.0.1"


@pytest.fixture(scope="module")
def cluster(module_processes, tmp_path_factory):
    cluster = Cluster(module_processes, tmp_path_factory.mktemp("pusher-lb"), **FAST_FAILURE_ENV)
    start_beat(module_processes, tmp_path_factory.mktemp("pusher-beat"))
    return cluster


def _nodes_holding(demo_network, channel: str) -> set[str]:
    """The web nodes with a member of the presence channel (their fields in its Redis hash)."""
    key = f"sb:pp:{demo_network['anz'].pk}:pusher.{channel}"
    return {k.decode() for k in redis.Redis.from_url(settings.REDIS_URL).hkeys(key)}


def test_presence_members_on_three_nodes_are_told_once_and_exact_after_a_node_is_killed(cluster, demo_network):
    ch = "presence-cluster.1"
    ports = {name: proc.port for name, proc in cluster.nodes.items()}
    with PusherJs(HOST, ports["web-1"], user={"user_id": "1"}) as ann, \
            PusherJs(HOST, ports["web-2"], user={"user_id": "2"}) as bob, \
            PusherJs(HOST, ports["web-1"], user={"user_id": "2"}) as bob_again, \
            PusherJs(HOST, ports["web-3"], user={"user_id": "3"}) as cat:
        for client in (ann, bob, bob_again, cat):
            client.connected()
        assert ann.subscribe(ch)["members"] == ["1"]
        bob.subscribe(ch)
        bob_again.subscribe(ch)  # bob's second connection, on another node: no new member
        assert cat.subscribe(ch)["members"] == ["1", "2", "3"]
        assert sorted(ann.next("member_added")["id"] for _ in range(2)) == ["2", "3"]
        assert _nodes_holding(demo_network, ch) == {"web-1", "web-2", "web-3"}

        cluster.nodes["web-3"].kill()  # SIGKILL: no drain, no goodbye
        # The reaper drops web-3's members; the nodes left tell their subscribers, once.
        assert ann.next("member_removed", timeout=30)["id"] == "3"
        assert bob.next("member_removed", timeout=15)["id"] == "3"
        users = ann.api("get", {"path": f"/channels/{ch}/users"})
        assert users["body"] == {"users": [{"id": "1"}, {"id": "2"}]}

        bob_again.command(op="disconnect")  # bob is still on web-2: nobody is told he left
        bob.command(op="disconnect")  # ... and now he has gone
        assert ann.next("member_removed", timeout=15)["id"] == "2"
        assert [e for e in ann.quiet(2.0) if e.get("event") in ("member_removed", "member_added")] == []
    cluster.restart("web-3")


def test_a_draining_node_closes_pusher_clients_with_4200_and_they_come_back_elsewhere(cluster, demo_network):
    ch = "presence-drain.1"
    with PusherJs(HOST, cluster.port, user={"user_id": "7"}) as client, \
            PusherJs(HOST, cluster.port, user={"user_id": "8"}) as publisher:
        first = client.connected()
        publisher.connected()
        client.subscribe(ch)
        (node,) = _nodes_holding(demo_network, ch)
        cluster.nodes[node].popen.send_signal(signal.SIGTERM)
        error = client.next("connection_error", timeout=30)
        assert error["data"]["code"] == 4200
        again = client.connected(timeout=30)
        assert again != first
        assert client.next("subscribed", timeout=15)["channel"] == ch  # pusher-js subscribes again by itself
        wait_for(lambda: _nodes_holding(demo_network, ch) and node not in _nodes_holding(demo_network, ch))
        publisher.api("trigger", ch, "after-drain", "still here")
        assert client.next("event", channel=ch, timeout=15)["data"] == "still here"
    cluster.restart(node)
