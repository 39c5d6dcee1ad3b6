"""Three web nodes behind a real HAProxy, configured by devstack.balancer as `make run WEB_NODES=3`
does: clients connect to HAProxy's port only, are spread over the nodes, keep their own address,
and a node that dies is taken out while the others take the new connections."""

from __future__ import annotations

import signal
import socket

import pytest

from tests.cluster import NODES, Cluster, live_nodes
from tests.wsclient import WsClient, wait_for

pytestmark = [pytest.mark.system, pytest.mark.django_db]

@pytest.fixture(scope="module")
def cluster(module_processes, tmp_path_factory):
    return Cluster(module_processes, tmp_path_factory.mktemp("lb"))


def from_address(address: str, port: int) -> socket.socket:
    """A TCP connection to HAProxy made from `address` (any 127.x address is this machine)."""
    sock = socket.socket()
    sock.bind((address, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def test_clients_through_haproxy_authenticate_exchange_messages_and_are_spread_over_all_three_nodes(cluster):
    users = [f"ANZ-1710{i}" for i in range(6)]
    clients = [WsClient(cluster.ws_url) for _ in users]
    try:
        for client, user in zip(clients, users, strict=True):
            assert client.auth(user)["data"]["isAuthenticated"] is True
        wait_for(lambda: len(live_nodes(users)) == len(users))
        assert sorted(live_nodes(users).values()) == sorted(NODES * 2)  # least connections: two each

        # a message from each client to the next: across nodes, through the routing worker
        for i, client in enumerate(clients):
            client.message(users[(i + 1) % len(users)], f"hello from {users[i]}", reference=f"r{i}")
        for i, client in enumerate(clients):
            got = client.recv_type("MESSAGE")
            assert got["data"]["from"] == users[i - 1] and got["data"]["content"] == f"hello from {users[i - 1]}"
    finally:
        for client in clients:
            client.close()


def test_the_nodes_see_the_clients_own_address_not_haproxys(cluster):
    from presence.models import Session

    # The client writes a false X-Forwarded-For; HAProxy appends the address it really came from.
    sock = from_address("127.0.0.2", cluster.port)
    with WsClient(cluster.ws_url, sock=sock, additional_headers={"X-Forwarded-For": "198.51.100.7"}) as client:
        client.auth("ANZ-17110")
        wait_for(lambda: Session.objects.filter(user_id="ANZ-17110").exists())
    assert Session.objects.get(user_id="ANZ-17110").remote_addr == "127.0.0.2"


def test_a_killed_node_is_taken_out_and_new_connections_go_to_the_others(cluster):
    cluster.nodes["web-3"].kill(signal.SIGKILL)
    # At once, before any health check noticed: a connection HAProxy sends to the dead node is
    # refused and tried again on another.
    users = [f"ANZ-1712{i}" for i in range(6)]
    clients = [WsClient(cluster.ws_url) for _ in users]
    try:
        for client, user in zip(clients, users, strict=True):
            assert client.auth(user)["data"]["isAuthenticated"] is True
        wait_for(lambda: len(live_nodes(users)) == len(users))
        assert set(live_nodes(users).values()) == {"web-1", "web-2"}
        wait_for(lambda: cluster.states().get("web-3") == "DOWN", timeout=5)
        assert cluster.states() == {"web-1": "UP", "web-2": "UP", "web-3": "DOWN"}
    finally:
        for client in clients:
            client.close()

