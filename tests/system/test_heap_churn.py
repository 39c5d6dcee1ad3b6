"""A web node's closed connections are freed by reference counting, not left for the garbage
collector (issue 47): a collector's full pass runs on the event loop's thread, and every closed
connection it had to free (about 170 objects in cycles each, before) lengthened the pause every
client of the node waited through. Real daphne, real clients, real Redis and Postgres; the node
keeps whatever its collector finds (tests/fixtures/web_garbage_kept.py) and writes it down on
SIGUSR1."""

from __future__ import annotations

import json
import signal
import sys
import time

import pytest

from tests.processes import ROOT, free_port, wait_http
from tests.wsclient import WsClient, wait_for

pytestmark = pytest.mark.system

CLIENTS = 30
# What one connection is made of, on each side of the ASGI line: none of it may be left in a cycle.
CONNECTION_TYPES = (
    "messaging.gateway.consumers.ClientConsumer",
    "messaging.gateway.connection.life.ConnectionLife",
    "messaging.gateway.connection.ledger.DeliveryLedger",
    "messaging.channels.cursor.ChannelCursor",
    "daphne.ws_protocol.WebSocketProtocol",
    "daphne.http_protocol.WebRequest",
    "twisted.web.http.HTTPChannel",
    "twisted.internet.tcp.Server",
    "foundation.daphne_adapter.OutgoingBuffer",
    "foundation.daphne_adapter.IncomingQueue",
)


def _garbage(web, path) -> dict[str, int]:
    path.unlink(missing_ok=True)
    web.popen.send_signal(signal.SIGUSR1)
    wait_for(path.exists, timeout=15)
    return json.loads(path.read_text())


def test_a_node_whose_clients_came_sent_and_left_has_nothing_of_their_connections_left_for_the_collector(
        processes, tmp_path):
    garbage_file = tmp_path / "garbage.json"
    port = free_port()
    web = processes.spawn("web", [sys.executable, str(ROOT / "tests" / "fixtures" / "web_garbage_kept.py"),
                                  "--port", str(port)], port=port, PORT=str(port), NODE_ID=f"heap-{port}",
                          GARBAGE_FILE=str(garbage_file))
    wait_http(f"{web.url}/readyz", web)
    processes.worker("worker")

    for round_ in range(2):  # two rounds: the second on a node whose runtime has long started
        clients = [WsClient(web.ws_url) for _ in range(CLIENTS)]
        for n, client in enumerate(clients):
            assert client.auth(f"ANZ-{70000 + n}")["data"]["isAuthenticated"] is True
        for n, client in enumerate(clients):
            client.message(f"ANZ-{70000 + n}", f"to myself, round {round_}", feature="FAST")
        for client in clients:
            assert client.recv_type("MESSAGE")["data"]["content"] == f"to myself, round {round_}"
            client.close()
        time.sleep(1.5)  # the node's ends of the connections run (presence, session rows)

    kept = _garbage(web, garbage_file)

    left = {name: kept.get(name, 0) for name in CONNECTION_TYPES}
    assert left == dict.fromkeys(CONNECTION_TYPES, 0), left
    assert web.alive()
